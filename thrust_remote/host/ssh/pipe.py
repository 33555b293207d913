"""The SSH transport's byte pipe: an exec channel as host/pipe.py's `BytePipe`.

paramiko's errors are mapped here, once, to the pipe's (PIPE_ERRORS): SSHException is no OSError, and
neither the agent link nor the stream transfer names a transport's exceptions.
"""

from __future__ import annotations

import paramiko
from paramiko.ssh_exception import SSHException


class ChannelPipe:
    """A BytePipe over one paramiko exec channel: its stdout (stderr too where it was merged) and stdin."""

    def __init__(self, chan: paramiko.Channel) -> None:
        self.chan = chan

    def recv(self, n: int) -> bytes:
        try:
            return self.chan.recv(n)  # socket.timeout is TimeoutError: passed on as is
        except SSHException as exc:  # recv may send a window adjust on a dead link
            raise ConnectionError(str(exc)) from None

    def send(self, data: bytes | memoryview) -> int:
        try:
            return self.chan.send(data)
        except SSHException as exc:
            raise ConnectionError(str(exc)) from None

    def sendall(self, data: bytes) -> None:
        try:
            self.chan.sendall(data)
        except SSHException as exc:
            raise ConnectionError(str(exc)) from None

    def settimeout(self, seconds: float | None) -> None:
        self.chan.settimeout(seconds)

    def ended(self) -> bool:
        return self.chan.closed or self.chan.eof_received

    def carrier(self) -> object:
        return self.chan.get_transport()

    def carrier_alive(self) -> bool:
        transport = self.chan.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        try:
            self.chan.close()
        except SSHException as exc:
            raise ConnectionError(str(exc)) from None
