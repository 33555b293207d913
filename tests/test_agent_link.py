"""One agent process per connection (`agent serve`, host/agentlink.py), over a real sshd: the JSON
subcommands of a session go to one server on the host as requests, answered as their own commands would
be (stdout, stderr, exit code, stdin), at once from several threads, with the request's timeout kept by
the host (124); a session whose server cannot start runs commands as before."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
from conftest import _start_sshd
from helpers import remote_tempdir

from thrust_remote.core.config import HostConfig
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostSession
from thrust_remote.host.ssh import SSHRunner


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A host of this module's own: its `agent serve` processes are counted, and no other test's
    session (one not closed yet, a server on its way out) is among them."""
    server = _start_sshd(tmp_path_factory.mktemp("link-sshd"))
    try:
        yield server
    finally:
        server.stop()


def _session(sshd, workdir) -> HostSession:
    host = sshd.host_config(workdir=str(workdir))
    return HostSession.open(SSHRunner.from_host(host), host)


def _servers(sshd, describe: bool = False) -> list[str]:
    """The `agent serve` processes on this test's sshd's host (another suite on the machine has its
    own): their command lines, or with `describe` what a leftover's report needs (parent, state, age,
    what its stdin is and where it waits)."""
    import psutil

    out = []
    for proc in sshd.processes():
        try:
            cmd = " ".join(proc.cmdline())
            if "agent-" in cmd and cmd.rstrip().endswith(" serve"):
                out.append(_described(proc, cmd) if describe else cmd)
        except psutil.Error:
            continue
    return out


def _described(proc, cmd: str) -> str:
    def read(name: str) -> str:
        try:
            return os.readlink(f"/proc/{proc.pid}/{name}") if name.startswith("fd/") else \
                Path(f"/proc/{proc.pid}/{name}").read_text().strip().replace("\n", " | ")
        except OSError as exc:
            return f"? ({exc.strerror})"

    parents = " < ".join(f"{p.pid}:{p.name()}" for p in proc.parents())
    return (f"{cmd} (pid {proc.pid}, {proc.status()}, {time.time() - proc.create_time():.1f} s old, "
            f"parents {parents}; stdin {read('fd/0')}, stdout {read('fd/1')}; wchan {read('wchan')}; "
            f"stack {read('stack')[:300]})")


def test_a_sessions_requests_go_to_one_agent_and_answer_as_commands_do(sshd) -> None:
    workdir = remote_tempdir(sshd)
    before = len(_servers(sshd))
    with _session(sshd, workdir) as session:
        runs = f"{workdir}/.thrust/runs"
        assert session.agent_json("runs", "list", "--runs-dir", runs) == []
        assert len(_servers(sshd)) == before + 1  # started on first use, and only one
        lease = f"{workdir}/study.lease"
        created = session.agent("lease", "create", lease, stdin=b'{"token": "t1"}')  # stdin reaches it
        assert created.ok and json.loads(created.stdout) == {"created": True}
        again = session.agent("lease", "create", lease, stdin=b"{}")
        assert again.exit_code == 3 and json.loads(again.stdout) == {"created": False}  # its own exit code
        bad = session.agent("lease", "frobnicate", lease)
        assert bad.exit_code == 2 and "invalid choice" in bad.stderr  # argparse's usage error, on stderr
        answers: list[dict] = []

        def ask() -> None:
            answers.append(session.agent_json("lease", "lease", "read", lease))

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == 8 and all(a["lease"] == {"token": "t1"} for a in answers)
        assert len(_servers(sshd)) == before + 1  # eight at once, still one server
    closed = time.monotonic()
    while len(_servers(sshd)) > before and time.monotonic() < closed + 10:
        time.sleep(0.05)
    left = _servers(sshd, describe=True)
    # it never outlives its connection
    assert len(left) == before, f"{time.monotonic() - closed:.1f} s after the close: {left}"


def test_a_session_starts_its_agent_before_its_first_request_and_a_close_meanwhile_leaves_none(sshd) -> None:
    """HostSession.open starts the server in the background (its login shell and python beside the
    caller's own work); a session closed while it starts leaves no server and no connection behind."""
    from helpers import wait_until

    workdir = remote_tempdir(sshd)
    before = len(_servers(sshd))
    with _session(sshd, workdir) as session:
        wait_until(lambda: len(_servers(sshd)) == before + 1, 30, "the session's server, before any request")
        runs = f"{workdir}/.thrust/runs"
        assert session.agent_json("runs", "list", "--runs-dir", runs) == []
        assert len(_servers(sshd)) == before + 1  # the request went to the server already started
    wait_until(lambda: len(_servers(sshd)) == before, 10, "the server's end with its connection")
    closed = []
    for _ in range(5):
        session = _session(sshd, workdir)
        session.close()  # at once: its server is still starting
        closed.append(session)
    for session in closed:
        session._starting.join(30)  # each start has ended: given up, or closed what it opened
        assert not session._starting.is_alive()
        assert session._link is None or session._link.dead
        assert session.runner._conn is None  # no connection opened again after the close
    # a start that passed its own check before the close and got the link's lock only after it (one that
    # waited out the session's requests) opens nothing: no server, no connection
    assert closed[0]._agent_link() is None and closed[0].runner._conn is None
    wait_until(lambda: len(_servers(sshd)) == before, 10, "no server left by the sessions closed while starting")


def test_a_request_that_reads_installed_packages_sees_the_hosts_site_packages(sshd) -> None:
    """The server runs with -S; dist-versions and missing-modules must still see the host python's
    packages (torch is installed in the test hosts' python) over the same, single server."""
    from importlib.metadata import version

    workdir = remote_tempdir(sshd)
    before = len(_servers(sshd))
    with _session(sshd, workdir) as session:
        versions = session.agent_json("dist-versions", "dist-versions", "torch", "no-such-dist-xyz")
        assert versions == {"torch": version("torch"), "no-such-dist-xyz": None}  # the same python as ours
        missing = session.agent_json("missing-modules", "missing-modules", "torch", "no_such_module_xyz")
        assert missing == ["no_such_module_xyz"]
        assert len(_servers(sshd)) == before + 1  # both went to the one server


def test_a_request_past_its_timeout_is_ended_on_the_host_with_124(sshd, tmp_path) -> None:
    workdir = remote_tempdir(sshd)
    gate = workdir / "go"
    run_dir = f"{workdir}/.thrust/runs/r1"
    with _session(sshd, workdir) as session:
        started = session.agent("launch", "--run-dir", run_dir, "--cwd", str(workdir), "--lock",
                                f"{workdir}/.thrust/locks/launch.lock", "--marker", "m-r1", "--",
                                "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.1; done")
        assert started.ok, started.stderr
        t0 = time.monotonic()
        followed = session.agent("logs", "--run-dir", run_dir, "--follow", timeout=1)  # never ends by itself
        assert followed.exit_code == 124 and followed.timed_out
        assert time.monotonic() - t0 < 10
        status = session.agent_json("status", "status", "--run-dir", run_dir)  # the link still serves
        assert status["state"] == "RUNNING"
        # the run's supervisor is the agent's launch in `ps` (its run dir, its marker), never `serve`: an
        # admin who ends stray servers must not end runs
        import psutil

        marked = []  # (the host's pids are its pid namespace's: found by command line)
        for proc in sshd.processes():
            try:
                argv = proc.cmdline()
            except psutil.Error:  # ended while we looked: the job's loop starts a `sleep` every 0.1 s
                continue
            if "m-r1" in argv:
                marked.append(argv)
        assert marked and all("launch" in argv and "serve" not in argv for argv in marked), marked
        gate.touch()


def test_a_runner_without_links_runs_each_subcommand_as_a_command(tmp_path) -> None:
    host = HostConfig(name="local", workdir=str(tmp_path))
    with HostSession.open(LocalRunner(), host) as session:
        assert session.agent_json("runs", "list", "--runs-dir", str(tmp_path / "runs")) == []
        assert session._link is None


def test_the_server_imports_a_subcommands_module_once_for_every_later_request():
    """A zipapp has no .pyc cache: each request's process would compile its module again (a follow asks
    `status` every 2 s). The server imports it before its first fork; later requests fork with it."""
    import subprocess
    import sys

    probe = ("import sys; from thrust_remote.agent import serve; "
             "before = 'thrust_remote.agent.listing' in sys.modules; serve._preload(['list-files', '--run-dir', 'x']); "
             "serve._preload(['no-such-subcommand']); serve._preload([]); "
             "print(before, 'thrust_remote.agent.listing' in sys.modules, 'thrust_remote.agent.venv' in sys.modules)")
    out = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    assert out.stdout.split() == ["False", "True", "False"]  # that one module, not every one


# `agent serve` as a host that answers outside its protocol: the wrapper is the host's `python:`, and runs
# the real python for everything but the first `serve` it starts (a later server is the real one)
BAD_SERVE = '''import sys
print("THRUST-AGENT ready", flush=True)
for line in sys.stdin:
    print({answer!r}, flush=True)
'''


def _python_answering(tmp_dir, answer: str, real: str) -> str:
    server = tmp_dir / "bad_serve.py"
    server.write_text(BAD_SERVE.format(answer=answer))
    wrapper = tmp_dir / "python"
    wrapper.write_text(f'#!/bin/sh\nfor a in "$@"; do last="$a"; done\n'
                       f'if [ "$last" = serve ] && [ ! -e {tmp_dir}/served ]; then\n'
                       f'  touch {tmp_dir}/served; exec {real} {server}\nfi\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.mark.parametrize(("answer", "what"), [
    ("THRUST-AGENT {bad json", "an answer that is not JSON"),
    ('THRUST-AGENT {"id": "one", "exit": 0, "out": "", "err": ""}', "an answer whose request id is not a whole number"),
    ('THRUST-AGENT {"id": 1, "exit": 0, "out": "%%%", "err": ""}', "an answer whose out is not base64"),
])
def test_a_malformed_answer_on_the_agent_link_fails_its_requests_at_once_naming_the_host(sshd, answer, what):
    from thrust_remote.core.errors import ExitCode, ThrustError

    workdir = remote_tempdir(sshd)
    host = sshd.host_config(workdir=str(workdir), python=_python_answering(workdir, answer, sshd.host_config().python))
    died: list[threading.ExceptHookArgs] = []
    previous, threading.excepthook = threading.excepthook, died.append
    try:
        with HostSession.open(SSHRunner.from_host(host), host) as session:
            runs = f"{workdir}/.thrust/runs"
            started = time.monotonic()
            with pytest.raises(ThrustError) as info:
                session.agent_json("runs", "list", "--runs-dir", runs, timeout=60)
            assert time.monotonic() - started < 15  # not the request's 60 s (+15 s grace), then a 124
            assert info.value.exit_code == ExitCode.UNAVAILABLE
            assert info.value.message.startswith("sandbox: its agent answered a malformed line") and \
                what in info.value.message, info.value.message
            assert session.agent_json("runs", "list", "--runs-dir", runs) == []  # a new server, the real one
    finally:
        threading.excepthook = previous
    assert died == []  # the link's reader thread ended on its own terms, no traceback on the terminal
