"""`thrust-remote train` end to end over a real sshd: sync, setup cache, detached runs, faults, fetch.

The "laptop" is a throwaway clone of this repository; the "host" is a separate directory reached only
through SSH (the tests look into it directly only to check what happened there).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from helpers import EXE, FAKE_FAST, FAKE_LONG, FAKE_SLOW, FAST, git, run_tree, sandbox_clone

from thrust_remote.core.errors import ExitCode

pytestmark = pytest.mark.slow


@pytest.fixture
def project(tmp_path, sshd, remote_dir) -> Path:
    """A clone of this repo at its HEAD, with a committed thrust.yaml for the sshd host; no origin: the
    bundle path."""
    return sandbox_clone(tmp_path / "project", sshd, remote_dir / "thrust")


def _run_json(remote_dir: Path, run_id: str) -> dict:
    return json.loads((remote_dir / "thrust" / ".thrust" / "runs" / run_id / "run.json").read_text())


def _run_id_from(text: str) -> str:
    match = re.search(r"(?:launching run|following) ((?:cartpole|snake|fake)[\w.-]+)", text)
    assert match, text
    return match.group(1)


def _wait_state(cli, project: Path, run_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        res = cli("status", run_id, "--json", cwd=project)
        assert res.returncode == 0, res.stderr
        st = json.loads(res.stdout)
        if st["state"] in states or time.monotonic() > deadline:
            return st
        time.sleep(0.3)


def _check_model(project: Path, job: str) -> dict:
    import numpy as np
    import onnxruntime as ort

    model = project / "web" / "public" / f"{job}.onnx"
    manifest = json.loads((project / "web" / "public" / f"{job}.json").read_text())
    assert hashlib.sha256(model.read_bytes()).hexdigest() == manifest["sha256"]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    out = session.run(None, {"obs": np.zeros((3, manifest["obs_dim"]), np.float32)})[0]
    assert out.shape == (3, manifest["n_actions"])
    return manifest


@pytest.mark.e2e  # the built-in trainer over ssh, for real
def test_train_cartpole_over_ssh_bundle_then_cached_setup(cli, project, remote_dir):
    first = cli("train", "cartpole", *FAST, cwd=project)
    assert first.returncode == 0, first.stderr
    _check_model(project, "cartpole")
    assert (project / "web" / "public" / "cartpole.metrics.jsonl").stat().st_size > 0
    first_id = _run_id_from(first.stderr)
    assert git(run_tree(remote_dir / "thrust", first_id), "rev-parse", "HEAD") == git(project, "rev-parse", "HEAD")
    run = _run_json(remote_dir, first_id)
    assert run["sync"] == "bundle" and run["tree"] == str(run_tree(remote_dir / "thrust", first_id))
    assert run["dirty"] is False
    assert "setting up the host's python" in first.stderr

    # a new commit: only the missing commit travels; setup is cached
    (project / "NOTES.txt").write_text("a change\n")
    git(project, "add", "NOTES.txt")
    git(project, "commit", "-q", "-m", "notes")
    second = cli("train", "cartpole", *FAST, cwd=project)
    assert second.returncode == 0, second.stderr
    assert "setting up the host's python" not in second.stderr
    tree = run_tree(remote_dir / "thrust", _run_id_from(second.stderr))
    assert git(tree, "rev-parse", "HEAD") == git(project, "rev-parse", "HEAD")
    assert (tree / "NOTES.txt").read_text() == "a change\n"
    assert not (run_tree(remote_dir / "thrust", first_id) / "NOTES.txt").exists()  # the first run's tree as it was
    assert _run_json(remote_dir, _run_id_from(second.stderr))["sync"] == "bundle"


@pytest.mark.e2e  # the built-in trainer over ssh, for real
def test_train_snake_fetch_path_with_dirty_tree(cli, project, remote_dir, tmp_path):
    bare = tmp_path / "origin.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(project), str(bare)], check=True)
    git(project, "remote", "add", "origin", str(bare))
    # a tracked file changed and an untracked file: the patch travels, the untracked is only listed
    readme = project / "docs" / "snake.md"
    readme.write_text(readme.read_text() + "\nlocal edit\n")
    (project / "scratch.txt").write_text("not sent\n")
    result = cli("train", "snake", "--set", "total-steps=4096", "--set", "num-envs=64", "--set", "log-interval=0.2",
                 cwd=project)
    assert result.returncode == 0, result.stderr
    manifest = _check_model(project, "snake")
    assert manifest["env"] == "snake"
    run = _run_json(remote_dir, _run_id_from(result.stderr))
    assert run["sync"] in ("clone", "fetch")
    assert run["commit"] == git(project, "rev-parse", "HEAD")
    assert run["dirty"] is True
    assert run["untracked"] == ["scratch.txt"]
    assert "uncommitted changes sent as a patch" in result.stderr
    host_repo = run_tree(remote_dir / "thrust", run["run_id"])
    assert (host_repo / "docs" / "snake.md").read_text() == readme.read_text()
    assert not (host_repo / "scratch.txt").exists()
    saved = remote_dir / "thrust" / ".thrust" / "runs" / run["run_id"] / "uncommitted.patch"
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == run["patch_sha256"]


def _start_follow(project: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [EXE, "train", "fake", *args], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "200"},
    )


def _read_until(stream, needle: bytes, timeout: float = 120) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf and time.monotonic() < deadline:
        chunk = os.read(stream.fileno(), 4096)
        if not chunk:
            break
        buf += chunk
    return buf


def test_lost_link_exits_75_run_goes_on_and_logs_resume_byte_exact(cli, project, remote_dir, sshd):
    proc = _start_follow(project, *FAKE_SLOW)
    seen = _read_until(proc.stdout, b" steps")  # the first progress line (cli/follow.py)
    assert b" steps" in seen
    sshd.kill_sessions()
    _rest, err = proc.communicate(timeout=60)
    err_text = err.decode()
    assert proc.returncode == ExitCode.CONNECTION_LOST, err_text
    assert "the run goes on" in err_text
    match = re.search(r"reattach with: (thrust-remote logs \S+ --follow(?: --offset (\d+))? --host sandbox)", err_text)
    assert match, err_text
    run_id = _run_id_from(err_text)
    offset = match.group(2) or "0"
    # --raw: the log's bytes from the offset reached, exactly; with the bytes before it, the whole log
    again = subprocess.run([EXE, "logs", run_id, "--follow", "--offset", offset, "--raw", "--no-fetch"],
                           cwd=project, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr.decode()
    remote_log = (remote_dir / "thrust" / ".thrust" / "runs" / run_id / "log").read_bytes()
    assert 0 < int(offset) < len(remote_log)
    assert remote_log[: int(offset)] + again.stdout == remote_log
    assert b"THRUST_DONE" in remote_log
    assert _wait_state(cli, project, run_id, ("FINISHED",))["state"] == "FINISHED"


def test_killed_cli_leaves_run_going(cli, project, remote_dir):
    proc = _start_follow(project, *FAKE_SLOW)
    seen = _read_until(proc.stdout, b" steps")
    assert b" steps" in seen
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    runs = json.loads(cli("runs", "--json", cwd=project).stdout)
    running = [r for r in runs if r["state"] == "RUNNING"]
    assert len(running) == 1
    run_id = running[0]["run_id"]
    again = subprocess.run([EXE, "logs", run_id, "-f", "--raw", "--no-fetch"], cwd=project, capture_output=True,
                           timeout=300)
    assert again.returncode == 0
    remote_log = (remote_dir / "thrust" / ".thrust" / "runs" / run_id / "log").read_bytes()
    assert again.stdout == remote_log
    assert b"THRUST_DONE" in remote_log


def test_kill_9_job_is_failed_and_stop_leaves_nothing_alive(cli, project, remote_dir):
    started = cli("train", "fake", *FAKE_LONG, "--detach", "--json", cwd=project)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    assert _wait_state(cli, project, info["run_id"], ("RUNNING",))["state"] == "RUNNING"
    # a second run of the same job and code may run beside it; what would collide (other code synced
    # under it, GPUs it holds) is refused: tests/test_run_index.py
    # the pid is the host's (sshd runs in its own pid namespace here): kill it there, as a user would
    killed = cli("exec", "--", "kill", "-9", str(info["pid"]), cwd=project)
    assert killed.returncode == 0, killed.stderr
    st = _wait_state(cli, project, info["run_id"], ("FAILED", "FINISHED", "LOST"))
    assert st["state"] == "FAILED"
    assert st["exit_code"] == 128 + 9
    status_text = cli("status", info["run_id"], cwd=project)
    assert "FAILED" in status_text.stdout

    # stop: TERM the group, KILL after the grace period; no process of the run survives
    started = cli("train", "fake", *FAKE_LONG, "--detach", "--json", cwd=project)
    info = json.loads(started.stdout)
    run = _wait_state(cli, project, info["run_id"], ("RUNNING",))
    assert run["state"] == "RUNNING"
    marker = _run_json(remote_dir, info["run_id"])["marker"]
    stopped = cli("stop", info["run_id"], "--grace", "5", cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    assert _wait_state(cli, project, info["run_id"], ("STOPPED",))["state"] == "STOPPED"
    assert _processes_with_marker(marker) == []


def _processes_with_marker(marker: str) -> list[int]:
    found = []
    needle = f"THRUST_RUN_MARKER={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_stale_pid_of_another_process_is_not_running(cli, project, remote_dir):
    done = cli("train", "fake", *FAKE_FAST, "--no-fetch", cwd=project)
    assert done.returncode == 0, done.stderr
    run_id = _run_id_from(done.stderr)
    run_dir = remote_dir / "thrust" / ".thrust" / "runs" / run_id
    meta = json.loads((run_dir / "run.json").read_text())
    (run_dir / "exit_code").unlink()
    # the recorded pids now belong to a live process that is not ours: pid 1 on the host, with its real
    # start time, so only the marker tells them apart
    stat = cli("exec", "--", "cat", "/proc/1/stat", cwd=project)
    assert stat.returncode == 0, stat.stderr
    start = stat.stdout.rsplit(")", 1)[1].split()[19]
    meta.update(pid=1, pid_start=start, supervisor_pid=1, supervisor_start=start)
    (run_dir / "run.json").write_text(json.dumps(meta))
    st = json.loads(cli("status", run_id, "--json", cwd=project).stdout)
    assert st["state"] == "LOST"


@pytest.mark.e2e  # the built-in trainer over ssh, for real
def test_torchrun_two_cpu_processes_survive_killed_session(cli, project, remote_dir, sshd):
    started = cli("train", "cartpole", "--nproc", "2", "--set", "total-steps=8000", "--set", "target-return=0",
                  "--detach", "--json", cwd=project)
    assert started.returncode == 0, started.stderr
    info = json.loads(started.stdout)
    sshd.kill_sessions()
    st = _wait_state(cli, project, info["run_id"], ("FINISHED", "FAILED", "LOST"), timeout=240)
    assert st["state"] == "FINISHED", (remote_dir / "thrust" / ".thrust" / "runs" / info["run_id"] / "log").read_text()
    run_dir = remote_dir / "thrust" / ".thrust" / "runs" / info["run_id"]
    assert "torch.distributed.run" in " ".join(_run_json(remote_dir, info["run_id"])["argv"])
    assert (run_dir / "model.onnx").exists()
    fetched = cli("fetch", info["run_id"], cwd=project)
    assert fetched.returncode == 0, fetched.stderr
    _check_model(project, "cartpole")


def test_injection_in_set_values_and_job_names_never_executes(cli, project, tmp_path):
    marker = tmp_path / "pwned"
    bad_sets = [f"seed=1; touch {marker}", f"policy=$(touch {marker})", f"hidden=`touch {marker}`"]
    for item in bad_sets:
        res = cli("train", "cartpole", "--set", item, "--no-fetch", cwd=project)
        assert res.returncode != 0  # the trainer rejects the value: it arrived as one literal argument
    for name in [f"cartpole;touch {marker}", "-oProxyCommand=touch x", f"$(touch {marker})"]:
        res = cli("train", name, cwd=project)
        assert res.returncode in (ExitCode.CONFIG, ExitCode.USAGE), res.stderr
    res = cli("train", "cartpole", "--set", f"bad key=1; touch {marker}", cwd=project)
    assert res.returncode == ExitCode.USAGE
    assert not marker.exists()


def test_nonsense_trainer_values_are_refused_before_anything_is_synced(cli, project, remote_dir):
    """`--set total-steps=-5` used to train one iteration and exit 0; `--set lr=0.1` synced, launched
    and died on the host with an argparse dump, leaving a FAILED run. Now: 64, and the host untouched."""
    cases = [("total-steps=-5", "--total-steps must be >= 1"), ("total-steps=0", "--total-steps must be >= 1"),
             ("lr=0.1", "--lr: not a trainer flag"), ("learning-rate=abc", "expected a number"),
             ("policy=transformer", "not one of"), ("gamma=1.5", "--gamma")]
    for item, says in cases:
        res = cli("train", "cartpole", "--set", item, cwd=project)
        assert res.returncode == ExitCode.USAGE, (item, res.stderr)
        assert says in res.stderr and "--set" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
    assert not (remote_dir / "thrust").exists()  # nothing was synced, no run was left behind


def test_cut_or_corrupt_fetch_leaves_web_public_untouched(cli, project, remote_dir, sshd):
    done = cli("train", "fake", *FAKE_FAST, cwd=project)
    assert done.returncode == 0, done.stderr
    run_id = _run_id_from(done.stderr)
    public = project / "web" / "public"
    before = {p.name: p.read_bytes() for p in public.iterdir()}
    run_dir = remote_dir / "thrust" / ".thrust" / "runs" / run_id
    # corrupt: the model on the host no longer matches its manifest
    good = (run_dir / "model.onnx").read_bytes()
    (run_dir / "model.onnx").write_bytes(good[:-10] + b"0123456789")
    res = cli("fetch", run_id, cwd=project)
    assert res.returncode == ExitCode.TRANSFER, res.stderr
    assert {p.name: p.read_bytes() for p in public.iterdir() if not p.name.startswith(".")} == before
    # cut: a big model, the link killed while it downloads
    (run_dir / "model.onnx").write_bytes(os.urandom(150_000_000))
    proc = subprocess.Popen([EXE, "fetch", run_id], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)

    def cut() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            parts = list((project / ".thrust" / "fetched").glob(".incoming-*/*.part"))
            if parts and parts[0].stat().st_size > 5_000_000:
                sshd.kill_sessions()
                return
            time.sleep(0.005)

    watcher = threading.Thread(target=cut, daemon=True)
    watcher.start()
    _out, err = proc.communicate(timeout=120)
    watcher.join()
    assert proc.returncode == ExitCode.TRANSFER, err
    assert {p.name: p.read_bytes() for p in public.iterdir() if not p.name.startswith(".")} == before


def test_cargo_job_builds_runs_and_cleans_a_stale_build(cli, project, remote_dir):
    """A `kind: cargo` job against a dependency-free crate: build under buildenv's env, run the binary
    detached, and `cargo clean` first when the build env's fingerprint changed."""
    cfg = project / "thrust.yaml"
    base = cfg.read_text()
    job = (  # base's `jobs:` has the fake job: this one joins it
        "  probe-rs:\n    kind: cargo\n    toolchain: stable\n    example: train_probe\n"
        "    crate: tests/native/crate\n    args: [--epochs, '3']\n    artifact: models/probe.onnx\n"
    )
    cfg.write_text(base + job)
    git(project, "commit", "-q", "-am", "cargo job")
    first = cli("train", "probe-rs", "--no-fetch", cwd=project)
    assert first.returncode == 0, first.stderr
    assert "cargo +stable build --release --example train_probe" in first.stderr
    run_id = re.search(r"launching run (probe-rs[\w.-]+)", first.stderr).group(1)
    log = (remote_dir / "thrust" / ".thrust" / "runs" / run_id / "log").read_text()
    assert "train_probe device=cpu args=--epochs 3" in log
    crate = run_tree(remote_dir / "thrust", run_id) / "tests" / "native" / "crate"
    # the build goes to the workdir's target dir, which every tree of this crate shares; the run ran a copy
    # of the binary in its own tree (a later build of other code replaces the shared one)
    targets = list((remote_dir / "thrust" / ".thrust" / "cargo").iterdir())
    assert len(targets) == 1 and (targets[0] / ".thrust-build-env.json").exists()
    argv = _run_json(remote_dir, run_id)["argv"]
    assert argv[0] == str(run_tree(remote_dir / "thrust", run_id) / ".thrust-bin" / "train_probe")

    # the artifact (relative to the crate on the host) is fetched, checked and placed like a python job's
    from trainer.export import export_onnx
    from trainer.policy import build_policy

    export_onnx(build_policy("mlp", 4, 2, 16), crate / "models" / "probe.onnx", env_name="cartpole")
    fetched = cli("fetch", run_id, cwd=project)
    assert fetched.returncode == 0, fetched.stderr
    placed = project / "web" / "public" / "probe-rs.onnx"
    source = (crate / "models" / "probe.onnx").read_bytes()
    assert placed.read_bytes() == source
    assert json.loads(placed.with_suffix(".json").read_text())["sha256"] == hashlib.sha256(source).hexdigest()

    again = cli("train", "probe-rs", "--no-fetch", cwd=project)
    assert again.returncode == 0, again.stderr
    assert "building" not in again.stderr  # nothing changed: the build is reused

    # the build env changes (the version-check bypass is a build variable): clean, then build again
    cfg.write_text(base + job + "    bypass_version_check: true\n")
    git(project, "commit", "-q", "-am", "bypass")
    third = cli("train", "probe-rs", "--no-fetch", cwd=project)
    assert third.returncode == 0, third.stderr
    assert "cargo clean" in third.stderr
    assert "building:" in third.stderr
