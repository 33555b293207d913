"""A local port forward through the runner's SSH connection, and a remote command tied to a pty.

`LocalForward` listens on 127.0.0.1:PORT here; each connection it accepts becomes a `direct-tcpip`
channel on the existing transport to (HOST, PORT) as the server sees it — what `ssh -L` does, with no
second login and no ssh binary (docs/architecture.md, "TensorBoard"). `open_pty_command` starts a
command whose lifetime is the channel's: closing the channel hangs up its pty, so a server started
for the user (a TensorBoard on the host) does not outlive the command that started it.
"""

from __future__ import annotations

import contextlib
import queue
import select
import socket
import threading
from collections.abc import Callable, Sequence

import paramiko

from thrust_remote.core.errors import ThrustError, UsageError
from thrust_remote.host.ssh.command import build_remote_command
from thrust_remote.host.ssh.transfer import LINK_ERRORS

BUFFER = 1 << 16


def _pump(client: socket.socket, chan: paramiko.Channel) -> None:
    """Copy bytes both ways until either side closes."""
    try:
        while True:
            ready, _, _ = select.select([client, chan], [], [], 1.0)
            if client in ready:
                data = client.recv(BUFFER)
                if not data:
                    break
                chan.sendall(data)
            if chan in ready:
                data = chan.recv(BUFFER)
                if not data:
                    break
                client.sendall(data)
    except (OSError, ValueError, *LINK_ERRORS):
        pass  # either end went away (ValueError: a socket closed under select): the connection is over
    finally:
        with contextlib.suppress(Exception):
            chan.close()
        with contextlib.suppress(OSError):
            client.close()


class LocalForward:
    """127.0.0.1:`local_port` here -> `remote` (host, port) as seen from the SSH server."""

    def __init__(self, transport: Callable[[], paramiko.Transport], remote: tuple[str, int],
                 local_port: int = 0, bind: str = "127.0.0.1") -> None:
        self.transport = transport
        self.remote = remote
        self.errors: list[str] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((bind, local_port))
        except OSError as exc:
            self._sock.close()
            raise UsageError(f"cannot listen on {bind}:{local_port}: {exc.strerror}",
                             "pick another port with --port") from None
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._open: list[tuple[socket.socket, paramiko.Channel]] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> LocalForward:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, peer = self._sock.accept()
            except OSError:
                return  # closed
            try:
                chan = self.transport().open_channel("direct-tcpip", self.remote, peer, timeout=15)
            except (*LINK_ERRORS, ThrustError) as exc:
                self.errors.append(f"{self.remote[0]}:{self.remote[1]}: {exc}")
                client.close()
                continue
            self._open.append((client, chan))
            threading.Thread(target=_pump, args=(client, chan), daemon=True).start()

    def close(self) -> None:
        """Stop listening and end the connections under way: nothing is left writing to the transport
        when the caller closes it next."""
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.close()
        for client, chan in self._open:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)  # its pump sees the end and closes both itself
            with contextlib.suppress(*LINK_ERRORS):
                chan.close()


class ChannelReader:
    """Every read of `chan` done by one thread of its own, handed over through a queue.

    Why a thread: a Ctrl-C raises KeyboardInterrupt in the main thread between any two bytecodes. Inside
    paramiko's `recv` it can land halfway through the window-adjust packet that recv sends, which
    corrupts the encrypted stream: the server drops the connection, paramiko's thread logs a broken
    pipe and the next send raises EOFError. With the reads here, the main thread is only ever waiting
    on this queue when the user presses Ctrl-C."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self._chan = chan
        self._queue: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            while data := self._chan.recv(BUFFER):
                self._queue.put(data)
        except LINK_ERRORS:
            pass  # the link went away: the command's output has ended for us
        finally:
            self._queue.put(None)

    def read(self, wait: float) -> bytes | None:
        """What arrived within `wait` seconds (b"" when nothing did); None once the output has ended."""
        try:
            data = self._queue.get(timeout=wait)
        except queue.Empty:
            return b""
        if data is None:
            self._queue.put(None)  # ended stays ended for the next read
        return data


def hang_up(chan: paramiko.Channel) -> None:
    """Ctrl-C on the command's pty, then close the channel (which hangs the pty up). A link that is
    already gone has hung it up by itself: nothing to report then."""
    with contextlib.suppress(*LINK_ERRORS):
        if not chan.closed:
            chan.send(b"\x03")
        chan.close()


def open_pty_command(transport: paramiko.Transport, argv: Sequence[str], *, cwd: str | None = None,
                     timeout: float = 15, login: bool = False) -> paramiko.Channel:
    """`argv` on the host on a channel with a pty (merged output): closing the channel hangs it up. No env:
    a pty echoes its input, so envexec's stdin line would be shown (SSHRunner.run takes env). `login`:
    in the host's login environment, as the runner's every other command (SSHRunner.login: a cluster
    whose modules put python or the job's tools on PATH only there)."""
    chan = transport.open_session(timeout=timeout)
    chan.get_pty(width=200)
    chan.exec_command(build_remote_command(argv, cwd, login=login))
    return chan
