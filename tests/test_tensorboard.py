"""`thrust-remote tensorboard RUN_ID` (docs/architecture.md, "TensorBoard"): the local one on the fetched
artifacts, the host's one through a local port forward over the real test sshd, the forward itself
against a plain http.server on the "host", and the errors (not installed: 69 with the pip command)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from thrust_remote.core.config import load_config
from thrust_remote.core.errors import ExitCode
from thrust_remote.host.session import HostSession
from thrust_remote.host.ssh.forward import LocalForward
from thrust_remote.runs import tboard

EXE = str(Path(sys.executable).parent / "thrust-remote")
JOBS = "jobs:\n  writer:\n    kind: command\n    command: [sh, w.sh]\n    metrics: {tensorboard: runs/tb}\n"
RUN = "writer-20261123-000000-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback only
        return response.read()


def _poll(url: str, proc: subprocess.Popen, deadline_s: float = 90) -> bytes:
    """The first answer from url while proc runs (a TensorBoard takes seconds to start)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            return _get(url, timeout=2)
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} never answered (exit {proc.poll()})")


@pytest.fixture
def project(sshd, remote_dir, tmp_path) -> tuple[Path, Path]:
    """(project, host workdir) with the writer job, and a run dir on the host: run.json says its cwd and
    the job's python (THRUST_PYTHON), as the agent's launch writes them."""
    workdir = remote_dir / "w"
    sshd.thrust_yaml(tmp_path / "thrust.yaml", workdir=str(workdir), rest=JOBS)
    run_dir = workdir / ".thrust" / "runs" / RUN
    run_dir.mkdir(parents=True)
    (workdir / "runs" / "tb").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"cwd": str(workdir), "env": {"THRUST_PYTHON": sys.executable}}))
    return tmp_path, workdir


def test_argv_binds_loopback_and_the_host_plan_uses_the_jobs_python_and_dir(sshd, project):
    proj, workdir = project
    assert tboard.tensorboard_argv("/v/bin/python", "/w/runs", 0) == [
        "/v/bin/python", "-m", "tensorboard.main", "--logdir", "/w/runs", "--host", "127.0.0.1", "--port", "0"]
    config = load_config(proj / "thrust.yaml", environ={})
    runner = sshd.runner(workdir=str(workdir))
    try:
        session = HostSession.open(runner, config.host("sandbox"), config)
        argv, logdir = tboard.remote_plan(session, RUN, config.job("writer"))
        assert logdir == f"{workdir}/runs/tb" and argv[0] == sys.executable
        _argv, no_tb = tboard.remote_plan(session, RUN, None)  # no job known: the run dir
        assert no_tb == f"{workdir}/.thrust/runs/{RUN}"
        with pytest.raises(Exception, match="no .*run.json") as info:
            tboard.remote_plan(session, "writer-not-there", None)
        assert info.value.exit_code == ExitCode.USAGE
    finally:
        runner.close()


def test_wait_for_url_reads_until_the_port_and_stops_when_it_ends():
    chunks = iter([b"TensorFlow installation not found\r\n", b"TensorBoard 2.21 at http://127.0.0.1:41", b"23/ ("])
    assert tboard.wait_for_url(lambda _w: next(chunks))[0] == 4123
    ended = iter([b"No module named tensorboard\r\n", None])
    port, said = tboard.wait_for_url(lambda _w: next(ended))
    assert port is None and b"No module named tensorboard" in said


def test_local_forward_over_the_real_sshd_reaches_a_server_on_the_host(sshd, tmp_path):
    (tmp_path / "hello.txt").write_bytes(b"through the tunnel\n" * 5000)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    runner = sshd.runner()
    try:
        with LocalForward(runner.transport, ("127.0.0.1", server.server_address[1])) as forward:
            assert forward.port != server.server_address[1]
            results: list[bytes] = []
            threads = [threading.Thread(target=lambda: results.append(
                _get(f"http://127.0.0.1:{forward.port}/hello.txt"))) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert results == [b"through the tunnel\n" * 5000] * 4  # concurrent connections, each whole
            assert not forward.errors
    finally:
        runner.close()
        server.shutdown()


def test_a_pty_command_whose_link_died_ends_its_output_and_hangs_up_quietly(sshd):
    """The reads of a pty command's output live on their own thread (a Ctrl-C in the main thread must
    never cut one of paramiko's packets in half); a link lost under it ends the output, and hanging
    up a channel whose link is gone raises nothing (it used to leak an EOFError: exit 130)."""
    from thrust_remote.host.ssh.forward import ChannelReader, hang_up, open_pty_command

    runner = sshd.runner()
    try:
        chan = open_pty_command(runner.transport(), ["sh", "-c", "echo ready; exec sleep 60"])
        output = ChannelReader(chan)
        said, deadline = b"", time.monotonic() + 30
        while b"ready" not in said and time.monotonic() < deadline:
            said += output.read(1.0) or b""
        assert b"ready" in said
        assert sshd.kill_sessions() >= 1  # the link dies under the open channel
        while output.read(1.0) is not None and time.monotonic() < deadline:
            pass
        assert output.read(0) is None and output.read(0) is None  # ended, and stays ended
        hang_up(chan)
        hang_up(chan)
    finally:
        runner.close()


def test_not_installed_is_69_with_the_pip_command(project, tmp_path):
    proj, _workdir = project
    stub = tmp_path / "stub" / "tensorboard"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('hidden by the test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(stub.parent), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([EXE, "tensorboard", RUN, "--job", "writer"], cwd=proj, capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == ExitCode.UNAVAILABLE == 69, result.stderr
    assert "pip install 'thrust-remote[tensorboard]'" in result.stderr and "Traceback" not in result.stderr


def test_nothing_fetched_says_how_to_fetch(cli, project):
    proj, _workdir = project
    result = cli("tensorboard", RUN, "--job", "writer", cwd=proj)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert f"thrust-remote fetch {RUN}" in result.stderr
    typo = cli("tensorboard", RUN, "--job", "writr", cwd=proj)  # never silently ignored
    assert typo.returncode == ExitCode.USAGE and "unknown job 'writr' (did you mean 'writer'?)" in typo.stderr


@pytest.mark.slow
def test_local_tensorboard_serves_the_fetched_dir(project):
    proj, _workdir = project
    logdir = proj / ".thrust" / "fetched" / RUN / "artifacts" / "runs" / "tb"
    logdir.mkdir(parents=True)
    port = _free_port()
    proc = subprocess.Popen([EXE, "tensorboard", RUN, "--job", "writer", "--port", str(port)], cwd=proj,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        answer = json.loads(_poll(f"http://127.0.0.1:{port}/data/logdir", proc))
        assert answer["logdir"] == str(logdir)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 0


@pytest.mark.slow
def test_remote_tensorboard_through_the_forward_and_gone_after_ctrl_c(project):
    proj, workdir = project
    port = _free_port()
    proc = subprocess.Popen([EXE, "tensorboard", RUN, "--job", "writer", "--remote", "--port", str(port)], cwd=proj,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    logdir = f"{workdir}/runs/tb"
    busy = threading.Event()
    done = threading.Event()

    def keep_pulling() -> None:  # bytes keep moving through the forward when the Ctrl-C lands
        while not done.is_set():
            try:
                _get(f"http://127.0.0.1:{port}/data/logdir", timeout=2)
                busy.set()
            except OSError:
                return

    puller = threading.Thread(target=keep_pulling, daemon=True)
    try:
        answer = json.loads(_poll(f"http://127.0.0.1:{port}/data/logdir", proc))
        assert answer["logdir"] == logdir  # the host's TensorBoard, on the job's dir there
        puller.start()
        assert busy.wait(30), "the forward answered once, then never again"
    finally:
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=30)
        done.set()
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/" in err
    assert "Socket exception" not in err and "interrupted" not in err and "Traceback" not in err, err

    def host_tensorboards() -> list[int]:
        out = []
        for p in psutil.process_iter(["cmdline"]):
            if logdir in (p.info["cmdline"] or []) and "tensorboard.main" in (p.info["cmdline"] or []):
                out.append(p.pid)
        return out

    deadline = time.monotonic() + 30
    while host_tensorboards() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not host_tensorboards()  # the pty's hang-up ended it: nothing left on the host


def test_a_host_python_without_tensorboard_says_to_add_it_to_the_requirements(tmp_path):
    """What `python -m tensorboard.main` prints on a python without it (the real interpreter's words)."""
    from types import SimpleNamespace

    said = subprocess.run([sys.executable, "-S", "-m", "tensorboard.main"], capture_output=True, cwd=tmp_path).stderr
    assert b"No module named" in said
    error = tboard.start_failed(SimpleNamespace(name="nubox"), said)
    assert error.exit_code == ExitCode.UNAVAILABLE
    assert "not installed in the job's python on nubox" in str(error) and "requirements" in error.hint


def test_an_eof_that_escapes_a_command_is_a_lost_connection_not_an_interrupt(monkeypatch, capsys):
    """typer turns an escaped EOFError (paramiko's word for a dead socket) into Abort, which read as
    "interrupted" (130) though nobody pressed Ctrl-C. A pure unit test of the CLI's one error mapping."""
    from thrust_remote.cli import main
    from thrust_remote.cli import runs as cli_runs

    def dead_socket(*_args: object, **_kwargs: object) -> None:
        raise EOFError

    monkeypatch.setattr(cli_runs, "get_config", dead_socket)
    with pytest.raises(SystemExit) as exited:
        main.run(["runs"])
    assert exited.value.code == ExitCode.CONNECTION_LOST
    err = capsys.readouterr().err
    assert "interrupted" not in err and "connection ended" in err and "Traceback" not in err


@pytest.mark.parametrize("debug", [False, True])
def test_paramikos_own_log_lines_never_reach_the_terminal_raw_unless_debug(debug):
    """paramiko logs link trouble from its transport thread; with no handler, Python's last-resort
    handler printed it raw ("Socket exception: Broken pipe (32)"). With --debug it is shown, named."""
    script = (
        "import logging, sys\n"
        "import thrust_remote.host.ssh  # what every command that connects imports\n"
        "from thrust_remote.cli import main\n"
        "try:\n"
        f"    main.run([*{['--debug'] if debug else []!r}, '--version'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "logging.getLogger('paramiko.transport').error('Socket exception: Broken pipe (32)')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "THRUST_DEBUG"}
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env).stderr
    if debug:
        assert "paramiko.transport: Socket exception: Broken pipe (32)" in err
    else:
        assert "Socket exception" not in err, err
