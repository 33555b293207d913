"""The byte pipe: what the agent link (host/agentlink.py) and the stream transfer (host/streams.py) need
from a way of reaching a host, and nothing of how it is reached (docs/architecture.md, "Runners and the SSH layer").

Both speak a line protocol to one long-lived process on the host (`agent serve`, `xfer serve`) over its
stdin and stdout. So a transport provides two things: a `BytePipe` to such a process (the SSH transport:
an exec channel, host/ssh/pipe.py; the local one: a subprocess's pipes, `ProcessPipe` here), and a
`PipeHost` that starts one, says whether what carries the pipes still answers, and forgets it when it
died. A new transport (a container, `kubectl exec`) writes these two and keeps the fast link: one
process answering many requests, not one process per agent call.

Errors: a pipe raises TimeoutError when nothing came (or could go) within its `settimeout`, and another
of PIPE_ERRORS when what carries it died; each transport maps its own errors to these (paramiko's
SSHException is not an OSError), so the link and the transfer never name a transport's exceptions.
"""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Protocol

# what a pipe (or a PipeHost opening one) raises when its carrier died; TimeoutError is an OSError too:
# where it means "not yet", it is caught before these
PIPE_ERRORS: tuple[type[BaseException], ...] = (EOFError, OSError)


class BytePipe(Protocol):
    """A started process's stdin (send) and stdout (recv), as bytes. One reader and one writer at a time."""

    def recv(self, n: int) -> bytes:
        """Up to n bytes, at least one; b"" at EOF. TimeoutError when none came within `settimeout`."""
        ...

    def send(self, data: bytes | memoryview) -> int:
        """Write some of data (at least one byte); the count. TimeoutError when none could go in time."""
        ...

    def sendall(self, data: bytes) -> None: ...

    def settimeout(self, seconds: float | None) -> None:
        """How long recv and send wait (None: for ever)."""
        ...

    def ended(self) -> bool:
        """Closed here, or the other end said EOF: nothing more will come (not to be reused)."""
        ...

    def carrier(self) -> object:
        """What carries this pipe (an SSH connection): pipes are pooled per carrier, and one on a carrier
        that was dropped is not reused."""
        ...

    def carrier_alive(self) -> bool:
        """The carrier is still up (an SSH transport active); False tells a lost connection from a process
        on the host that ended."""
        ...

    def close(self) -> None:
        """Close the pipe: the process sees its stdin end (`serve` loops end with their link)."""
        ...


class PipeHost(Protocol):
    """What opens pipes to one host (a Runner: SSHRunner, LocalRunner), for the agent link and transfers."""

    name: str
    # a silent pipe is probed after this many seconds (None: never; a local process has no link to lose)
    liveness_timeout: float | None

    def carrier(self) -> object:
        """What carries this host's pipes, opened now if it is not (a host that is down fails here)."""
        ...

    def open_pipe(self, argv: Sequence[str], *, stderr_too: bool = False, reconnect: bool = True) -> BytePipe:
        """argv started on the host with a pipe to its stdin and stdout (`stderr_too`: its stderr merged
        into stdout, from the first byte). `reconnect=False`: on the carrier open now, else PIPE_ERRORS."""
        ...

    def alive(self, timeout: float | None = None) -> bool:
        """The carrier answers now (SSH: a keepalive's reply within the liveness timeout)."""
        ...

    def drop(self) -> None:
        """Forget the carrier (it died): the next pipe opens a fresh one."""
        ...


LOCAL_CARRIER = "local"  # the one carrier of every local process's pipes: this machine


class ProcessPipe:
    """A BytePipe to a subprocess of this machine: its stdin and stdout, read and written without blocking
    past the timeout (select, and a non-blocking stdin so a full pipe sends what fits).

    `close` may come from any thread while the reader waits in recv and a writer in send: a wake pipe in
    both selects makes them raise EOFError first, and stdin is closed only under the writers' lock, so
    no thread ever waits on (or writes to) a descriptor closed under it and perhaps reused."""

    def __init__(self, argv: Sequence[str], *, stderr_too: bool = False, env: dict[str, str] | None = None,
                 cwd: str | None = None) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - an argv, no shell
            list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=cwd,
            stderr=subprocess.STDOUT if stderr_too else subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C at the terminal is the laptop's: the process ends with its stdin
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(self._in, False)
        self._wake_r, self._wake_w = os.pipe()
        self._write_lock = threading.Lock()
        self._timeout: float | None = None
        self._eof = False
        self._closed = False
        # reaped when it ends, so that no zombie is left for the laptop's lifetime
        threading.Thread(target=self.proc.wait, name="pipe-reaper", daemon=True).start()

    def _wait(self, fd: int, write: bool) -> None:
        """Until fd is ready; TimeoutError past the timeout, EOFError once the pipe is closed."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, writable, _ = select.select([self._wake_r] if write else [fd, self._wake_r],
                                                  [fd] if write else [], [], left)
            if self._closed or self._wake_r in readable:
                raise EOFError("pipe closed")
            if readable or writable:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("the process's pipe stayed silent")

    def recv(self, n: int) -> bytes:
        if self._closed:
            raise EOFError("pipe closed")
        self._wait(self._out, write=False)
        data = os.read(self._out, n)
        self._eof = self._eof or not data
        return data

    def send(self, data: bytes | memoryview) -> int:
        with self._write_lock:
            while True:
                if self._closed:
                    raise EOFError("pipe closed")
                self._wait(self._in, write=True)
                try:
                    return os.write(self._in, data)  # BrokenPipeError (an OSError) once the process is gone
                except BlockingIOError:  # writable, but less room than asked: select again
                    continue

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.send(view):]

    def settimeout(self, seconds: float | None) -> None:
        self._timeout = seconds

    def ended(self) -> bool:
        return self._closed or self._eof

    def carrier(self) -> object:
        return LOCAL_CARRIER

    def carrier_alive(self) -> bool:
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")  # the reader and a writer waiting in select raise EOFError
        with self._write_lock, contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]  # the process sees its stdin end

    def __del__(self) -> None:
        for fd in (getattr(self, "_wake_r", -1), getattr(self, "_wake_w", -1)):
            with contextlib.suppress(OSError):
                os.close(fd)
