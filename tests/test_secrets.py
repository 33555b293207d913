"""A job's `env:` values never reach a host's command line nor its files (issue 26, item 1).

A command line is readable by every user of a host (`ps`, /proc/PID/cmdline), so these tests sample
every process's command line on this machine (the sshd "host" runs here, in a PID namespace the test's
/proc still sees) while `train`, `doctor`, a cargo job's setup and `exec --env` run, and fail if the
secret's value shows up in any of them; then they grep the host's `.thrust` tree for it.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir

from thrust_remote.core.config import JobConfig
from thrust_remote.host.report import Check, Report
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import cargo

# one worker runs this module's tests, in order: its sampler reads every process's command line, and
# the module's own secrets must not be on one beside it
pytestmark = pytest.mark.xdist_group("test_secrets")

SECRET = "s3cr3t-Token-7f1e9c"  # unlikely to appear by chance anywhere on this machine

SECRET_SHA = hashlib.sha256(SECRET.encode()).hexdigest()

# proves the value arrived without writing it anywhere (the log is the job's own, kept on the host)
JOB_PY = f'''\
import hashlib, os, time

token = os.environ.get("API_TOKEN", "").encode()
print("token ok" if hashlib.sha256(token).hexdigest() == "{SECRET_SHA}" else "token missing", flush=True)
time.sleep(1.0)  # long enough for the sampler to see the job's own command line
'''


class CmdlineSampler:
    """Every distinct command line seen on this machine while it runs (/proc/*/cmdline, as ps reads it)."""

    def __init__(self) -> None:
        self.seen: set[bytes] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        self.seen.add(fh.read())
                except OSError:
                    continue  # ended between the listing and the read

    def with_secret(self) -> list[str]:
        return [c.replace(b"\0", b" ").decode("utf-8", "replace") for c in self.seen if SECRET.encode() in c]

    def saw(self, word: str) -> bool:
        return any(word.encode() in c for c in self.seen)


@contextmanager
def sampling() -> Iterator[CmdlineSampler]:
    sampler = CmdlineSampler()
    sampler._thread.start()
    try:
        yield sampler
    finally:
        sampler._stop.set()
        sampler._thread.join()


def files_holding(root: Path, needle: str) -> list[str]:
    out = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and needle.encode() in path.read_bytes():
            out.append(str(path.relative_to(root)))
    return out


@pytest.fixture
def project(sshd, tmp_path) -> tuple[Path, Path]:
    workdir = remote_tempdir(sshd) / "secrets"
    jobs = (
        "jobs:\n  tok:\n    script: job.py\n"
        f"    env: {{API_TOKEN: {SECRET}, OTHER: plain}}\n"
    )
    return new_project(tmp_path / "project", sshd, workdir, files={"job.py": JOB_PY}, jobs=jobs), workdir


@pytest.mark.slow
def test_train_and_doctor_keep_env_values_off_command_lines_and_out_of_host_files(cli, project):
    proj, workdir = project
    with sampling() as doctor_ps:
        doctor = cli("doctor", "--job", "tok", "--json", cwd=proj)
    assert doctor.returncode in (0, 1), doctor.stderr
    assert doctor_ps.saw("envcheck"), "the sampler never saw envcheck run: it proves nothing"
    assert doctor_ps.with_secret() == []
    facts_job = json.loads(doctor.stdout)["facts"]["job"]
    assert facts_job["env_names"] == ["API_TOKEN", "OTHER"] and "env" not in facts_job

    with sampling() as train_ps:
        train = cli("train", "tok", cwd=proj)
    assert train.returncode == 0, train.stderr
    assert "token ok" in train.stderr + train.stdout  # the value reached the job
    # the job ran, and so did the agent server every step went through (the preflight, the launch: their
    # stdin, where the values travel, is the server's channel, never a command line)
    assert train_ps.saw("job.py") and train_ps.saw(".pyz\0serve")
    assert train_ps.with_secret() == []
    # the preflight cache, run.json, the venv's files: names at most, never the value
    cached = list((workdir / ".thrust").glob("preflight-*.json"))
    assert cached, "no cached preflight report: the cache path was not exercised"
    assert json.loads(cached[0].read_text())["facts"]["job"]["env_names"] == ["API_TOKEN", "OTHER"]
    # what thrust-remote wrote holds no value; the run's tree is the user's code, where they committed it
    # (thrust.yaml here), in a directory only this account may enter
    assert [f for f in files_holding(workdir / ".thrust", SECRET) if not f.startswith("trees/")] == []
    assert (workdir / ".thrust" / "trees").stat().st_mode & 0o077 == 0

    with sampling() as again_ps:  # a cache hit, each step a command of its own (no agent link): the
        again = cli("train", "tok", "--detach", cwd=proj, env={"THRUST_AGENT_LINK": "0"})  # preflight's own line
    assert again.returncode == 0, again.stderr
    assert again_ps.saw("preflight") and again_ps.with_secret() == []


def test_exec_env_reaches_the_command_not_its_command_line(cli, sshd, tmp_path):
    cfg = sshd.thrust_yaml(tmp_path / "thrust.yaml")
    with sampling() as ps:
        result = cli("--config", str(cfg), "exec", "--host", "sandbox", "--env", f"API_TOKEN={SECRET}", "--",
                     "sh", "-c", 'sleep 0.5; printf %s "$API_TOKEN" | sha256sum')
    assert result.returncode == 0, result.stderr
    assert SECRET_SHA in result.stdout
    assert ps.saw("sleep 0.5; printf")
    # the laptop's own command line is the user's (they typed the value there); the host's hold none
    assert [c for c in ps.with_secret() if "thrust-remote" not in c] == []


def test_runner_env_values_travel_on_stdin_with_the_commands_own_stdin_after(sshd, tmp_path):
    runner = sshd.runner()
    value = SECRET + "\nsecond line 'quoted' $HOME"
    try:
        with sampling() as ps:
            result = runner.run(["sh", "-c", 'sleep 0.5; printf "%s|" "$API_TOKEN"; cat'],
                                env={"API_TOKEN": value}, stdin=b"the command's own input\n")
        assert result.ok, result.stderr
        assert result.stdout == value + "|the command's own input\n"
        assert ps.saw("sleep 0.5")
        assert ps.with_secret() == []
        missing = runner.run(["no-such-command-xyz"], env={"API_TOKEN": SECRET})
        assert missing.exit_code == 127 and "no-such-command-xyz" in missing.stderr
    finally:
        runner.close()


def test_cargo_build_and_clean_get_the_env_without_a_command_line(sshd, tmp_path):
    """A cargo job's setup (clean, then build) over SSH. This machine cannot compile a tch-rs crate in a
    test's time, so `cargo` is a shim: a script that records its environment and sleeps briefly; the
    plan, the runner and the env are the real ones."""
    host_side = remote_tempdir(sshd)
    shim = host_side / "bin" / "cargo"
    shim.parent.mkdir()
    shim.write_text('#!/bin/sh\nenv > "$(dirname "$0")/../seen-$1.env"\nsleep 0.5\n'
                    'mkdir -p target/release/examples && touch target/release/examples/probe\n')
    shim.chmod(0o755)
    crate = host_side / "crate"
    crate.mkdir()
    job = JobConfig(name="rs", kind="cargo", example="probe", env={"API_TOKEN": SECRET})
    facts = {"rust": {"cargo": str(shim), "rustup": None}, "workdir": {"path": str(host_side)},
             "crate": {"dir": str(crate), "target_dir": str(crate / "target")}, "env": {}, "torch_probe": {}}
    plan = cargo.plan(facts, job)
    assert plan.env["API_TOKEN"] == SECRET
    stale = Report("sandbox", facts, [Check("stale-build", "stale", "fail", "the env changed")])
    session = HostSession(sshd.runner(), sshd.host_config(), HostPaths(str(host_side)))

    class Steps:
        def step(self, message: str) -> None:
            pass

    with session, sampling() as ps:
        skipped = cargo.setup_cargo(session, plan, stale, None, Steps())
    assert skipped is False
    for what in ("clean", "build"):
        seen = (host_side / f"seen-{what}.env").read_text()
        assert f"API_TOKEN={SECRET}\n" in seen  # the value reached cargo
    assert ps.saw(str(shim))
    assert ps.with_secret() == []
    assert files_holding(crate / "target", SECRET) == []
