"""One agent process per session, the laptop's side: `agent serve` on one byte pipe (host/pipe.py: an
SSH exec channel, a local subprocess's pipes), and each JSON-answering agent subcommand sent to it as a
request (thrust_remote/agent/serve.py has the protocol). Nothing here knows how the host is reached.

A subcommand as a command of its own costs a login shell (the account's rc files) and a python start
on the host, every time; over the link it costs a fork there and one round trip. Each request is a
`runner.Process` for `drive`, so timeouts (the host kills at the request's deadline: exit 124),
liveness (a silent link is probed; a dead one is ConnectionLostError, 75) and results are exactly a
command's. Requests from several threads share the link; the answers come back by id.

A keepalive proves the connection, not the server: a server stopped (SIGSTOP) or frozen leaves the
connection answering and every request waiting for its deadline. So a silent request also pings the
server, which answers from its own loop at once; no answer within `liveness_timeout` is StalledError
(75) for every request of the link, and only this server is given up (its pipe closed, the
connection kept): the next request starts a new one.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import threading
import time
from collections.abc import Callable, Sequence

from thrust_remote.agent.protocol import SERVE_CANCEL, SERVE_PING, ServeAnswer, serve_answer
from thrust_remote.agent.serve import MAGIC
from thrust_remote.core.errors import HostAnswerError
from thrust_remote.host.pipe import PIPE_ERRORS, BytePipe, PipeHost
from thrust_remote.host.runner import LinkLost, LinkUnavailable, RunResult, StalledError, drive

CHUNK = 1 << 20
READY_S = 60.0  # how long `agent serve` gets to say it is ready (a first python start on a slow box)


class _Call:
    """One request, as `drive` sees a command: its answer arrives whole (stdout, stderr, exit)."""

    host_enforces_timeout = True  # serve kills it at its deadline and answers 124

    def __init__(self, link: AgentLink, rid: int) -> None:
        self.link, self.rid = link, rid
        self.done = threading.Event()
        self.answer: ServeAnswer | None = None
        self.taken = False
        self.heard = time.monotonic()  # the server's last sign of life for this request (a ping's answer)

    def read(self, wait: float) -> list[tuple[str, bytes]]:
        if not self.done.wait(wait) or self.answer is None or self.taken:
            return []
        self.taken = True
        return [("out", self.answer["out"]), ("err", self.answer["err"])]

    def exit_code(self) -> int | None:
        if self.answer is not None:
            return self.answer["exit"] if self.taken else None
        if self.link.broken is not None:
            raise self.link.broken_error()
        if self.link.stalled is not None:
            raise LinkLost(self.link.stalled_error())
        if self.link.dead:
            raise LinkLost
        return None

    def alive(self) -> bool:
        """The connection answers (else False: lost) and so does the server (else LinkLost: stalled)."""
        link = self.link
        if link.stalled is None:
            if not link.alive():
                return False
            if link.ping():
                self.heard = time.monotonic()
                return True
            if link.dead:
                return False
            link.stall(time.monotonic() - self.heard)  # the connection is there, the server is not listening
        raise LinkLost(link.stalled_error())

    def kill(self) -> None:
        self.link.send({"id": self.rid, SERVE_CANCEL: True})

    def lost(self) -> None:
        self.link.lost()


class AgentLink:
    """`agent serve` on one byte pipe (`open`: started by the host's PipeHost, a Runner)."""

    def __init__(self, pipe: BytePipe, name: str, alive: Callable[[], bool],
                 drop: Callable[[], None], liveness_timeout: float | None) -> None:
        self.pipe, self.name, self._alive, self._drop = pipe, name, alive, drop
        self.liveness_timeout = liveness_timeout
        self.dead = False
        self.broken: str | None = None  # what was malformed in an answer: every request of the link fails with it
        self.stalled: float | None = None  # how long the server left a request unanswered, pings included
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._lock = threading.Lock()  # the calls waiting for an answer
        # the pipe's writers, one at a time; apart from _lock, so that a send waiting on the pipe (an SSH
        # channel's window) never keeps the reader from handing out the answers that would free it
        self._send_lock = threading.Lock()
        self._buffer = self._await_ready()
        threading.Thread(target=self._read, name=f"agent-link-{name}", daemon=True).start()

    @classmethod
    def open(cls, host: PipeHost, argv: Sequence[str]) -> AgentLink:
        """`agent serve` (argv) started on the host; LinkUnavailable when it does not come up (the caller
        runs commands instead)."""
        try:
            # stderr merged from the first byte: rc-file noise and python's complaints alike
            pipe = host.open_pipe(argv, stderr_too=True)
        except PIPE_ERRORS as exc:
            raise LinkUnavailable(str(exc)) from None
        return cls(pipe, host.name, host.alive, host.drop, host.liveness_timeout)

    def _await_ready(self) -> bytes:
        """Read up to `MAGIC ready` (what an rc file printed before it is skipped); StartFailed if the
        pipe ends first (no agent there yet, no such python) or stays silent."""
        said = b""
        self.pipe.settimeout(READY_S)
        try:
            while (at := said.find(f"{MAGIC} ready\n".encode())) < 0:
                chunk = self.pipe.recv(CHUNK)
                if not chunk:
                    raise LinkUnavailable(said.decode("utf-8", "replace"))
                said += chunk
        except (TimeoutError, *PIPE_ERRORS) as exc:
            with contextlib.suppress(*PIPE_ERRORS):
                self.pipe.close()
            raise LinkUnavailable(f"{said.decode('utf-8', 'replace')}{exc}") from None
        self.pipe.settimeout(None)
        return said[at + len(f"{MAGIC} ready\n"):]

    def _read(self) -> None:
        pending = self._buffer
        try:
            while True:
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._deliver(line)
                chunk = self.pipe.recv(CHUNK)
                if not chunk:
                    break
                pending += chunk
        except PIPE_ERRORS:
            pass
        except ValueError as exc:  # a malformed answer: no later answer of this link can be trusted
            self.broken = str(exc)
        except Exception as exc:  # noqa: BLE001 - the reader must never die with requests left waiting
            self.broken = f"an answer this side could not read ({type(exc).__name__}: {exc})"
        self.dead = True
        if self.broken is not None:
            self.close()  # the server ends with its pipe; the next request starts a new one
        with self._lock:
            calls = list(self._calls.values())
        for call in calls:
            call.done.set()

    def _deliver(self, line: bytes) -> None:
        if not line.startswith(f"{MAGIC} {{".encode()):
            return  # not ours (a stray print): answers alone start with MAGIC and a JSON object
        try:
            answer = serve_answer(line[len(MAGIC) + 1:])
        except ValueError as exc:
            raise ValueError(f"{exc}: {line[:80]!r}") from None
        with self._lock:
            call = self._calls.pop(answer["id"], None)
        if call is not None:
            call.answer = answer
            call.done.set()

    def broken_error(self) -> HostAnswerError:
        return HostAnswerError(
            f"{self.name}: its agent answered a malformed line on the agent link: {self.broken}; "
            "the link is closed and the request failed",
            "the host's `python:` (a wrapper?) or an account start-up file prints lines of the agent's "
            "protocol; `THRUST_AGENT_LINK=0` in your environment runs each agent subcommand as a command of its own")

    def send(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        try:
            with self._send_lock:
                self.pipe.sendall(data)
        except PIPE_ERRORS:
            self.dead = True

    def alive(self) -> bool:
        return not self.dead and self._alive()

    def ping(self) -> bool:
        """Whether the server answers a ping (its own loop answers at once) within `liveness_timeout`."""
        if self.dead:
            return False
        rid = next(self._ids)
        call = _Call(self, rid)
        with self._lock:
            self._calls[rid] = call
        self.send({"id": rid, SERVE_PING: True})
        answered = call.done.wait(self.liveness_timeout or READY_S) and call.answer is not None
        with self._lock:
            self._calls.pop(rid, None)
        return answered

    def stall(self, seconds: float) -> None:
        """The server is stopped or frozen: every request of this link fails (StalledError)."""
        if self.stalled is None:
            self.stalled = seconds

    def stalled_error(self) -> StalledError:
        return StalledError(
            f"the agent on {self.name} stopped answering for {self.stalled or 0:.0f} s (its process is stopped or "
            "frozen; the connection itself answers)",
            "the next command starts a new agent there; if this keeps happening, look at the host's "
            "`agent serve` processes (`ps -o pid,stat,args -u $USER`: a T is a stopped one)")

    def lost(self) -> None:
        self.dead = True
        if self.stalled is None:
            self._drop()
        else:
            self.close()  # only this server is stuck: the connection (and what else runs on it) is fine

    def call(self, args: Sequence[str], *, stdin: bytes | None, timeout: float | None) -> RunResult:
        """Run one agent subcommand as a request: a RunResult as its own command would give."""
        rid = next(self._ids)
        call = _Call(self, rid)
        with self._lock:
            self._calls[rid] = call
        self.send({"id": rid, "argv": list(args), "timeout": timeout,
                   "stdin": base64.b64encode(stdin or b"").decode()})
        return drive(call, ["agent", *args], name=self.name, started=time.monotonic(), timeout=timeout,
                     stream=None, on_bytes=None, liveness_timeout=self.liveness_timeout)

    def close(self) -> None:
        self.dead = True
        with contextlib.suppress(*PIPE_ERRORS):
            self.pipe.close()
