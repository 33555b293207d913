"""SSHRunner: the Runner over one SSH connection, opened lazily and reused for every command and transfer.

It composes the parts of this package: `connect` (host-key policy, error mapping), the command loop
shared with LocalRunner (`runner.drive` over a `ChannelProcess`), and the byte pipes (an exec channel as
a `ChannelPipe`, host/pipe.py's PipeHost) that carry the agent link and the streamed transfers
(host/agentlink.py, host/streams.py; SFTP when the host cannot run the helper).

Liveness: keepalive alone does not notice a blackholed link, so while a command is silent the runner
asks the server for a reply (`keepalive@openssh.com`) and gives up after a deadline.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import paramiko
from fabric import Connection
from paramiko.ssh_exception import SSHException

from thrust_remote.core.config import CONFIG_NAME, HostConfig
from thrust_remote.core.errors import ConnectionLostError, TransferError, UsageError
from thrust_remote.core.names import Address, parse_address
from thrust_remote.host.runner import (
    BytesCallback,
    FileChangedError,
    FileId,
    FileOps,
    GetItem,
    PutItem,
    RunResult,
    StreamCallback,
    check_argv,
    drive,
    expand_home,
    put_items,
)
from thrust_remote.host.ssh.command import ChannelProcess, build_remote_command, with_env
from thrust_remote.host.ssh.connect import Target, connect
from thrust_remote.host.ssh.pipe import ChannelPipe
from thrust_remote.host.ssh.transfer import LINK_ERRORS, SftpTransfer
from thrust_remote.host.streams import StreamTransfer

WATCH_OVER_S = 60.0  # a command given a longer timeout (or none, its output followed) is a long one
EXITED_WAIT_S = 2.0  # how long a channel closed under a write may take to tell its exit status


def watched(timeout: float | None, stdin: bytes | None, stream: StreamCallback | None,
            on_bytes: BytesCallback | None) -> bool:
    """Whether a command gets envexec's watch, which ends it on the host when its channel is gone (a
    Ctrl-C, a laptop killed or cut off): a long command the laptop waits for, i.e. one whose output is
    followed (a `setup:`, `exec`, a build, a venv's pip) or given a long timeout. Short commands (a
    read, a probe) go without: the watch costs a python start on the host. A command fed stdin keeps
    the plain form: the channel's stdin is the watch's."""
    if stdin:
        return False
    return stream is not None or on_bytes is not None or (timeout is not None and timeout >= WATCH_OVER_S)


class SSHRunner(FileOps):
    """Runner over one SSH connection, opened lazily and reused for every command and transfer."""

    def __init__(
        self,
        name: str,
        address: Address,
        *,
        identity: str | None = None,
        known_hosts: str = "~/.ssh/known_hosts",
        host_key_policy: str = "strict",
        python: str = "python3",
        connect_timeout: float = 10.0,
        liveness_timeout: float = 10.0,
        login: bool = False,
        config_file: str = CONFIG_NAME,
    ) -> None:
        self.target = Target(
            name=name,
            address=address,
            identity=os.path.expanduser(identity) if identity else None,
            known_hosts=Path(os.path.expanduser(known_hosts)),
            # the default path stands for "whatever ssh uses here": ~/.ssh/config may name another
            known_hosts_default=known_hosts == HostConfig.known_hosts,
            host_key_policy=host_key_policy,
            connect_timeout=connect_timeout,
            config_file=config_file,
        )
        self.name = name
        self.address = address
        self._python = python
        self.connect_timeout = connect_timeout
        self.login = login  # every command in the host's login environment (build_remote_command)
        # a silent command is probed after this many seconds, and declared lost after as many more
        self.liveness_timeout = liveness_timeout
        self._conn: Connection | None = None
        self._home: str | None = None
        self._lock = threading.Lock()
        self._sftp = SftpTransfer(self)
        self._transfer = StreamTransfer(self, fallback=self._sftp)

    @classmethod
    def from_host(cls, host: HostConfig) -> SSHRunner:
        assert host.address is not None
        try:
            address = parse_address(host.address)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return cls(
            host.name,
            address,
            identity=host.identity,
            known_hosts=host.known_hosts,
            host_key_policy=host.host_key_policy,
            python=host.python,
            connect_timeout=host.connect_timeout,
            login=bool(host.slurm and host.slurm.login_shell),
            config_file=host.config_path or CONFIG_NAME,
        )

    @property
    def python(self) -> str:
        """The configured python as an argv[0] (the xfer helper's): `~/...` is the host's home, since a
        quoted argument is never expanded by the remote shell."""
        return self._path(self._python)

    # ------------------------------------------------------------------ connection

    def connection(self) -> Connection:
        with self._lock:
            if self._conn is None or not self._conn.is_connected:
                self._conn = connect(self.target)
                self._sftp.reset()
            return self._conn

    def transport(self) -> paramiko.Transport:
        return self.connection().transport

    def connected(self, wait: bool = False) -> bool:
        """A connection is open now (nothing is opened to find out); `wait`: once a connect under way in
        another thread has ended."""
        if wait:
            with self._lock:
                pass
        conn = self._conn
        return conn is not None and conn.is_connected

    def alive(self, timeout: float | None = None) -> bool:
        """Ask the server for a reply; False if none comes before the deadline (a dead link)."""
        conn = self._conn
        if conn is None or not conn.is_connected:
            return False
        transport = conn.transport
        done = threading.Event()

        def ask() -> None:
            try:
                transport.global_request("keepalive@openssh.com", wait=True)
            except Exception:  # noqa: BLE001 - any failure here means "no answer"
                return
            done.set()

        threading.Thread(target=ask, daemon=True).start()
        return done.wait(self.liveness_timeout if timeout is None else timeout) and transport.is_active()

    def open_channel(self, command: str, *, reconnect: bool = True) -> paramiko.Channel:
        """A session channel running `command`. A cached connection can look alive for a moment after
        the link died (paramiko has not read the EOF yet); nothing has started then, so one retry on
        a fresh connection is always safe. `reconnect=False` (a background warm): on the connection
        open now or not at all, and a failure drops nothing (another thread may be using it)."""
        if not reconnect:
            conn = self._conn
            if conn is None or not conn.is_connected:
                raise EOFError("no connection open")
            chan = conn.transport.open_session(timeout=self.connect_timeout)
            chan.exec_command(command)
            return chan
        for attempt in (1, 2):
            transport = self.transport()
            try:
                chan = transport.open_session(timeout=self.connect_timeout)
                chan.exec_command(command)
            except LINK_ERRORS:
                self.drop()
                if attempt == 2:
                    raise
                continue
            return chan
        raise AssertionError("unreachable")

    def carrier(self) -> paramiko.Transport:
        """PipeHost.carrier: this connection's transport (connected now if it is not)."""
        return self.transport()

    def open_pipe(self, argv: Sequence[str], *, stderr_too: bool = False, reconnect: bool = True) -> ChannelPipe:
        """PipeHost.open_pipe: argv on an exec channel of this connection (open_channel), paramiko's errors
        as the pipe's (ConnectionError)."""
        try:
            chan = self.open_channel(build_remote_command(list(argv), login=self.login), reconnect=reconnect)
            if stderr_too:
                chan.set_combine_stderr(True)  # what came on stderr so far moves over too
        except SSHException as exc:
            raise ConnectionError(str(exc)) from None
        return ChannelPipe(chan)

    def drop(self) -> None:
        """Forget the connection (and what lived on it); the next operation opens a fresh one."""
        conn, self._conn = self._conn, None
        self._sftp.reset()
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a dead connection may raise anything
                conn.close()

    def close(self) -> None:
        self.drop()

    # ------------------------------------------------------------------ commands

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stream: StreamCallback | None = None,
        stdin: bytes | None = None,
        on_bytes: BytesCallback | None = None,
    ) -> RunResult:
        args = check_argv(argv)
        watch = watched(timeout, stdin, stream, on_bytes)
        remote_argv, stdin, wrapper = with_env(self.python, args, env, stdin, watch=watch)
        command = build_remote_command(remote_argv, cwd, timeout, wrapper=wrapper, login=self.login)
        started = time.monotonic()
        process = ChannelProcess(self._start(command, stdin, keep_open=watch), self.alive, self.drop)
        return drive(process, args, name=self.name, started=started, timeout=timeout, stream=stream,
                     on_bytes=on_bytes, liveness_timeout=self.liveness_timeout)

    def _start(self, command: str, stdin: bytes | None, *, keep_open: bool = False) -> paramiko.Channel:
        """The command's channel, `stdin` sent; then EOF, unless `keep_open` (a watched command: its
        watch on the host takes EOF for "the channel is gone")."""
        chan = None
        try:
            chan = self.open_channel(command)
            if stdin:
                chan.sendall(stdin)
            if not keep_open:
                chan.shutdown_write()
        except LINK_ERRORS as exc:
            # a command that ended before it read its stdin (a `python:` that is missing: 127 at once)
            # closes its channel under our write: its exit status is the answer, not a lost link
            if chan is not None and chan.status_event.wait(EXITED_WAIT_S):
                return chan
            self.drop()
            raise ConnectionLostError(
                f"connection to {self.name} lost before the command started: {exc}",
                "check the link and run the command again",
            ) from None
        return chan

    # ------------------------------------------------------------------ files

    def sftp(self) -> paramiko.SFTPClient:
        return self._sftp.client()

    def home(self) -> str:
        if self._home is None:
            self._home = self._sftp.call(lambda sftp: sftp.normalize("."))
        return self._home

    def _path(self, path: str) -> str:
        return expand_home(path, self.home()) if path.startswith("~") else path

    def exists(self, path: str) -> bool:
        target = self._path(path)
        try:
            self._sftp.call(lambda sftp: sftp.stat(target))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise TransferError(f"cannot stat {path} on {self.name}: {exc}") from None
        return True

    def remote_sha256(self, path: str) -> str:
        """The sha256 of a file on the host (`xfer hash`, or sha256sum where python is missing)."""
        return self._sftp.remote_sha256(path)

    def put(self, local: str | os.PathLike[str], remote: str, *, identity: FileId | None = None) -> str:
        src = Path(local)
        if identity is None and not src.is_file():  # one with an identity is judged as it is opened
            raise TransferError(f"{src}: no such file")
        return self._transfer.put(src, self._path(remote), identity)

    def put_many(self, items: Sequence[PutItem]) -> list[str]:
        """Runner.put_many: streamed on one transfer helper; an item with an identity is judged as it is
        opened (open_to_send), never through a link followed here first."""
        triples = [(src, self._path(remote), identity) for src, remote, identity in put_items(items)]
        for src, _, identity in triples:
            if identity is None and not src.is_file():
                raise TransferError(f"{src}: no such file")
        return self._transfer.put_many(triples)

    def get(self, remote: str, local: str | os.PathLike[str], *, identity: FileId | None = None) -> str:
        source = self._path(remote)
        dst = Path(local)
        dst.parent.mkdir(parents=True, exist_ok=True)
        return self._transfer.get(source, dst, identity)

    def warm_transfers(self, count: int) -> None:
        self._transfer.warm(count)

    def get_many(self, items: Sequence[GetItem], stop: threading.Event) -> Iterator[str | FileChangedError]:
        """Runner.get_many: pipelined on one transfer helper (the destinations' parents must exist)."""
        return self._transfer.get_many([(self._path(src), dst, ident) for src, dst, ident in items], stop)
