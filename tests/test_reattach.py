"""Reattaching to a run over a real sshd (`logs RUN --follow`): the same progress view as `train`, and
at the end what `train` would have done: the model fetched (or, with --no-fetch, the exact `fetch`
command), the job's exit code. Also `train --json` without --detach: one JSON object on stdout.

Before: a reattach showed raw `THRUST_METRICS {json}` lines, ended 0 and neither fetched nor said to;
`train --json` was ignored without --detach.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import EXE, FAKE_FAST, FAKE_LONG, FAKE_SLOW, git, sandbox_clone

from thrust_remote.core.errors import ExitCode

PROGRESS = re.compile(r"^fake-\S+: +\d+%  [\d,]+/[\d,]+ steps", re.M)

pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path, sshd, remote_dir) -> Path:
    """A clone of this repo with a committed thrust.yaml for the sshd host (as in test_train_remote)."""
    return sandbox_clone(tmp_path / "project", sshd, remote_dir / "thrust")


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    return env


def _start(project: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([EXE, *args], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=_env())


def _read_until(stream, needle: bytes, timeout: float = 180) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
    return buf


def _run_hint(hint: str, project: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a printed command exactly as a user would paste it (thrust-remote = the venv's script)."""
    argv = shlex.split(hint)
    assert argv[0] == "thrust-remote", hint
    return subprocess.run([EXE, *argv[1:]], cwd=project, capture_output=True, text=True, env=_env(),
                          timeout=timeout)


def _public(project: Path) -> Path:
    return project / "web" / "public"


def _model_is_the_runs(project: Path, remote_dir: Path, run_id: str) -> None:
    placed = (_public(project) / "fake.onnx").read_bytes()
    on_host = (remote_dir / "thrust" / ".thrust" / "runs" / run_id / "model.onnx").read_bytes()
    assert hashlib.sha256(placed).digest() == hashlib.sha256(on_host).digest()


def _assert_readable(text: str) -> None:
    assert "THRUST_" not in text and '{"' not in text, text
    assert PROGRESS.search(text), text


def test_ctrl_c_hint_reattaches_with_the_progress_view_and_fetches(project, remote_dir):
    """`train` detached with Ctrl-C prints one command (with the --config the user gave); that exact
    command shows the same progress lines as train, fetches the model when the run finishes, exits 0."""
    config = str(project / "thrust.yaml")
    proc = _start(project, "--config", config, "train", "fake", *FAKE_SLOW)
    seen = _read_until(proc.stdout, b" steps")  # the first progress line: following has begun
    assert PROGRESS.search(seen.decode()), seen
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    err_text = err.decode()
    assert proc.returncode == ExitCode.CONNECTION_LOST, err_text
    match = re.search(r"reattach with: (thrust-remote [^\n]*?--offset \d+(?: --host \S+)?)", err_text)
    assert match, err_text
    hint = match.group(1)
    run_id = re.search(r"following (fake-\S+)", err_text).group(1)
    words = shlex.split(hint)
    assert words[:6] == ["thrust-remote", "--config", config, "logs", run_id, "--follow"], hint
    assert words[words.index("--host") + 1] == "sandbox", hint
    assert f"thrust-remote --config {config} stop {run_id} --host sandbox" in err_text
    assert not (_public(project) / "fake.onnx").exists()

    again = _run_hint(hint, project)
    assert again.returncode == 0, again.stderr
    _assert_readable(again.stdout)
    assert re.search(r": 100%  ([\d,]+)/\1 steps", again.stdout), again.stdout
    assert "fetching the model" in again.stderr and "model: " in again.stderr
    _model_is_the_runs(project, remote_dir, run_id)


def test_lost_link_then_reattach_no_fetch_prints_the_exact_fetch_command(project, remote_dir, sshd):
    proc = _start(project, "train", "fake", *FAKE_SLOW)
    _read_until(proc.stdout, b" steps")
    sshd.kill_sessions()
    _out, err = proc.communicate(timeout=90)
    err_text = err.decode()
    assert proc.returncode == ExitCode.CONNECTION_LOST, err_text
    hint = re.search(r"reattach with: (thrust-remote .*)", err_text).group(1)
    run_id = shlex.split(hint)[2]

    again = _run_hint(f"{hint} --no-fetch", project)
    assert again.returncode == 0, again.stderr
    _assert_readable(again.stdout)
    assert not (_public(project) / "fake.onnx").exists()
    fetch = re.search(r"fetch the model with: (thrust-remote .*)", again.stderr)
    assert fetch, again.stderr
    assert shlex.split(fetch.group(1)) == ["thrust-remote", "fetch", run_id, "--host", "sandbox"]
    fetched = _run_hint(fetch.group(1), project)
    assert fetched.returncode == 0, fetched.stderr
    _model_is_the_runs(project, remote_dir, run_id)


def test_reattached_run_that_is_killed_exits_with_its_code_and_fetches_nothing(cli, project, remote_dir):
    started = cli("train", "fake", *FAKE_LONG, "--detach", "--json", cwd=project)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    follower = _start(project, "logs", info["run_id"], "-f")
    _read_until(follower.stdout, b" steps")
    killed = cli("exec", "--", "kill", "-9", str(info["pid"]), cwd=project)
    assert killed.returncode == 0, killed.stderr
    out, err = follower.communicate(timeout=120)
    assert follower.returncode == 128 + 9, err.decode()
    assert "THRUST_" not in out.decode()
    assert "ended FAILED (exit code 137)" in err.decode()
    assert "fetch" not in err.decode()
    assert not (_public(project) / "fake.onnx").exists()


def test_train_json_attached_prints_one_object_and_nothing_else(cli, project, remote_dir):
    res = cli("train", "fake", *FAKE_FAST, "--json", cwd=project)
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)  # the whole of stdout is the one object
    assert "THRUST_" not in res.stderr
    assert result["state"] == "FINISHED" and result["exit_code"] == 0 and result["job_exit_code"] == 0
    assert result["host"] == "sandbox" and result["job"] == "fake"
    assert result["run_dir"].endswith(f"/.thrust/runs/{result['run_id']}")
    assert result["commit"] == git(project, "rev-parse", "HEAD")
    assert Path(result["model"]) == _public(project) / "fake.onnx"
    assert result["sha256"] == hashlib.sha256(Path(result["model"]).read_bytes()).hexdigest()
    assert result["steps"] == result["total_steps"] and result["steps"] >= 6000
    assert isinstance(result["score"], float) and result["score"] == result["return_mean"]
    assert result["metrics"]["step"] == result["steps"] and "sps" in result["metrics"]  # the last, whole
    assert result["wall_s"] > 0 and "fetch" in result["timings"]

    # a run that fails: still the one object, and the job's exit code as the command's
    bad = cli("train", "fake", "--set", "total-steps=60000", "--set", "crash-at-step=512", "--json", cwd=project)
    assert bad.returncode == 1, bad.stderr
    failed = json.loads(bad.stdout)
    assert failed["state"] == "FAILED" and failed["exit_code"] == 1 and failed["model"] is None
    assert failed["steps"] is not None and failed["steps"] < 60000
