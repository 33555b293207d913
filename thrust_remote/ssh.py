"""SSHRunner: the Runner over SSH, on fabric.Connection, with stricter defaults than Fabric's.

- Host keys: known_hosts is loaded and an unknown key is refused (Fabric would AutoAdd it). The
  opt-in `accept-new` policy adds an unknown key once and still refuses a changed one, like
  OpenSSH's StrictHostKeyChecking=accept-new. ProxyJump hops get the same policy.
- Commands: built from an argv with shlex.join, env values inside that argv (`env -- K=V cmd`), so
  nothing the user passes is ever parsed by the remote shell. The command runs under `sh -c '...;
  exit $?'` so a command killed by a signal reports 128+N (paramiko drops `exit-signal`); a
  channel that closes without a status therefore really means the link died (exit 75).
- Liveness: keepalive alone does not notice a blackholed link, so while a command is silent the
  runner asks the server for a reply (`keepalive@openssh.com`) and gives up after a deadline.
- Transfers: `.part` file, sha256 computed while the bytes move and on the other end, rename only
  when both agree. A cut transfer leaves the destination untouched (exit 74).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import select
import shlex
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import paramiko
from fabric import Config as FabricConfig
from fabric import Connection
from paramiko.ssh_exception import (
    AuthenticationException,
    BadHostKeyException,
    NoValidConnectionsError,
    SSHException,
)

from .config import HostConfig
from .errors import (
    AuthError,
    ConfigError,
    ConnectionLostError,
    HostKeyError,
    ThrustError,
    TransferError,
    UnknownHostError,
    UnreachableError,
    UsageError,
)
from .names import Address, parse_address
from .runner import (
    TIMEOUT_EXIT,
    BytesCallback,
    FileOps,
    RunResult,
    StreamCallback,
    _LineSplitter,
    check_argv,
    check_env,
    expand_home,
)

CHUNK = 1 << 20
# Hash a file with the host's python (hashlib ~1.6 GB/s) rather than sha256sum (~0.3 GB/s).
_HASH_SCRIPT = (
    "import hashlib,sys\n"
    "h=hashlib.sha256()\n"
    "f=open(sys.argv[1],'rb')\n"
    "for b in iter(lambda:f.read(1<<20),b''):h.update(b)\n"
    "print(h.hexdigest())\n"
)


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256:... form, so the user can compare it with `ssh-keygen -lf`."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def build_remote_command(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout: float | None = None,
) -> str:
    """The one string sent to the server. Every user value is a separately quoted word."""
    args = check_argv(argv)
    env_items = check_env(env)
    cmd: list[str] = []
    if timeout is not None:
        # the host enforces the limit itself, so a timed-out command does not linger there
        cmd += ["timeout", "-k", "5", f"{max(timeout, 0.001):g}"]
    if env_items:
        cmd += ["env", "--", *(f"{k}={v}" for k, v in env_items.items())]
    elif "=" in args[0]:
        raise UsageError(f"command name {args[0]!r} contains '='")
    cmd += args
    script = shlex.join(cmd)
    if cwd:
        if cwd == "~":
            target = '"$HOME"'
        elif cwd.startswith("~/"):
            target = '"$HOME"/' + shlex.quote(cwd[2:])
        else:
            target = shlex.quote(cwd)
        script = f"cd -- {target} && {script}"
    # `; exit $?` keeps sh as the parent (no exec optimisation), so a signal death becomes 128+N.
    return shlex.join(["sh", "-c", f"{script}; exit $?"])


# paramiko's default cipher is aes128-ctr + hmac-sha2-256; AES-GCM (AEAD, AES-NI) costs less CPU on
# both ends: measured 200 -> 247 MB/s get, 191 -> 234 MB/s put (bench/bench_ssh.py). A server
# without GCM still negotiates one of the others, which stay in the list.
GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _gcm_first_transport(sock, **kwargs) -> paramiko.Transport:  # noqa: ANN001 - paramiko's signature
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    available = tuple(options.ciphers)
    options.ciphers = (*[c for c in GCM_FIRST if c in available], *[c for c in available if c not in GCM_FIRST])
    return transport


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key) -> None:  # noqa: ANN001 - paramiko's signature
        line = f"{hostname} {key.get_name()} {key.get_base64()}"
        raise HostKeyError(
            f"host key for {hostname} is not in {self.known_hosts}: {key.get_name()} {fingerprint(key)}",
            "check the fingerprint with the host's owner (on the host: ssh-keygen -lf "
            "/etc/ssh/ssh_host_*_key.pub), then trust it with:\n"
            f"  echo {shlex.quote(line)} >> {shlex.quote(str(self.known_hosts))}\n"
            "or set `host_key_policy: accept-new` for this host in thrust.yaml",
        )


class _AcceptNew(paramiko.MissingHostKeyPolicy):
    """Add an unknown key once (append to known_hosts); a changed key still fails in paramiko."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client, hostname, key) -> None:  # noqa: ANN001
        client.get_host_keys().add(hostname, key.get_name(), key)
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.known_hosts, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


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
    ) -> None:
        self.name = name
        self.address = address
        self.identity = os.path.expanduser(identity) if identity else None
        self.known_hosts = Path(os.path.expanduser(known_hosts))
        if host_key_policy not in ("strict", "accept-new"):
            raise UsageError(f"host_key_policy must be strict or accept-new, not {host_key_policy!r}")
        self.host_key_policy = host_key_policy
        self.python = python
        self.connect_timeout = connect_timeout
        # a silent command is probed after this many seconds, and declared lost after as many more
        self.liveness_timeout = liveness_timeout
        self._conn: Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._home: str | None = None
        self._lock = threading.Lock()

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
        )

    # ------------------------------------------------------------------ connection

    def _policy(self) -> paramiko.MissingHostKeyPolicy:
        if self.host_key_policy == "accept-new":
            return _AcceptNew(self.known_hosts)
        return _RejectUnknown(self.known_hosts)

    def _secure(self, conn: Connection) -> None:
        """Replace Fabric's auto-add-every-key default: load known_hosts, set our policy (every ProxyJump hop too)."""
        hop: object = conn
        while isinstance(hop, Connection):
            client = hop.client
            if self.known_hosts.is_file():
                client.load_host_keys(str(self.known_hosts))
            client.set_missing_host_key_policy(self._policy())
            hop = hop.gateway

    def connection(self) -> Connection:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return self._conn
            connect_kwargs: dict[str, object] = {"banner_timeout": self.connect_timeout,
                                                 "auth_timeout": self.connect_timeout,
                                                 "transport_factory": _gcm_first_transport}
            if self.identity:
                if not os.path.isfile(self.identity):
                    raise ConfigError(
                        f"hosts.{self.name}.identity: key file {self.identity} does not exist",
                        "point `identity:` at the private key (not the .pub), or remove it to use ~/.ssh/config",
                    )
                # like IdentitiesOnly: the configured key and nothing else, so a refusal is clear
                connect_kwargs.update(key_filename=[self.identity], look_for_keys=False, allow_agent=False)
            conn = Connection(
                host=self.address.host,
                user=self.address.user,
                port=self.address.port,
                config=FabricConfig(),
                connect_timeout=int(max(1, round(self.connect_timeout))),
                connect_kwargs=connect_kwargs,
            )
            self._secure(conn)
            try:
                conn.open()
            except ThrustError:
                conn.close()
                raise
            except BadHostKeyException as exc:
                conn.close()
                name = known_hosts_name(conn.host, conn.port)
                raise HostKeyError(
                    f"host key for {name} CHANGED: the server offers {exc.key.get_name()} "
                    f"{fingerprint(exc.key)}, {self.known_hosts} has {fingerprint(exc.expected_key)}. "
                    "This can be a man-in-the-middle attack; nothing was run.",
                    "if the host was really reinstalled, remove the old key with\n"
                    f"  ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(self.known_hosts))}\n"
                    "and connect again to trust the new one",
                ) from None
            except AuthenticationException as exc:
                conn.close()
                who = f"{conn.user}@{conn.host}:{conn.port}"
                key = f"key {self.identity}" if self.identity else "your keys/agent"
                raise AuthError(
                    f"authentication failed for {who} with {key}: {exc}",
                    f"check that the public key is in ~{conn.user}/.ssh/authorized_keys on the host "
                    "(ssh-copy-id), or set `identity:` for this host",
                ) from None
            except socket.gaierror as exc:
                conn.close()
                raise UnknownHostError(
                    f"cannot resolve host {conn.host!r}: {exc.strerror or exc}",
                    "check the address in thrust.yaml or the HostName in ~/.ssh/config",
                ) from None
            except (NoValidConnectionsError, TimeoutError, ConnectionError, OSError) as exc:
                conn.close()
                raise UnreachableError(
                    f"cannot connect to {conn.host}:{conn.port}: {exc}",
                    "is the host up and sshd listening? try: ssh -v " + shlex.quote(str(self.address)),
                ) from None
            except (SSHException, EOFError) as exc:
                conn.close()
                if self.identity and "private key" in str(exc).lower():
                    raise ConfigError(
                        f"hosts.{self.name}.identity: {self.identity} is not a usable private key: {exc}",
                        "point `identity:` at the private key file (not the .pub)",
                    ) from None
                raise UnreachableError(f"SSH handshake with {conn.host}:{conn.port} failed: {exc}") from None
            transport = conn.transport
            sock = getattr(transport, "sock", None)
            if isinstance(sock, socket.socket):
                # Nagle + delayed ACK cost ~45 ms per command on a reused connection.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport.set_keepalive(15)
            self._conn = conn
            self._sftp = None
            return conn

    def _transport(self) -> paramiko.Transport:
        return self.connection().transport

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
        command = build_remote_command(argv, env, cwd, timeout)
        args = check_argv(argv)
        started = time.monotonic()
        try:
            chan = self._open_channel(command)
            transport = chan.get_transport()
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
        except (SSHException, EOFError, OSError) as exc:
            self._drop()
            raise ConnectionLostError(
                f"connection to {self.name} lost before the command started: {exc}",
                "check the link and run the command again",
            ) from None
        out = _LineSplitter("out", stream, on_bytes)
        err = _LineSplitter("err", stream, on_bytes)
        last_data = time.monotonic()
        lost = False
        try:
            while True:
                select.select([chan], [], [], 0.5)
                got = False
                while chan.recv_ready():
                    out.feed(chan.recv(CHUNK))
                    got = True
                while chan.recv_stderr_ready():
                    err.feed(chan.recv_stderr(CHUNK))
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed or not transport.is_active():
                    lost = not chan.exit_status_ready()
                    break
                now = time.monotonic()
                if got:
                    last_data = now
                elif now - last_data > self.liveness_timeout:
                    if not self.alive():
                        lost = True
                        break
                    last_data = time.monotonic()
                if timeout is not None and now - started > timeout + 15:
                    # the remote `timeout` should have ended it already; do not wait forever
                    chan.close()
                    return RunResult(args, TIMEOUT_EXIT, out.close(), err.close(), now - started, True)
        except (SSHException, EOFError, OSError):
            lost = True
        stdout, stderr = out.close(), err.close()
        # paramiko marks a channel closed without a status as "ready" with -1; our sh wrapper always
        # sends a real status, so -1 means the link died under the command.
        if lost or not chan.exit_status_ready() or chan.exit_status == -1:
            self._drop()
            exc = ConnectionLostError(
                f"connection to {self.name} lost while running {shlex.join(args[:3])}",
                "the command may still be running on the host",
            )
            exc.partial_stdout = stdout  # type: ignore[attr-defined]
            raise exc
        code = chan.recv_exit_status()
        chan.close()
        return RunResult(args, code, stdout, stderr, time.monotonic() - started, code == TIMEOUT_EXIT and
                         timeout is not None)

    def _open_channel(self, command: str) -> paramiko.Channel:
        """A session channel running `command`. A cached connection can look alive for a moment after
        the link died (paramiko has not read the EOF yet); nothing has started then, so one retry on
        a fresh connection is always safe."""
        for attempt in (1, 2):
            transport = self._transport()
            try:
                chan = transport.open_session(timeout=self.connect_timeout)
                chan.exec_command(command)
            except (SSHException, EOFError, OSError):
                self._drop()
                if attempt == 2:
                    raise
                continue
            return chan
        raise AssertionError("unreachable")

    def _drop(self) -> None:
        conn, self._conn, self._sftp = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a dead connection may raise anything
                conn.close()

    # ------------------------------------------------------------------ files

    def sftp(self) -> paramiko.SFTPClient:
        self.connection()
        if self._sftp is None:
            try:
                self._sftp = self._transport().open_sftp_client()
            except (SSHException, EOFError, OSError) as exc:
                raise TransferError(
                    f"cannot open SFTP on {self.name}: {exc}",
                    "the server needs the sftp subsystem (Subsystem sftp internal-sftp in sshd_config)",
                ) from None
        return self._sftp

    def _sftp_call(self, op):  # noqa: ANN001, ANN202 - a small internal helper
        """Run op(sftp); a dead SFTP channel on a live connection is reopened once."""
        try:
            return op(self.sftp())
        except (EOFError, OSError) as exc:
            if isinstance(exc, FileNotFoundError | PermissionError):
                raise
            self._sftp = None
            return op(self.sftp())

    def home(self) -> str:
        if self._home is None:
            self._home = self._sftp_call(lambda sftp: sftp.normalize("."))
        return self._home

    def _path(self, path: str) -> str:
        return expand_home(path, self.home()) if path.startswith("~") else path

    def exists(self, path: str) -> bool:
        target = self._path(path)
        try:
            self._sftp_call(lambda sftp: sftp.stat(target))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise TransferError(f"cannot stat {path} on {self.name}: {exc}") from None
        return True

    def remote_sha256(self, path: str) -> str:
        result = self.run([self.python, "-c", _HASH_SCRIPT, path])
        if result.exit_code == 127:  # no python there: coreutils will do
            result = self.run(["sha256sum", "--", path])
        if not result.ok or not result.stdout.strip():
            raise TransferError(f"cannot hash {path} on {self.name}: {result.stderr.strip()}")
        return result.stdout.split()[0]

    # Transfers go through a helper: one python process on the host per connection, started on the
    # first transfer and reused, reached over an exec channel. It reads or writes the file and hashes
    # the same bytes as they pass; we hash them on our side in the same loop. No second read of the
    # file, no SFTP request per 32 KiB (paramiko's SFTP costs ~2x the CPU), no login shell + python
    # start-up per file (root's ~/.bashrc here costs 90-300 ms a command), and put renames .part on
    # the host only when its hash equals ours, sent after the data. Concurrent transfers each take
    # their own helper. A host without a usable python falls back to SFTP + remote_sha256.
    _MAGIC = "\x1ethrust-xfer-1\x1e"  # starts every line the helper says (an rc file may print first)
    _STREAM_RECV = 1 << 22  # more than the channel window: BufferedPipe hands over all it holds
    # Requests are one line each, paths hex-encoded behind an "x":
    #   get xPATH                  -> ok SIZE | err 2 | err 3 HEXMSG; then SIZE bytes, then SHA256 | short
    #   put xPART xTARGET SIZE MODE -> ok | err 3 HEXMSG; then we send SIZE bytes + our SHA256 (hex),
    #                               -> ok SHA256 (renamed) | mismatch SHA256 | err 3 HEXMSG
    _HELPER_SCRIPT = (
        "import hashlib,os,sys\n"
        "m=MAGIC.encode();i=sys.stdin.buffer;o=sys.stdout.buffer\n"
        "def say(*a):\n"
        " o.write(m+' '.join(a).encode()+b'\\n');o.flush()\n"
        "def get(p):\n"
        " try:f=open(p,'rb')\n"
        " except FileNotFoundError:return say('err','2')\n"
        " except OSError as e:return say('err','3',str(e).encode().hex())\n"
        " with f:\n"
        "  n=os.fstat(f.fileno()).st_size;say('ok',str(n));h=hashlib.sha256()\n"
        "  while n:\n"
        "   b=f.read(min(n,1<<20))\n"
        "   if not b:break\n"
        "   h.update(b);o.write(b);n-=len(b)\n"
        "  s=n\n"
        "  while n:\n"  # the file shrank: keep the stream in step, then say so
        "   k=min(n,1<<20);o.write(bytes(k));n-=k\n"
        "  o.flush();say('short' if s else h.hexdigest())\n"
        "def put(p,t,n,mode):\n"
        " try:\n"
        "  d=os.path.dirname(t)\n"
        "  if d:os.makedirs(d,exist_ok=True)\n"
        "  f=open(p,'wb')\n"
        " except OSError as e:return say('err','3',str(e).encode().hex())\n"
        " say('ok');h=hashlib.sha256();e=''\n"
        " while n:\n"
        "  b=i.read(min(n,1<<20))\n"
        "  if not b:sys.exit(4)\n"  # cut: .part stays, the target is untouched
        "  n-=len(b)\n"
        "  if not e:\n"
        "   try:h.update(b);f.write(b)\n"
        "   except OSError as x:e=str(x)\n"
        " try:f.close();os.chmod(p,mode)\n"
        " except OSError as x:e=e or str(x)\n"
        " x=h.hexdigest();s=i.read(64).decode()\n"
        " if e:return say('err','3',e.encode().hex())\n"
        " if s!=x:return say('mismatch',x)\n"
        " os.replace(p,t);say('ok',x)\n"
        "say('ready')\n"
        "for l in iter(i.readline,b''):\n"
        " w=[x.decode() for x in l.split()]\n"
        " a=[bytes.fromhex(x[1:]).decode('utf-8','surrogateescape') for x in w[1:3]]\n"
        " if w[0]=='get':get(a[0])\n"
        " elif w[0]=='put':put(a[0],a[1],int(w[3]),int(w[4],8))\n"
    ).replace("MAGIC", repr(_MAGIC))
    _XFER_LOCK = threading.Lock()  # guards every runner's helper pool (held only to take or give one)

    class _Helper:
        """A transfer helper's channel and the bytes read from it but not used yet."""

        def __init__(self, chan: paramiko.Channel) -> None:
            self.chan = chan
            self.buf = bytearray()
            self.in_step = False  # True once an operation ended cleanly: safe to reuse

    _xfer_pool: list[_Helper] | None = None  # idle helpers; set per instance on first use
    _xfer_unusable: object = None  # the transport on which no helper could start (no python there)

    @staticmethod
    def _hex(path: str) -> str:
        return "x" + path.encode("utf-8", "surrogateescape").hex()

    def _helper_take(self) -> _Helper | None:
        """An idle helper on the current connection, or a new one; None if the host cannot run it."""
        transport = self._transport()
        with self._XFER_LOCK:
            if self._xfer_pool is None:
                self._xfer_pool = []
            pool = self._xfer_pool
            pool[:] = [h for h in pool if h.chan.get_transport() is transport and not h.chan.closed
                       and not h.chan.eof_received]
            if pool:
                return pool.pop()
            if self._xfer_unusable is transport:
                return None
        command = build_remote_command([self.python, "-S", "-c", self._HELPER_SCRIPT])
        try:
            chan = self._open_channel(command)
            transport = chan.get_transport()
            chan.settimeout(self.liveness_timeout)
        except (SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransferError(f"cannot start a transfer on {self.name}: {exc}", "run the command again") from None
        helper = self._Helper(chan)
        ready = self._MAGIC.encode() + b"ready\n"
        while (at := helper.buf.find(ready)) < 0:  # skip what an rc file printed before
            block = self._stream_read(chan) if len(helper.buf) <= 1 << 16 else b""
            if block is None or (not block and not transport.is_active()):
                self._close_quietly(chan)
                self._drop()
                raise TransferError(f"connection to {self.name} lost before the transfer started",
                                    "run the command again")
            if not block:
                self._close_quietly(chan)
                self._xfer_unusable = transport
                return None
            helper.buf += block
        del helper.buf[:at + len(ready)]
        return helper

    def _helper_give(self, helper: _Helper) -> None:
        if not helper.in_step:
            self._close_quietly(helper.chan)  # the helper sees its stdin end and exits, leaving any .part
            return
        helper.in_step = False
        with self._XFER_LOCK:
            if self._xfer_pool is not None:
                self._xfer_pool.append(helper)

    def _helper_line(self, helper: _Helper) -> list[str] | None:
        """The helper's next reply in words; None if its channel ended (or it is out of step)."""
        while (nl := helper.buf.find(b"\n")) < 0:
            block = self._stream_read(helper.chan)
            if not block:
                return None
            helper.buf += block
        line = bytes(helper.buf[:nl])
        del helper.buf[:nl + 1]
        magic = self._MAGIC.encode()
        if not line.startswith(magic):
            return None
        return line[len(magic):].decode("utf-8", "replace").split() or None

    def _helper_data(self, helper: _Helper, n: int, digest, fout) -> bool:  # noqa: ANN001 - a sha256, a file
        """Hash and write the helper's next n bytes; False if its channel ended first."""
        while n > 0:
            if helper.buf:
                block = bytes(helper.buf[:n])
                del helper.buf[:n]
            else:
                block = self._stream_read(helper.chan)
                if not block:
                    return False
                if len(block) > n:
                    helper.buf += block[n:]
                    block = block[:n]
            digest.update(block)
            fout.write(block)
            n -= len(block)
        return True

    @staticmethod
    def _close_quietly(chan: paramiko.Channel) -> None:
        with contextlib.suppress(Exception):  # closing on a dead link may raise anything
            chan.close()

    def _helper_lost(self, helper: _Helper, cut: str, hint: str) -> TransferError:
        self._close_quietly(helper.chan)
        transport = helper.chan.get_transport()
        if transport is None or not transport.is_active():
            self._drop()
            return TransferError(cut, hint)
        return TransferError(f"{cut}: the transfer helper on the host stopped", hint)

    def _stream_read(self, chan: paramiko.Channel) -> bytes | None:
        """The next stdout block; b"" at EOF, None when the link is dead (no reply to a probe)."""
        while True:
            try:
                return chan.recv(self._STREAM_RECV)
            except TimeoutError:
                if not self.alive():
                    return None
            except (SSHException, EOFError, OSError):  # recv may send a window adjust on a dead link
                return None

    def _stream_send(self, chan: paramiko.Channel, data: bytes) -> bool:
        """Send all of data; False if the host stopped reading or the link is dead."""
        view = memoryview(data)  # slicing a view copies nothing; paramiko accepts it
        while view:
            try:
                sent = chan.send(view)
            except TimeoutError:
                if self.alive():
                    continue
                return False
            except (SSHException, EOFError, OSError):
                return False
            if sent <= 0:
                return False
            view = view[sent:]
        return True

    def put(self, local: str | os.PathLike[str], remote: str) -> str:
        src = Path(local)
        if not src.is_file():
            raise TransferError(f"{src}: no such file")
        target = self._path(remote)
        part = target + ".part"
        st = src.stat()
        cut = f"upload of {src} to {self.name}:{target} was cut"
        hint = f"the destination is untouched (partial data in {part}); run the command again"
        helper = self._helper_take()
        if helper is None:
            return self._put_sftp(src, target, part)  # no usable python on the host
        try:
            request = f"put {self._hex(part)} {self._hex(target)} {st.st_size} {st.st_mode & 0o777:o}\n"
            if not self._stream_send(helper.chan, request.encode()) or not (reply := self._helper_line(helper)):
                raise self._helper_lost(helper, cut, hint)
            if reply[0] == "err":
                helper.in_step = True
                msg = bytes.fromhex(reply[2]).decode("utf-8", "replace") if len(reply) > 2 else "?"
                raise TransferError(f"cannot write {self.name}:{part}: {msg}")
            digest = hashlib.sha256()
            left = st.st_size
            try:
                with open(src, "rb") as fin:
                    while left > 0 and (block := fin.read(min(CHUNK, left))):
                        digest.update(block)
                        if not self._stream_send(helper.chan, block):
                            raise self._helper_lost(helper, cut, hint)
                        left -= len(block)
            except OSError as exc:
                raise TransferError(f"cannot read {src}: {exc}", hint) from None
            if left:
                raise TransferError(f"{src} shrank while it was being sent", hint)
            expected = digest.hexdigest()
            if not self._stream_send(helper.chan, expected.encode()) or not (reply := self._helper_line(helper)):
                raise self._helper_lost(helper, cut, hint)
            helper.in_step = True
            if reply[0] == "err":
                msg = bytes.fromhex(reply[2]).decode("utf-8", "replace") if len(reply) > 2 else "?"
                raise TransferError(f"upload of {src} to {self.name}:{target} failed: {msg}", hint)
            actual = reply[1] if len(reply) > 1 else ""
            if reply[0] != "ok" or actual != expected:
                raise TransferError(
                    f"checksum mismatch uploading {src} to {self.name}:{target}: sent {expected[:16]}…, "
                    f"host has {actual[:16]}…",
                    f"the destination is untouched; partial data in {part}; run the command again",
                )
            return expected
        finally:
            self._helper_give(helper)

    def _put_sftp(self, src: Path, target: str, part: str) -> str:
        digest = hashlib.sha256()
        try:
            sftp = self.sftp()
            self._mkdirs(os.path.dirname(target))
            with open(src, "rb") as fin, sftp.open(part, "wb") as fout:
                fout.set_pipelined(True)
                while block := fin.read(CHUNK):
                    digest.update(block)
                    fout.write(block)
            sftp.chmod(part, src.stat().st_mode & 0o777)
        except ThrustError:
            raise
        except (SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransferError(
                f"upload of {src} to {self.name}:{target} was cut: {exc}",
                f"the destination is untouched (partial data in {part}); run the command again",
            ) from None
        expected = digest.hexdigest()
        actual = self.remote_sha256(part)
        if actual != expected:
            raise TransferError(
                f"checksum mismatch uploading {src} to {self.name}:{target}: sent {expected[:16]}…, "
                f"host has {actual[:16]}…",
                f"the destination is untouched; partial data in {part}; run the command again",
            )
        try:
            self.sftp().posix_rename(part, target)
        except (SSHException, OSError) as exc:
            raise TransferError(f"cannot rename {part} to {target} on {self.name}: {exc}") from None
        return expected

    def get(self, remote: str, local: str | os.PathLike[str]) -> str:
        source = self._path(remote)
        dst = Path(local)
        dst.parent.mkdir(parents=True, exist_ok=True)
        part = dst.with_name(dst.name + ".part")
        cut = f"download of {self.name}:{source} was cut"
        hint = f"{dst} is untouched (partial data in {part}); run the command again"
        helper = self._helper_take()
        if helper is None:
            return self._get_sftp(source, dst, part)  # no usable python on the host
        try:
            if not self._stream_send(helper.chan, f"get {self._hex(source)}\n".encode()) or not (
                reply := self._helper_line(helper)
            ):
                raise self._helper_lost(helper, cut, hint)
            if reply[0] == "err":
                helper.in_step = True
                if reply[1:2] == ["2"]:
                    raise TransferError(f"{self.name}:{source}: no such file")
                msg = bytes.fromhex(reply[2]).decode("utf-8", "replace") if len(reply) > 2 else "?"
                raise TransferError(f"cannot read {self.name}:{source}: {msg}")
            digest = hashlib.sha256()
            try:
                with open(part, "wb") as fout:
                    complete = self._helper_data(helper, int(reply[1]), digest, fout)
                    if complete:
                        fout.flush()
                        os.fsync(fout.fileno())
            except OSError as exc:
                raise TransferError(f"cannot write {part}: {exc}", f"{dst} is untouched") from None
            if not complete or not (reply := self._helper_line(helper)):
                raise self._helper_lost(helper, cut, hint)
            helper.in_step = True
            if reply[0] == "short":
                raise TransferError(f"{self.name}:{source} shrank while it was being read", hint)
            actual = digest.hexdigest()
            if reply[0] != actual:
                raise TransferError(
                    f"checksum mismatch downloading {self.name}:{source}: host {reply[0][:16]}…, "
                    f"received {actual[:16]}…",
                    f"{dst} is untouched; run the command again",
                )
            os.replace(part, dst)
            return actual
        finally:
            self._helper_give(helper)

    def _get_sftp(self, source: str, dst: Path, part: Path) -> str:
        digest = hashlib.sha256()
        remote_hash: dict[str, object] = {}

        def hash_there() -> None:  # runs on its own channel while the bytes arrive
            try:
                remote_hash["value"] = self.remote_sha256(source)
            except Exception as exc:  # noqa: BLE001 - reported after the transfer
                remote_hash["error"] = exc

        try:
            sftp = self.sftp()
            size = sftp.stat(source).st_size or 0
            hasher = threading.Thread(target=hash_there, daemon=True)
            hasher.start()
            with sftp.open(source, "rb") as fin, open(part, "wb") as fout:
                fin.prefetch(size)
                while block := fin.read(CHUNK):
                    digest.update(block)
                    fout.write(block)
                fout.flush()
                os.fsync(fout.fileno())
            hasher.join()
        except FileNotFoundError:
            raise TransferError(f"{self.name}:{source}: no such file") from None
        except (SSHException, EOFError, OSError) as exc:
            self._drop()
            raise TransferError(
                f"download of {self.name}:{source} was cut: {exc}",
                f"{dst} is untouched (partial data in {part}); run the command again",
            ) from None
        if "error" in remote_hash:
            err = remote_hash["error"]
            raise err if isinstance(err, ThrustError) else TransferError(str(err))
        actual = digest.hexdigest()
        if remote_hash.get("value") != actual:
            raise TransferError(
                f"checksum mismatch downloading {self.name}:{source}: host {str(remote_hash.get('value'))[:16]}…, "
                f"received {actual[:16]}…",
                f"{dst} is untouched; run the command again",
            )
        os.replace(part, dst)
        return actual

    def _mkdirs(self, path: str) -> None:
        if not path:
            return
        sftp = self.sftp()
        try:
            sftp.stat(path)
        except FileNotFoundError:
            self.run(["mkdir", "-p", "--", path]).check(f"mkdir -p {path}")

    def close(self) -> None:
        self._drop()
