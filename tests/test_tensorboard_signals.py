"""Whatever ends `thrust-remote tensorboard` ends its TensorBoard (issue 53, item 16): a SIGTERM or a
SIGHUP sent to the command's pid alone (a process manager, `kill PID`, a closed terminal's hang-up
reaching only the session's leader) used to end the command and leave its TensorBoard serving, adopted
by init. Real processes throughout: the command as a subprocess, the suite's real TensorBoard, the real
test sshd for `--remote`; the signals go only to the pid the test started."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers import ended, wait_until

EXE = str(Path(sys.executable).parent / "thrust-remote")
JOBS = "jobs:\n  writer:\n    kind: command\n    command: [sh, w.sh]\n    metrics: {tensorboard: runs/tb}\n"
RUN = "writer-20261123-000000-1"
STARTS_S = 90.0  # a TensorBoard imports and scans for seconds on 2 loaded cores
ENDS_S = 20.0  # the command gives its TensorBoard 10 s to end on SIGTERM before a SIGKILL

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/logdir", timeout=2) as response:  # noqa: S310
            return response.status == 200
    except OSError:
        return False


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _serving(proc: subprocess.Popen, port: int, err: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"thrust-remote tensorboard ended before it served (exit {proc.returncode}): "
                             f"{err.read_text()}")
    return _answers(port)


def _start(argv: list[str], cwd: Path, err: Path) -> subprocess.Popen:
    """stderr to a file, not a pipe: a TensorBoard left behind would hold a pipe open, and reading it
    would wait for that TensorBoard rather than for the command."""
    with err.open("w") as sink:
        return subprocess.Popen([EXE, "tensorboard", RUN, "--job", "writer", *argv], cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=sink, text=True)


def _alive(pids: list[int]) -> list[int]:
    """Those of pids still running (a zombie has ended: only its parent has not reaped it yet)."""
    return [pid for pid in pids if not ended(pid)]


def _end(proc: subprocess.Popen, pids: list[int]) -> None:
    """After a failed assertion: nothing this test started keeps serving (the pids are the command's own
    descendants, recorded while it ran)."""
    for pid in [proc.pid, *_alive(pids)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@pytest.fixture
def fetched(tmp_path: Path, sshd) -> Path:
    """A project whose run has fetched TensorBoard artifacts (what the local TensorBoard serves)."""
    sshd.thrust_yaml(tmp_path / "thrust.yaml", workdir=str(tmp_path / "host"), rest=JOBS)
    (tmp_path / ".thrust" / "fetched" / RUN / "artifacts" / "runs" / "tb").mkdir(parents=True)
    return tmp_path


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGHUP, -signal.SIGHUP),
                                              (signal.SIGINT, 0)])
def test_a_signal_to_the_command_alone_ends_its_local_tensorboard(fetched, tmp_path, signum, code):
    """SIGTERM and SIGHUP: the TensorBoard ends first, then the command dies of the same signal (143 and
    129 in a shell), as a process killed by it would. SIGINT is Ctrl-C: exit 0, as documented."""
    port = _free_port()
    err = tmp_path / "stderr"
    proc = _start(["--port", str(port)], fetched, err)
    family: list[int] = []
    try:
        wait_until(lambda: _serving(proc, port, err), STARTS_S, "the local TensorBoard to answer")
        family = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert family, "TensorBoard is the command's child"
        proc.send_signal(signum)
        assert proc.wait(timeout=ENDS_S) == code, err.read_text()
        assert "Traceback" not in err.read_text(), err.read_text()
        wait_until(lambda: not _alive(family), ENDS_S, f"the command's TensorBoard {family} to end")
        assert not _listening(port), "nothing serves on the port once the command has ended"
    finally:
        _end(proc, family)


def _host_tensorboards(logdir: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if logdir in cmdline and "tensorboard.main" in cmdline:
            out.append(p.pid)
    return out


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_command_ends_the_hosts_tensorboard_and_the_forward(sshd, remote_dir, tmp_path, signum):
    workdir = remote_dir / "w"
    sshd.thrust_yaml(tmp_path / "thrust.yaml", workdir=str(workdir), rest=JOBS)
    run_dir = workdir / ".thrust" / "runs" / RUN
    run_dir.mkdir(parents=True)
    (workdir / "runs" / "tb").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"cwd": str(workdir), "env": {"THRUST_PYTHON": sys.executable}}))
    logdir = f"{workdir}/runs/tb"
    port = _free_port()
    err = tmp_path / "stderr"
    proc = _start(["--remote", "--port", str(port)], tmp_path, err)
    try:
        wait_until(lambda: _serving(proc, port, err), STARTS_S, "the host's TensorBoard to answer through the forward")
        assert _host_tensorboards(logdir), "the host's TensorBoard runs"
        proc.send_signal(signum)
        assert proc.wait(timeout=ENDS_S) == -signum, err.read_text()
        said = err.read_text()
        assert "Traceback" not in said and "Socket exception" not in said, said
        wait_until(lambda: not _host_tensorboards(logdir), ENDS_S, "the host's TensorBoard to end")
        assert not _listening(port), "the forward's port is closed"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
