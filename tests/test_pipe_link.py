"""The transport seam (issue 52, item 4): the agent link and the streamed transfers run over a byte pipe
(host/pipe.py) that any way of reaching a host provides, not over paramiko. Here the pipe is a local
subprocess's stdin and stdout (LocalRunner.open_pipe), the processes are the real `agent serve` and
`xfer serve`, and the failures are real ones (a server stopped with SIGSTOP, killed, or answering a
malformed line); nothing of SSH is in play. And one table (host/transports.py) maps a host's kind to how
it is reached."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from thrust_remote.core.config import HostConfig
from thrust_remote.core.config.model import HOST_KINDS, local_host
from thrust_remote.core.errors import ConnectionLostError, ExitCode, HostAnswerError
from thrust_remote.host.agentlink import AgentLink
from thrust_remote.host.pipe import ProcessPipe
from thrust_remote.host.runner import LocalRunner, StalledError
from thrust_remote.host.session import HostSession
from thrust_remote.host.streams import StreamTransfer, Transfer
from thrust_remote.host.transports import TRANSPORTS, open_runner, transport_of

SERVE = [sys.executable, "-m", "thrust_remote.agent", "serve"]


def _server(link: AgentLink) -> int:
    assert isinstance(link.pipe, ProcessPipe)  # a local process, nothing of paramiko
    return link.pipe.proc.pid


def test_the_agent_link_answers_requests_over_a_local_process_pipe(tmp_path: Path) -> None:
    link = AgentLink.open(LocalRunner(), SERVE)
    try:
        runs = tmp_path / "runs"
        answers: list[tuple[int, list]] = []

        def ask() -> None:
            result = link.call(["list", "--runs-dir", str(runs)], stdin=None, timeout=30)
            answers.append((result.exit_code, json.loads(result.stdout)))

        threads = [threading.Thread(target=ask) for _ in range(4)]  # one process, answers by id
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert answers == [(0, [])] * 4
        usage = link.call(["no-such-subcommand"], stdin=None, timeout=30)
        assert usage.exit_code == 2 and usage.stderr.startswith("usage: agent")  # a command's exit and stderr, as is
        assert link.ping()
    finally:
        link.close()
    proc = link.pipe.proc  # type: ignore[attr-defined]
    assert proc.wait(timeout=15) == 0  # its stdin ended: serve exits


def test_a_stopped_local_server_is_a_stall_and_only_that_link_is_given_up(tmp_path: Path) -> None:
    link = AgentLink.open(LocalRunner(liveness_timeout=1.0), SERVE)
    pid = _server(link)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(StalledError) as info:
            link.call(["list", "--runs-dir", str(tmp_path)], stdin=None, timeout=60)
        assert info.value.exit_code == ExitCode.CONNECTION_LOST
        assert "the agent on local stopped answering" in info.value.message
        assert link.dead and link.pipe.ended()
    finally:
        os.kill(pid, signal.SIGCONT)
    assert link.pipe.proc.wait(timeout=15) == 0  # type: ignore[attr-defined]  # its pipe was closed: it exits


def test_a_killed_local_server_is_a_lost_link(tmp_path: Path) -> None:
    link = AgentLink.open(LocalRunner(liveness_timeout=1.0), SERVE)
    os.kill(_server(link), signal.SIGKILL)
    link.pipe.proc.wait(timeout=15)  # type: ignore[attr-defined]
    with pytest.raises(ConnectionLostError) as info:
        link.call(["list", "--runs-dir", str(tmp_path)], stdin=None, timeout=60)
    assert info.value.exit_code == ExitCode.CONNECTION_LOST and not isinstance(info.value, StalledError)
    assert info.value.message.startswith("connection to local lost while running agent list")


BROKEN_SERVER = """
import sys
sys.stdout.write("rc-file noise\\nTHRUST-AGENT ready\\n"); sys.stdout.flush()
sys.stdin.readline()
sys.stdout.write('THRUST-AGENT {"id": 1, "exit": "zero"}\\n'); sys.stdout.flush()
sys.stdin.read()
"""


def test_a_malformed_answer_fails_the_request_and_closes_the_link() -> None:
    link = AgentLink.open(LocalRunner(), [sys.executable, "-c", BROKEN_SERVER])
    with pytest.raises(HostAnswerError) as info:
        link.call(["status"], stdin=None, timeout=30)
    assert "its agent answered a malformed line on the agent link" in info.value.message
    assert link.dead and link.pipe.proc.wait(timeout=15) == 0  # type: ignore[attr-defined]


@dataclass
class _XferHere(LocalRunner):
    """This machine as the streamed transfers' Link: its pipes (PipeHost) and a python to run the helper."""

    python: str = sys.executable
    liveness_timeout: float = 5.0  # type: ignore[assignment]

    def connected(self, wait: bool = False) -> bool:
        return True


class _NoFallback(Transfer):
    def put(self, src: Path, target: str, identity: object = None) -> str:
        raise AssertionError("the helper runs here: no fallback")

    def get(self, source: str, dst: Path, identity: object = None) -> str:
        raise AssertionError("the helper runs here: no fallback")


def test_the_streamed_transfers_run_over_a_local_process_pipe(tmp_path: Path) -> None:
    transfer = StreamTransfer(_XferHere(), fallback=_NoFallback())
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20) + b"tail")
    want = hashlib.sha256(src.read_bytes()).hexdigest()
    host = tmp_path / "host"
    host.mkdir()
    assert transfer.put(src, str(host / "up.bin")) == want
    assert transfer.put_many([(src, str(host / f"many{i}"), None) for i in range(3)]) == [want] * 3
    got = tmp_path / "got"
    got.mkdir()
    outcomes = list(transfer.get_many([(str(host / f"many{i}"), got / f"m{i}", None) for i in range(3)],
                                      threading.Event()))
    assert outcomes == [want] * 3 and (got / "m2").read_bytes() == src.read_bytes()
    assert len(transfer._idle) == 1  # one helper process, reused for all of it
    for helper in transfer._idle:
        helper.chan.close()


def test_every_kind_of_host_has_one_transport_and_it_opens_the_hosts_runner() -> None:
    assert set(TRANSPORTS) == set(HOST_KINDS)
    assert isinstance(open_runner(local_host()), LocalRunner)
    ssh = HostConfig(name="gpu", address="me@gpu.invalid")
    runner = open_runner(ssh)  # not connected: an SSHRunner connects on first use
    with contextlib.closing(runner):
        assert type(runner).__name__ == "SSHRunner" and runner.name == "gpu"
    assert transport_of(ssh).agent_link and not transport_of(local_host()).agent_link


def test_a_local_session_runs_each_subcommand_as_a_command_of_its_own(tmp_path: Path) -> None:
    """The local transport's row says no link: the session asks the table, not the runner's methods
    (LocalRunner opens pipes too)."""
    with HostSession.open(LocalRunner(), HostConfig(name="local", workdir=str(tmp_path))) as session:
        assert session.agent_json("runs", "list", "--runs-dir", str(tmp_path / "runs")) == []
        assert session._link is None
