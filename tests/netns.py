"""Hosts of their own for multi-host tests: network namespaces on one bridge, an sshd in each.

    with Network(2) as net:         # 2 namespaces, 10.231.N.11 and .12, the laptop at .1 on the bridge
        net.hosts[0].server          # a conftest.SSHServer listening at its namespace's address
        net.link_down(1)             # `ip link set eth0 down` inside namespace 1: a dead link
        net.yaml(path, rest=...)     # a thrust.yaml with hosts n0, n1 (one known_hosts for both)

Everything the test made is removed at exit: the sshds (with every job they started), the
namespaces (with their veths) and the bridge. Traffic goes only between these namespaces and the
bridge's address (nothing else is reached). `unavailable()` says why namespaces cannot be made here.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from conftest import VENV_BIN, SSHServer, _start_sshd


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """None when this machine can make network namespaces, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "no `ip` command (iproute2)"
    name = f"thrchk{secrets.token_hex(3)}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


@dataclass
class NetHost:
    name: str  # its name in thrust.yaml: n0, n1...
    netns: str
    ip: str
    server: SSHServer
    workdir: Path


# Networks of test sessions running side by side (pytest-xdist workers, two suites) are told apart here:
# each bridge's owner pid is recorded, a subnet is chosen under a lock among those no address uses, and
# what a killed session left (its owner gone) is removed before a new one is made.
OWNERS = Path(tempfile.gettempdir()) / "thrust-test-networks"


def _addresses() -> str:
    return _ip("-o", "-4", "addr", "show").stdout


def _sweep_orphans() -> None:
    """Remove the bridges and namespaces of networks whose session died without its teardown."""
    for record in OWNERS.glob("*.pid"):
        try:
            os.kill(int(record.read_text()), 0)
            continue  # its session is alive
        except (ProcessLookupError, ValueError):
            pass
        except PermissionError:
            continue
        tag = record.stem
        for ns in _ip("netns", "list", check=False).stdout.split():
            if ns.startswith(f"thrns{tag}"):
                _ip("netns", "del", ns, check=False)
        _ip("link", "del", f"thrbr{tag}", check=False)
        record.unlink(missing_ok=True)


class Network:
    def __init__(self, count: int) -> None:
        tag = secrets.token_hex(2)
        self.tag = tag
        self.subnet = ""
        self.bridge = f"thrbr{tag}"
        self.root = Path(tempfile.mkdtemp(prefix="thrust-net-"))
        self.count = count
        self.hosts: list[NetHost] = []
        self.known_hosts = self.root / "known_hosts"

    def _claim_subnet(self) -> None:
        """A /24 no interface of this machine uses, and the bridge on it, made under a lock so two
        sessions never take the same one."""
        OWNERS.mkdir(exist_ok=True)
        with open(OWNERS / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _sweep_orphans()
            while (OWNERS / f"{self.tag}.pid").exists():  # another live session's tag: names would clash
                self.tag = secrets.token_hex(2)
                self.bridge = f"thrbr{self.tag}"
            used = _addresses()
            start = int(self.tag, 16) % 200
            third = next(n for n in (20 + (start + k) % 200 for k in range(200)) if f" 10.231.{n}." not in used)
            self.subnet = f"10.231.{third}"
            (OWNERS / f"{self.tag}.pid").write_text(str(os.getpid()))
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)

    def __enter__(self) -> Network:
        try:
            self._claim_subnet()
            _ip("link", "set", self.bridge, "up")
            for i in range(self.count):
                self.hosts.append(self._host(i))
            self.known_hosts.write_text("".join(h.server.known_hosts_line + "\n" for h in self.hosts))
        except BaseException:
            self.__exit__()
            raise
        return self

    def _host(self, i: int) -> NetHost:
        ns, outer, inner = f"thrns{self.tag}{i}", f"thv{self.tag}{i}", f"thp{self.tag}{i}"
        ip = f"{self.subnet}.{11 + i}"
        _ip("netns", "add", ns)
        _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
        _ip("link", "set", outer, "master", self.bridge)
        _ip("link", "set", outer, "up")
        _ip("link", "set", inner, "netns", ns)
        _ip("-n", ns, "link", "set", inner, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        server = _start_sshd(self.root / f"n{i}", ip=ip, netns=ns)
        workdir = server.root / "remote-home" / "thrust"
        return NetHost(f"n{i}", ns, ip, server, workdir)

    def kill_children(self, i: int, pid: int) -> None:
        """SIGKILL the children of `pid` on host i (a pid of its sshd's pid namespace, whose /proc is
        its own mount's: hence --mount too)."""
        sshd = self.hosts[i].server._sshd_pid()
        assert sshd is not None, "host's sshd is not running"
        subprocess.run(["nsenter", "--target", str(sshd), "--pid", "--mount", "--", "pkill", "-9", "-P", str(pid)],
                       check=True)

    def link_down(self, i: int) -> None:
        _ip("-n", self.hosts[i].netns, "link", "set", "eth0", "down")

    def yaml(self, path: Path, *, rest: str = "", groups: str = "", extra: dict[int, str] | None = None) -> Path:
        """A thrust.yaml with hosts n0..nK (each its own address, workdir and key) and `rest` after."""
        lines = ["default_host: n0", "hosts:"]
        for i, h in enumerate(self.hosts):
            keys = {"address": h.server.address, "workdir": str(h.workdir), "python": str(VENV_BIN / "python"),
                    "identity": str(h.server.client_key), "known_hosts": str(self.known_hosts),
                    "connect_timeout": "5"}
            for line in (extra or {}).get(i, "").splitlines():  # `key: value` lines replace or add
                key, _, value = line.partition(":")
                keys[key.strip()] = value.strip()
            lines += [f"  {h.name}:", *(f"    {k}: {v}" for k, v in keys.items())]
        path.write_text("\n".join(lines) + "\n" + groups + rest)
        return path

    def __exit__(self, *exc: object) -> None:
        for h in self.hosts:
            h.server.stop()
        for i in range(self.count):
            _ip("netns", "del", f"thrns{self.tag}{i}", check=False)
        _ip("link", "del", self.bridge, check=False)
        with contextlib.suppress(OSError):
            (OWNERS / f"{self.tag}.pid").unlink()
        shutil.rmtree(self.root, ignore_errors=True)
