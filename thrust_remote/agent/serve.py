"""`agent serve`: one agent process per connection, answering requests over one channel.

Every remote action used to be its own remote command: a login shell that reads the account's rc
files, then a new python. The laptop now starts this once per session (host/agentlink.py) and sends
each JSON-answering subcommand (status, list, launch, stop, git-state, list-files...) as a request;
the cost of a request is a fork of a process that has already started and imported what it needs.

Protocol, one line each way per message (docs/architecture.md, "The host agent"):

    -> MAGIC ready                                      once, first (an rc file may print before it)
    <- {"id": N, "argv": [SUBCOMMAND, ...], "stdin": B64, "timeout": S | null}
    -> MAGIC {"id": N, "exit": CODE, "out": B64, "err": B64}
    <- {"id": N, "cancel": true}                         kill that request (the laptop gave up on it)
    <- {"id": N, "ping": true}                           answered at once, exit 0, by this loop itself:
                                                         the laptop asks after a silent stretch, and no
                                                         answer means this process is stopped or frozen

Each request runs in a forked child in a process group of its own, its stdin/stdout/stderr being
temporary files: the subcommand sees exactly what it would as a command of its own (a subprocess it
starts writes to the same files). Requests run at once and are answered as they end, each with its id.
A request past its `timeout` is killed (TERM, KILL 5 s later) and answered with exit 124, as the
host's timeout(1) did for a command of its own. stdin's end (the link closed): a request that only
served the laptop (ENDS_WITH_LINK: a venv's pip, a listing, a poll) is ended as a cancel is; one that
changes the host's state (`stop`, `launch`, `tree-add`...) is left to finish (a `stop` half done is not
cut by the laptop going away), its deadline still enforced, its answer unsent; serve exits when none is
left. Standard library only, Python 3.8+, like the rest of the agent.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import io
import json
import os
import select
import signal
import sys
import tempfile
import time
import traceback

from .protocol import SERVE_CANCEL, SERVE_PING, SITE_COMMANDS
from .scheduled import LINK_BOUND_CHECKS

MAGIC = "THRUST-AGENT"
# Requests that run as the agent's own command (exec'd in the request's process): `launch` leaves a run's
# supervisor behind, which `ps` must show as that (its run dir and marker), never as this server.
EXEC_COMMANDS = frozenset({"launch"})
KILL_GRACE_S = 5.0
# Requests worth nothing once their laptop is gone: they read for it, or build what its train waits for
# (a venv: the next train builds it again, under its own deadline). Cut at the link's end, not left to
# run for up to their hour-long timeouts with nobody to answer.
ENDS_WITH_LINK = frozenset({"venv", "setup-keep", "list-files", "scalars", "poll", "preflight",
                            "missing-modules", "dist-versions", "tree-size", "git-state",
                            "logs", "status", "list"}) | LINK_BOUND_CHECKS  # a cluster's login node's doctor


class _Request:
    def __init__(self, rid: object, pid: int, out: io.BufferedRandom, err: io.BufferedRandom,
                 timeout: float | None, command: str = "") -> None:
        self.rid, self.pid, self.out, self.err, self.command = rid, pid, out, err, command
        self.deadline = time.monotonic() + timeout if timeout else None
        self.killed_at: float | None = None
        self.timed_out = False


def _child(argv: list, stdin: bytes, out: io.BufferedRandom, err: io.BufferedRandom) -> None:
    """In the forked child: the request's files as fds 0-2, then the subcommand; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setpgid(0, 0)
        with tempfile.TemporaryFile() as data:
            data.write(stdin)
            data.seek(0)
            os.dup2(data.fileno(), 0)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
        sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)))
        sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), line_buffering=True)
        if argv and argv[0] in EXEC_COMMANDS and sys.argv and sys.argv[0]:
            with contextlib.suppress(OSError):  # else it runs here, as every other request does
                os.execv(sys.executable, [sys.executable, "-S", sys.argv[0], *[str(a) for a in argv]])
        if argv and argv[0] in SITE_COMMANDS:  # serve runs with -S: these read installed packages
            import site

            site.main()  # as a start without -S would: site-packages and .pth files, read now
            importlib.invalidate_caches()
        from .__main__ import main as dispatch

        code = int(dispatch([str(a) for a in argv]) or 0)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a traceback on the request's stderr, as a command would print
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # the request's files: nothing left to tell
                stream.flush()
        os._exit(code)


def _answer(write, req: _Request, code: int) -> None:
    payload = {"id": req.rid, "exit": code}
    for name, fh in (("out", req.out), ("err", req.err)):
        fh.seek(0)
        payload[name] = base64.b64encode(fh.read()).decode()
        fh.close()
    write(f"{MAGIC} {json.dumps(payload)}\n")


def _preload(argv: list) -> None:
    """The subcommand's module imported here, in the server, before the fork: this request's process and
    every later one for it start with it imported. An agent zipapp has no .pyc cache, so each import
    compiles the module's source: a follow's status poll, every 2 s for hours, would compile
    supervisor.py each time. Imported on first use, not all at start: a server lives one command."""
    from .__main__ import COMMANDS

    entry = COMMANDS.get(str(argv[0])) if argv else None
    if entry is not None and entry[0] != "serve":
        with contextlib.suppress(Exception):  # its own process will hit (and report) the same error
            importlib.import_module(f".{entry[0]}", __package__)


def _start(message: dict) -> _Request:
    # closed once answered (_answer): they outlive this function, held by the request
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    stdin = base64.b64decode(message.get("stdin") or "")
    _preload(list(message.get("argv") or []))
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        _child(list(message.get("argv") or []), stdin, out, err)
    timeout = message.get("timeout")
    argv = list(message.get("argv") or [])
    return _Request(message.get("id"), pid, out, err, float(timeout) if timeout else None,
                    str(argv[0]) if argv else "")


def _signal(req: _Request, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(req.pid, sig)


def _reap(running: dict, write) -> None:
    """Answer the requests that ended; time out the ones past their deadline."""
    now = time.monotonic()
    for pid, req in list(running.items()):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            del running[pid]
            code = 124 if req.timed_out else (os.WEXITSTATUS(status) if os.WIFEXITED(status)
                                               else 128 + os.WTERMSIG(status))
            _answer(write, req, code)
        elif req.deadline is not None and now > req.deadline and req.killed_at is None:
            req.timed_out, req.killed_at = True, now
            _signal(req, signal.SIGTERM)
        elif req.killed_at is not None and now > req.killed_at + KILL_GRACE_S:
            _signal(req, signal.SIGKILL)


def _handle(line: bytes, running: dict, write) -> None:
    message = json.loads(line.decode("utf-8"))
    if message.get(SERVE_PING):  # from this loop, never a fork: it proves this very process is running
        write(f"{MAGIC} {json.dumps({'id': message.get('id'), 'exit': 0, 'out': '', 'err': ''})}\n")
        return
    if message.get(SERVE_CANCEL):
        for req in running.values():
            if req.rid == message.get("id"):
                _cancel(req)
        return
    req = _start(message)
    running[req.pid] = req


def _cancel(req: _Request) -> None:
    req.timed_out, req.killed_at = True, time.monotonic()
    _signal(req, signal.SIGTERM)


def _link_closed(running: dict) -> None:
    """Nobody to answer any more: the requests that only served the laptop end now (ENDS_WITH_LINK)."""
    for req in running.values():
        if req.command in ENDS_WITH_LINK and req.killed_at is None:
            _cancel(req)


def _wait_s(running: dict) -> float | None:
    """Until the next deadline or kill among the running requests (None: only input or an end wakes us)."""
    times = [r.deadline for r in running.values() if r.deadline is not None and r.killed_at is None]
    times += [r.killed_at + KILL_GRACE_S for r in running.values() if r.killed_at is not None]
    return max(0.0, min(times) - time.monotonic()) + 0.01 if times else None


def main(argv: list | None = None) -> int:
    out = sys.stdout

    closed = False

    def write(text: str) -> None:
        if closed:
            return  # the link is gone: the answer has nobody to go to
        with contextlib.suppress(OSError):
            out.write(text)
            out.flush()

    # a child's end wakes the select at once (SIGCHLD through the wakeup pipe): no polling delay
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    write(f"{MAGIC} ready\n")
    running: dict = {}
    pending = b""
    while not closed or running:
        try:
            ready, _, _ = select.select([wake_r] if closed else [0, wake_r], [], [], _wait_s(running))
        except InterruptedError:  # pragma: no cover - 3.5+ retries select itself
            ready = []
        if wake_r in ready:
            os.read(wake_r, 4096)
        if 0 in ready:
            chunk = os.read(0, 1 << 16)
            if not chunk:  # the link closed: the laptop's requests end, the host's finish under their deadlines
                closed = True
                _link_closed(running)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    _handle(line, running, write)
        _reap(running, write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
