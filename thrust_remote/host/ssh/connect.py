"""Open one SSH connection the way thrust-remote wants it, and say clearly why one could not open.

Stricter than Fabric's defaults (docs/architecture.md, "Security"):

- Host keys: known_hosts is loaded and an unknown key is refused (Fabric would AutoAdd it). The
  opt-in `accept-new` policy adds an unknown key once and still refuses a changed one, like
  OpenSSH's StrictHostKeyChecking=accept-new. Every ProxyJump hop gets the same policy.
- The transport prefers AES-GCM, the socket has TCP_NODELAY, and keepalives are on.
- `connect_error` is the one place where paramiko's and the socket layer's exceptions become
  `ThrustError`s with an exit code and a hint.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import logging
import os
import re
import shlex
import socket
from collections.abc import Callable
from dataclasses import dataclass, replace
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

from thrust_remote.core.config import CONFIG_NAME
from thrust_remote.core.errors import (
    AuthError,
    ConfigError,
    HostKeyError,
    ThrustError,
    UnknownHostError,
    UnreachableError,
    UsageError,
)
from thrust_remote.core.names import Address

# paramiko logs link trouble from its own thread ("Socket exception: Broken pipe (32)"); with no handler
# configured, Python's last-resort handler would print those lines raw on the user's terminal. Our
# errors say what happened in words; `--debug` routes paramiko's lines to stderr (cli/main.py).
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# paramiko's default cipher is aes128-ctr + hmac-sha2-256; AES-GCM (AEAD, AES-NI) costs less CPU on
# both ends: measured 200 -> 247 MB/s get, 191 -> 234 MB/s put (bench/bench_ssh.py). A server
# without GCM still negotiates one of the others, which stay in the list.
GCM_FIRST = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
KEEPALIVE_S = 15
POLICIES = ("strict", "accept-new")


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256:... form, so the user can compare it with `ssh-keygen -lf`."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


@dataclass(frozen=True)
class Target:
    """Where and how to connect: one host of thrust.yaml, with paths already expanded."""

    name: str
    address: Address
    identity: str | None = None
    known_hosts: Path = Path("~/.ssh/known_hosts")
    host_key_policy: str = "strict"
    connect_timeout: float = 10.0
    # thrust.yaml left `known_hosts:` at its default: ~/.ssh/config's UserKnownHostsFile for the alias
    # wins, as it does for ssh (connect, `_with_ssh_config`)
    known_hosts_default: bool = False
    more_known_hosts: tuple[Path, ...] = ()  # UserKnownHostsFile's further files: read, never written
    config_file: str = CONFIG_NAME  # the config file a hint says to edit: the --config given, else thrust.yaml

    def __post_init__(self) -> None:
        if self.host_key_policy not in POLICIES:
            raise UsageError(f"host_key_policy must be strict or accept-new, not {self.host_key_policy!r}")


def _gcm_first_transport(sock, **kwargs) -> paramiko.Transport:  # noqa: ANN001 - paramiko's signature
    transport = paramiko.Transport(sock, **kwargs)
    options = transport.get_security_options()
    available = tuple(options.ciphers)
    options.ciphers = (*[c for c in GCM_FIRST if c in available], *[c for c in available if c not in GCM_FIRST])
    return transport


class _RejectUnknown(paramiko.MissingHostKeyPolicy):
    def __init__(self, known_hosts: Path, config_file: str = CONFIG_NAME) -> None:
        self.known_hosts = known_hosts
        self.config_file = config_file

    def missing_host_key(self, client, hostname, key) -> None:  # noqa: ANN001 - paramiko's signature
        line = f"{hostname} {key.get_name()} {key.get_base64()}"
        raise HostKeyError(
            f"host key for {hostname} is not in {self.known_hosts}: {key.get_name()} {fingerprint(key)}",
            "check the fingerprint with the host's owner (on the host: ssh-keygen -lf "
            "/etc/ssh/ssh_host_*_key.pub), then trust it with:\n"
            f"  echo {shlex.quote(line)} >> {shlex.quote(str(self.known_hosts))}\n"
            f"or set `host_key_policy: accept-new` for this host in {self.config_file}",
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


def _policy(target: Target) -> paramiko.MissingHostKeyPolicy:
    if target.host_key_policy == "accept-new":
        return _AcceptNew(target.known_hosts)
    return _RejectUnknown(target.known_hosts, target.config_file)


def _secure(conn: Connection, target: Target) -> None:
    """Replace Fabric's auto-add-every-key default: load known_hosts, set our policy (every ProxyJump hop
    too, each with its own alias's UserKnownHostsFile when thrust.yaml names no file)."""
    hop: object = conn
    while isinstance(hop, Connection):
        client = hop.client
        checked = _with_ssh_config(target, hop)
        for path in (checked.known_hosts, *checked.more_known_hosts):
            if path.is_file():
                client.load_host_keys(str(path))
        client.set_missing_host_key_policy(_policy(checked))
        hop = hop.gateway


def _connect_kwargs(target: Target) -> dict[str, object]:
    kwargs: dict[str, object] = {"banner_timeout": target.connect_timeout,
                                 "auth_timeout": target.connect_timeout,
                                 "transport_factory": _gcm_first_transport}
    if target.identity:
        if not os.path.isfile(target.identity):
            raise ConfigError(
                f"hosts.{target.name}.identity: key file {target.identity} does not exist",
                "point `identity:` at the private key (not the .pub), or remove it to use ~/.ssh/config",
            )
        # like IdentitiesOnly: the configured key and nothing else, so a refusal is clear
        kwargs.update(key_filename=[target.identity], look_for_keys=False, allow_agent=False)
    return kwargs


def connect(target: Target) -> Connection:
    """An open, checked connection (our host-key policy on every hop), or a ThrustError."""
    conn = Connection(
        host=target.address.host,
        user=target.address.user,
        port=target.address.port,
        config=FabricConfig(),
        connect_timeout=int(max(1, round(target.connect_timeout))),
        connect_kwargs=_connect_kwargs(target),
    )
    target = _with_ssh_config(target, conn)
    _secure(conn, target)
    try:
        _open(conn)
    except Exception as exc:
        conn.close()
        mapped = connect_error(exc, target, conn)
        if mapped is exc:
            raise
        raise mapped from None
    transport = conn.transport
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        # Nagle + delayed ACK cost ~45 ms per command on a reused connection.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport.set_keepalive(KEEPALIVE_S)
    return conn


def _open(conn: Connection) -> None:
    """`conn.open()`, and once more when the connection ended in the middle of authentication.

    paramiko reports that end as a failed authentication ("transport shut down or saw EOF"), but a
    host going down mid-handshake ends it the same way, and so may a server dropping one connection.
    A second try tells them apart: a host that is gone now refuses the connection (unreachable, not
    a key to fix), a passing drop opens, and a server that ends it every time (too many keys offered)
    gives the same failure again, which stays an authentication failure."""
    try:
        conn.open()
    except AuthenticationException as exc:
        if "saw EOF" not in str(exc):
            raise
        conn.close()
        conn.open()


def _with_ssh_config(target: Target, conn: Connection) -> Target:
    """`UserKnownHostsFile` of the alias in ~/.ssh/config (as Fabric read it), when thrust.yaml set no
    `known_hosts:`: the files are where keys are looked up, the first is where `accept-new` writes,
    as for ssh. Only absolute paths to files that can hold keys count: `none`, /dev/null (how a config
    turns checking off) and what is left relative or with a token we do not expand are dropped, and
    with nothing left it is ~/.ssh/known_hosts: checking never gets weaker for them."""
    if not target.known_hosts_default:
        return target
    paths = _known_hosts_files(str(conn.ssh_config.get("userknownhostsfile") or ""), conn)
    if not paths:
        return target
    return replace(target, known_hosts=paths[0], more_known_hosts=tuple(paths[1:]))


def _known_hosts_files(value: str, conn: Connection) -> list[Path]:
    tokens = {"%%": "%", "%d": os.path.expanduser("~"), "%u": getpass.getuser(), "%h": str(conn.host),
              "%p": str(conn.port), "%r": str(conn.user), "%n": str(conn.original_host)}

    def expand(word: str) -> str | None:
        if any(t not in tokens for t in re.findall(r"%.?", word)):
            return None  # a token we do not expand: never a path we guess at
        path = os.path.expandvars(os.path.expanduser(re.sub(r"%.", lambda m: tokens[m.group()], word)))
        return path if os.path.isabs(path) and "$" not in path else None  # relative (to what?), unset variable

    words = _known_hosts_words(value, lambda word: word == "none" or expand(word) is not None)
    out = []
    for word in words:
        path = expand(word)
        if path is None or (os.path.exists(path) and not os.path.isfile(path)):
            continue  # /dev/null and other non-files: no keys to check against, none to write
        out.append(Path(path))
    return out


def _known_hosts_words(value: str, is_path: Callable[[str], bool]) -> list[str]:
    """The words of a UserKnownHostsFile value. paramiko strips the outer double quotes of a value that
    starts and ends with one: `"/my keys/known hosts"` reaches us as `/my keys/known hosts`, and
    `"/a b" "/c d"` as `/a b" "/c d`. So the value is split as it came and, when that leaves a word
    that is no path (`keys/known`: relative), with its outer quotes put back; else as it came."""
    splits = []
    for text in (value, f'"{value}"'):
        with contextlib.suppress(ValueError):  # unbalanced quotes: not this reading
            splits.append(shlex.split(text))
    return next((words for words in splits if words and all(is_path(w) for w in words)), splits[0] if splits else [])


def connect_error(exc: BaseException, target: Target, conn: Connection) -> BaseException:
    """The ThrustError (exit code + hint) that tells the user why `conn` did not open.

    An exception this layer does not know (and a ThrustError raised by a host-key policy) comes
    back as it is, to be re-raised unchanged.
    """
    if isinstance(exc, ThrustError):
        return exc
    if isinstance(exc, BadHostKeyException):
        name = known_hosts_name(conn.host, conn.port)
        return HostKeyError(
            f"host key for {name} CHANGED: the server offers {exc.key.get_name()} "
            f"{fingerprint(exc.key)}, {target.known_hosts} has {fingerprint(exc.expected_key)}. "
            "This can be a man-in-the-middle attack; nothing was run.",
            "if the host was really reinstalled, remove the old key with\n"
            f"  ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(target.known_hosts))}\n"
            "and connect again to trust the new one",
        )
    if isinstance(exc, AuthenticationException) or (
            isinstance(exc, SSHException) and "no authentication methods available" in str(exc).lower()):
        return _auth_error(exc, target, conn)
    if isinstance(exc, socket.gaierror):
        return UnknownHostError(
            f"cannot resolve host {conn.host!r}{_of(target, conn)}: {exc.strerror or exc}",
            f"check the address in {target.config_file} or the HostName in ~/.ssh/config",
        )
    if isinstance(exc, NoValidConnectionsError | TimeoutError | ConnectionError | OSError):
        return UnreachableError(
            f"cannot connect to {_where(target, conn)}: {_why_not_connected(exc)}",
            "is the host up and sshd listening? try: " + ssh_command(target),
        )
    if isinstance(exc, SSHException | EOFError):
        if target.identity and "private key" in str(exc).lower():
            return ConfigError(
                f"hosts.{target.name}.identity: {target.identity} is not a usable private key: {exc}",
                "point `identity:` at the private key file (not the .pub)",
            )
        return UnreachableError(f"SSH handshake with {_where(target, conn)} failed: {exc}")
    return exc


def _where(target: Target, conn: Connection) -> str:
    """The host as thrust.yaml names it, then where that went: `gpubox (127.0.0.1:2299)`; the address
    alone when it is the name (an ~/.ssh/config alias resolved to itself)."""
    address = f"{conn.host}:{conn.port}"
    return f"{target.name} ({address})" if target.name and target.name != conn.host else address


def _of(target: Target, conn: Connection) -> str:
    return f" (host {target.name})" if target.name and target.name != conn.host else ""


def _why_not_connected(exc: BaseException) -> str:
    """The reason in words: paramiko's NoValidConnectionsError reads "[Errno None] Unable to connect to
    port 1 on 127.0.0.1"; the socket errors it gathered (one per address tried) say why."""
    if isinstance(exc, NoValidConnectionsError) and exc.errors:
        reasons = {(e.strerror or str(e)).strip() for e in exc.errors.values()}
        return "; ".join(sorted(r[:1].lower() + r[1:] for r in reasons if r)) or "refused"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return (getattr(exc, "strerror", None) or str(exc)).strip()


def ssh_command(target: Target) -> str:
    """The OpenSSH command that tries the same connection (`user@host:port` is not valid ssh)."""
    argv = ["ssh", "-v"]
    if target.identity:
        argv += ["-i", target.identity]
    if target.address.port:
        argv += ["-p", str(target.address.port)]
    host = target.address.host
    argv.append(f"{target.address.user}@{host}" if target.address.user else host)
    return shlex.join(argv)


# paramiko's look_for_keys: these names under ~/.ssh (and ~/ssh), plus each one's -cert.pub
DEFAULT_KEYS = ("id_rsa", "id_ecdsa", "id_ed25519")


def identities_tried(target: Target, conn: Connection) -> list[str]:
    """The key files this connection offered or looked for, in paramiko's order (SSHClient._auth):
    the configured key (`identity:`, else ssh config's IdentityFile), then, without `identity:`,
    the default names under ~/.ssh; each marked when it does not exist."""
    if target.identity:
        files = [target.identity]
    else:
        configured = conn.connect_kwargs.get("key_filename") or []
        files = [configured] if isinstance(configured, str) else list(configured)
        files += [os.path.expanduser(f"~/.ssh/{name}") for name in DEFAULT_KEYS]
    return [f if os.path.isfile(f) else f"{f} (missing)" for f in dict.fromkeys(files)]


def _auth_error(exc: BaseException, target: Target, conn: Connection) -> AuthError:
    """Refused or nothing to offer: exit 77, naming the key files tried and how to name the right one."""
    who = f"{conn.user}@{conn.host}:{conn.port}"
    tried = ", ".join(identities_tried(target, conn))
    agent = "" if target.identity else (
        "; ssh-agent: " + ("SSH_AUTH_SOCK is set" if os.environ.get("SSH_AUTH_SOCK") else "none (SSH_AUTH_SOCK unset)"))
    alias = getattr(conn, "original_host", None) or conn.host
    name_it = (f"name the private key: `identity: ~/.ssh/KEY` under hosts.{target.name} in {target.config_file}, "
               f"or `IdentityFile ~/.ssh/KEY` under `Host {alias}` in ~/.ssh/config")
    if isinstance(exc, AuthenticationException):
        return AuthError(
            f"authentication failed for {who}: {exc} (tried: {tried}{agent})",
            f"check that the public key is in ~{conn.user}/.ssh/authorized_keys on the host (ssh-copy-id), "
            f"or {name_it}",
        )
    return AuthError(f"no key to offer to {who} (tried: {tried}{agent})",
                     f"{name_it}; make one with ssh-keygen -t ed25519 and install it with ssh-copy-id")
