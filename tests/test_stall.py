"""A host process that stops answering while its connection still does (SIGSTOP, a debugger, a frozen
box): the agent link's `agent serve` and the transfer helper (`xfer serve`), over a real sshd.

A keepalive proves only the connection, so each of these is noticed by what the process itself does:
the agent answers a ping from its own loop (host/agentlink.py), the helper sends or reads bytes
(host/streams.py). A stall is noticed within the time a dead link takes (`liveness_timeout`
twice: 20 s by default), named as such, and only that process is given up. A launch whose answer
never came is asked again before any error: a run that started is carried on with, one that did not is
withdrawn there, so a late launch is refused and never runs unrecorded.

Every process signalled here is one this module's own sshd started for the test (found among that
sshd's children, new since the test began), and it is continued (SIGCONT) in a `finally`.
"""

from __future__ import annotations

import contextlib
import fcntl
import inspect
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from conftest import _start_sshd
from helpers import ended, remote_tempdir, wait_until

from thrust_remote.agent.protocol import RUN_JSON, WITHDRAWN, RunState
from thrust_remote.core.errors import ExitCode, ThrustError, TransferError
from thrust_remote.host.runner import StalledError
from thrust_remote.host.session import HostSession
from thrust_remote.host.ssh import SSHRunner
from thrust_remote.runs import control

FAST_LIVENESS_S = 3.0  # a stall is then noticed in ~6 s (2L), where the default L = 10 s gives ~20 s


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A host of this module's own: the processes a test stops are among its sshd's children only."""
    server = _start_sshd(tmp_path_factory.mktemp("stall-sshd"))
    try:
        yield server
    finally:
        server.stop()


def _host_pids(sshd, match: Callable[[list[str]], bool]) -> set[int]:
    """The pids of the processes on this sshd's host whose argv `match` says are the process looked for."""
    found = set()
    for proc in sshd.processes():
        with contextlib.suppress(psutil.Error):
            if match(proc.cmdline()):
                found.add(proc.pid)
    return found


def _is_agent_serve(argv: list[str]) -> bool:
    return bool(argv) and argv[-1] == "serve" and any("agent-" in a and a.endswith(".pyz") for a in argv)


def _is_xfer_helper(argv: list[str]) -> bool:
    return bool(argv) and argv[-1] == "serve" and "-c" in argv  # `python -S -c SOURCE serve`, not its sh


def _new_one(sshd, match: Callable[[list[str]], bool], before: set[int], what: str) -> int:
    pids = wait_until(lambda: _host_pids(sshd, match) - before, 30, what)
    assert len(pids) == 1, pids
    return pids.pop()


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """SIGSTOP one process this test started; SIGCONT it whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _session(sshd, workdir: Path, liveness_s: float | None = None) -> HostSession:
    host = sshd.host_config(workdir=str(workdir))
    runner = SSHRunner.from_host(host)
    if liveness_s is not None:
        runner.liveness_timeout = liveness_s
    return HostSession.open(runner, host)


def _serving(sshd, session: HostSession, before: set[int]) -> int:
    """The pid of the session's `agent serve`, once a first request went through it."""
    assert session.agent_json("runs", "list", "--runs-dir", session.paths.runs) == []
    return _new_one(sshd, _is_agent_serve, before, "the session's agent serve")


# ------------------------------------------------------------------------------------------ agent link


def test_the_default_stall_time_is_a_dead_links_twice_the_liveness_timeout() -> None:
    """The tests below run at FAST_LIVENESS_S; what a user gets is this default: 10 s of silence, then
    the ping or the helper's bytes, unanswered 10 s more: ~20 s (measured: 20.2 s for a stopped agent,
    20.0 s for a stopped helper mid-fetch)."""
    assert inspect.signature(SSHRunner.__init__).parameters["liveness_timeout"].default == 10.0


def test_a_stopped_agent_is_noticed_as_fast_as_a_dead_link_and_a_read_is_asked_again(sshd) -> None:
    """`status` asked of a stopped `agent serve` (a follow's poll: the run FINISHED meanwhile) is asked
    once more of a fresh server once the stopped one missed its ping, not left to its deadline's 124."""
    workdir = remote_tempdir(sshd)
    before = _host_pids(sshd, _is_agent_serve)
    with _session(sshd, workdir, FAST_LIVENESS_S) as session:
        run_dir = session.paths.run("r1")
        started = session.agent_json("launch", "launch", "--run-dir", run_dir, "--cwd", str(workdir), "--lock",
                                     control.launch_lock(session.paths), "--", "true")
        assert started["pid"]
        pid = _new_one(sshd, _is_agent_serve, before, "the session's agent serve")
        wait_until(lambda: (Path(run_dir) / "exit_code").exists(), 30, "the run's end")
        transport = session.runner.transport()
        with _stopped(pid):
            t0 = time.monotonic()
            answer = control.status(session, "r1")
            took = time.monotonic() - t0
        assert answer["state"] == RunState.FINISHED
        # a ping after L s of silence, unanswered for L s more: ~2L (20 s at the default L of 10 s)
        assert 1.5 * FAST_LIVENESS_S < took < 2 * FAST_LIVENESS_S + 10, took
        assert session.runner.transport() is transport  # the connection was never given up
        print(f"stalled agent noticed (and the status asked again) after {took:.1f} s")


def test_a_request_that_changes_something_is_not_asked_again_and_says_the_agent_stopped(sshd) -> None:
    workdir = remote_tempdir(sshd)
    before = _host_pids(sshd, _is_agent_serve)
    with _session(sshd, workdir, FAST_LIVENESS_S) as session:
        pid = _serving(sshd, session, before)
        lease = f"{workdir}/study.lease"
        with _stopped(pid):
            t0 = time.monotonic()
            with pytest.raises(StalledError) as info:
                session.agent("lease", "create", lease, stdin=b'{"token": "t1"}', timeout=60)
            took = time.monotonic() - t0
        assert took < 4 * FAST_LIVENESS_S, took
        assert info.value.exit_code == ExitCode.CONNECTION_LOST
        assert info.value.message.startswith("the agent on sandbox stopped answering for "), info.value.message
        assert "(its process is stopped or frozen" in info.value.message
        # the next request goes to a new server (the stopped one is given up): the lease was created once,
        # by the stopped one's request once it ran again, or not at all; asking now tells which
        wait_until(lambda: ended(pid), 30, "the stopped server's end once continued (its channel closed)")
        again = session.agent("lease", "read", lease)
        assert again.ok, again.stderr


# ------------------------------------------------------------------------------------------ launch


@contextlib.contextmanager
def _launch_lock_held(session: HostSession) -> Iterator[Callable[[], None]]:
    """The host's launch lock taken here (the host is this machine): a launch waits at it. Yields the
    release, which the `finally` calls too."""
    path = Path(control.launch_lock(session.paths))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    released = []

    def release() -> None:
        if not released:
            released.append(True)
            os.close(fd)

    try:
        yield release
    finally:
        release()


def _launch(session: HostSession, run_id: str, argv: list[str], box: dict) -> threading.Thread:
    def go() -> None:
        try:
            box["answer"] = control.launch(session, run_id=run_id, job="j", argv=argv, cwd=session.paths.workdir,
                                           env={}, meta={})
        except BaseException as exc:  # noqa: BLE001 - looked at by the test's thread
            box["error"] = exc
        box["took"] = time.monotonic() - box["t0"]

    box["t0"] = time.monotonic()
    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    return thread


def test_a_launch_whose_agent_stopped_after_starting_the_run_carries_on_as_launched(sshd) -> None:
    """The launch ran (its request's process is its own) and the run FINISHED, but its answer never came:
    the outcome asked again says it started, so it is carried on with, never run a second time."""
    workdir = remote_tempdir(sshd)
    before = _host_pids(sshd, _is_agent_serve)
    with _session(sshd, workdir, FAST_LIVENESS_S) as session:
        pid = _serving(sshd, session, before)
        run_dir = session.paths.run("r1")
        box: dict = {}
        with _launch_lock_held(session) as release:
            thread = _launch(session, "r1", ["sh", "-c", "echo ran"], box)
            wait_until(lambda: _host_pids(sshd, lambda a: "launch" in a and run_dir in a), 30,
                       "the launch's process, waiting for the lock")
            with _stopped(pid):
                release()  # the launch goes on without its server: the run starts and ends
                thread.join(60)
                assert not thread.is_alive(), "the launch never returned"
        assert "error" not in box, box.get("error")
        answer = box["answer"]
        assert answer["launched"] and answer["pid"] and box["took"] < 6 * FAST_LIVENESS_S, box
        assert control.status(session, "r1")["state"] == RunState.FINISHED
        assert (Path(run_dir) / "log").read_text().count("ran") == 1  # run once


def test_a_launch_that_never_reached_a_stopped_agent_is_withdrawn_and_refused_when_it_arrives_late(sshd) -> None:
    workdir = remote_tempdir(sshd)
    before = _host_pids(sshd, _is_agent_serve)
    with _session(sshd, workdir, FAST_LIVENESS_S) as session:
        pid = _serving(sshd, session, before)
        run_dir = Path(session.paths.run("r1"))
        box: dict = {}
        with _stopped(pid):
            thread = _launch(session, "r1", ["sh", "-c", "echo ran"], box)
            thread.join(60)
            assert not thread.is_alive(), "the launch never returned"
        error = box.get("error")
        assert isinstance(error, ThrustError), box
        assert error.exit_code == ExitCode.UNAVAILABLE and box["took"] < 6 * FAST_LIVENESS_S, box
        assert error.message.startswith("run r1 was not launched on sandbox: the agent on sandbox stopped "
                                        "answering for "), error.message
        assert "it will not start later" in error.message
        assert (run_dir / WITHDRAWN).exists()
        # continued, the old server reads the launch it was sent and starts it: refused, never run
        wait_until(lambda: ended(pid), 30, "the continued server's end (its channel was closed)")
        wait_until(lambda: not _host_pids(sshd, lambda a: "launch" in a and str(run_dir) in a), 30,
                   "the late launch's end")
        assert not (run_dir / RUN_JSON).exists() and not (run_dir / "log").exists()
        assert session.agent_json("runs", "list", "--runs-dir", session.paths.runs) == []  # no phantom LOST run
        late = session.agent("launch", "--run-dir", str(run_dir), "--cwd", str(workdir), "--lock",
                             control.launch_lock(session.paths), "--", "true")
        assert late.exit_code == 3 and json.loads(late.stdout)["error"] == "withdrawn"


# ------------------------------------------------------------------------------------------ transfers


def _part_size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.glob(".*.part"))


def _warm_helper(sshd, runner: SSHRunner) -> int:
    """The pid of `runner`'s one warmed transfer helper, at the fast liveness."""
    runner.liveness_timeout = FAST_LIVENESS_S
    before = _host_pids(sshd, _is_xfer_helper)
    runner.transport()  # a warm never opens the connection itself
    runner.warm_transfers(1)
    return _new_one(sshd, _is_xfer_helper, before, "the warmed transfer helper")


def test_a_transfer_helper_stopped_mid_fetch_fails_within_the_dead_link_time_and_leaves_no_part(sshd,
                                                                                                 tmp_path) -> None:
    remote = remote_tempdir(sshd)
    big = remote / "big.bin"
    with open(big, "wb") as fh:  # sparse: the host reads it at memory speed, the transfer is what is slow
        fh.truncate(2 << 30)
    (remote / "small.txt").write_text("small\n")
    runner = sshd.runner()
    try:
        pid = _warm_helper(sshd, runner)
        box: dict = {}

        def get() -> None:
            try:
                runner.get(str(big), tmp_path / "big.bin")
            except BaseException as exc:  # noqa: BLE001 - looked at by the test's thread
                box["error"] = exc
            box["ended"] = time.monotonic()

        thread = threading.Thread(target=get, daemon=True)
        thread.start()
        wait_until(lambda: _part_size(tmp_path) > 8 << 20 or "ended" in box, 60, "the fetch under way")
        with _stopped(pid):
            t0 = time.monotonic()
            thread.join(60)
            assert not thread.is_alive(), "the fetch still hangs a minute after its helper stopped"
        took = box["ended"] - t0
        error = box.get("error")
        assert isinstance(error, TransferError) and error.exit_code == ExitCode.TRANSFER, box
        assert f"download of sandbox:{big} was cut: the transfer helper on sandbox stopped sending for " \
            in error.message and "(its process is stopped or frozen" in error.message, error.message
        assert 1.5 * FAST_LIVENESS_S < took < 2 * FAST_LIVENESS_S + 10, took  # its stall time: 2L
        assert list(tmp_path.iterdir()) == []  # no .part, no destination
        assert runner.get(str(remote / "small.txt"), tmp_path / "small.txt")  # a fresh helper, same connection
        assert (tmp_path / "small.txt").read_text() == "small\n"
        print(f"stalled transfer helper noticed after {took:.1f} s")
    finally:
        runner.close()


def test_a_transfer_helper_stopped_mid_upload_is_given_up_and_removes_its_part_once_continued(sshd,
                                                                                              tmp_path) -> None:
    remote = remote_tempdir(sshd)
    src = tmp_path / "big.bin"
    with open(src, "wb") as fh:
        fh.truncate(2 << 30)
    runner = sshd.runner()
    try:
        pid = _warm_helper(sshd, runner)
        box: dict = {}

        def put() -> None:
            try:
                runner.put(src, str(remote / "big.bin"))
            except BaseException as exc:  # noqa: BLE001 - looked at by the test's thread
                box["error"] = exc

        thread = threading.Thread(target=put, daemon=True)
        thread.start()
        wait_until(lambda: _part_size(remote) > 8 << 20 or not thread.is_alive(), 60, "the upload under way")
        with _stopped(pid):
            thread.join(60)
            assert not thread.is_alive(), "the upload still hangs a minute after its helper stopped"
        error = box.get("error")
        assert isinstance(error, TransferError), box
        assert "the transfer helper on sandbox stopped reading for " in error.message, error.message
        assert not (remote / "big.bin").exists()
        wait_until(lambda: _part_size(remote) == 0 and not list(remote.glob(".*.part")), 30,
                   "the helper, continued, to remove its part")
    finally:
        runner.close()
