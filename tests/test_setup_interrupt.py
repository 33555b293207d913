"""Ctrl-C (and a laptop that dies) during a job's `setup:` stops the setup on the host (issue 51, item 10).

A command run over SSH without a pty gets no signal when its channel closes: a `train` stopped in its
`setup:` used to leave the host's `timeout -k 5 21600 ...` running for hours. Each test starts a real
`train` whose setup sleeps, finds the setup on the host by a marker word in its argv, stops the CLI
(SIGINT as a terminal's Ctrl-C sends it, SIGKILL, or the link cut under it) and polls, with a deadline,
until every process of the setup is gone."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time

import psutil
import pytest
from helpers import EXE, new_project, remote_tempdir, wait_until

from thrust_remote.core.errors import ExitCode

pytestmark = pytest.mark.xdist_group("setup-interrupt")

JOBS = """\
jobs:
  slow:
    kind: command
    command: [sh, -c, 'echo ran > "$THRUST_RUN_DIR/ran"']
    setup: [sh, -c, 'echo setting-up; sleep 600; echo never', {marker}]
"""
GONE_S = 15.0  # the host's watch notices a closed channel at once; its grace to the command is 4 s


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    return env


def _setup_processes(sshd, marker: str) -> list[psutil.Process]:
    """The host's processes of the setup: those whose argv names the marker, and their descendants."""
    found: dict[int, psutil.Process] = {}
    for proc in sshd.processes():
        try:
            if any(marker in word for word in proc.cmdline()):
                found[proc.pid] = proc
                found.update((child.pid, child) for child in proc.children(recursive=True))
        except psutil.Error:
            continue
    return list(found.values())


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for proc in procs:
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(proc.cmdline())[:120])
        except psutil.Error:
            continue
    return left


def _start_train(sshd, tmp_path) -> tuple[subprocess.Popen, str, list[psutil.Process]]:
    """A `train slow` whose setup is running on the host: the CLI process, the marker, the setup's processes."""
    marker = f"setup-marker-{secrets.token_hex(4)}"
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=JOBS.format(marker=marker),
                       python="/usr/bin/python3")
    proc = subprocess.Popen([EXE, "train", "slow"], cwd=proj, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        # the sleep under the setup's shell: the whole setup is under way
        procs = wait_until(lambda: [p for p in _setup_processes(sshd, marker) if p.name() == "sleep"]
                           and _setup_processes(sshd, marker), 120, "the setup running on the host")
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc, marker, procs


def _assert_setup_ends(sshd, marker: str, procs: list[psutil.Process]) -> None:
    wait_until(lambda: not _alive(procs) and not _setup_processes(sshd, marker), GONE_S,
               f"the setup's processes on the host to end: {_alive(procs)}")


@pytest.mark.slow
def test_ctrl_c_in_setup_stops_the_hosts_setup_and_exits_130(sshd, tmp_path):
    proc, marker, procs = _start_train(sshd, tmp_path)
    pressed = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _out, err = proc.communicate(timeout=GONE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _out, err = proc.communicate()
        pytest.fail(f"the CLI did not stop within {GONE_S} s of Ctrl-C: {err.decode()[-2000:]}")
    assert proc.returncode == ExitCode.INTERRUPTED, err.decode()
    assert time.monotonic() - pressed < 10
    text = err.decode()
    assert "Traceback" not in text and ("interrupted" in text or "Ctrl-C" in text), text
    _assert_setup_ends(sshd, marker, procs)


@pytest.mark.slow
def test_a_laptop_killed_in_setup_leaves_no_setup_running_on_the_host(sshd, tmp_path):
    proc, marker, procs = _start_train(sshd, tmp_path)
    proc.kill()  # SIGKILL: nothing on the laptop runs again; the kernel closes its connection
    proc.communicate()
    _assert_setup_ends(sshd, marker, procs)


@pytest.mark.slow
def test_a_connection_cut_in_setup_leaves_no_setup_running_on_the_host(sshd, tmp_path):
    """The per-connection sshd killed (the link gone, as the host sees it): the setup ends too."""
    proc, marker, procs = _start_train(sshd, tmp_path)
    try:
        assert sshd.kill_sessions() > 0
        _assert_setup_ends(sshd, marker, procs)
    finally:
        proc.kill()
        proc.communicate()


def test_ctrl_c_in_exec_stops_the_command_on_the_host(sshd, tmp_path):
    """Every long command the laptop follows is watched: `exec` of a command that sleeps, then Ctrl-C."""
    marker = f"exec-marker-{secrets.token_hex(4)}"
    proj = new_project(tmp_path / "project", sshd, remote_tempdir(sshd) / "w")
    proc = subprocess.Popen([EXE, "exec", "--", "sh", "-c", "echo started; sleep 600; echo never", marker],
                            cwd=proj, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        procs = wait_until(lambda: [p for p in _setup_processes(sshd, marker) if p.name() == "sleep"]
                           and _setup_processes(sshd, marker), 60, "the command running on the host")
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=GONE_S)
        assert proc.returncode == ExitCode.INTERRUPTED and "Traceback" not in err.decode(), err.decode()
        _assert_setup_ends(sshd, marker, procs)
    finally:
        proc.kill()
        proc.communicate()


def test_a_watched_command_sees_no_stdin_and_runs_even_where_the_hosts_python_is_wrong(sshd):
    """The watch holds the channel's stdin: the command reads /dev/null, as it read an empty stdin before.
    The watch needs the host's `python:`; a wrong one must not stop `exec` (the way to find the right
    one) from running the command: it runs without its watch."""
    for python in (None, "/nonexistent/python3"):
        runner = sshd.runner(**({"python": python} if python else {}))
        try:
            lines: list[str] = []
            done = runner.run(["sh", "-c", "echo hi; cat; echo end"], timeout=120,
                              stream=lambda _name, line, seen=lines: seen.append(line))
            assert done.exit_code == 0 and lines == ["hi", "end"], (python, done.stderr, lines)
        finally:
            runner.close()
