"""What a node of a run over several hosts needs to know about its network (docs/architecture.md,
"Several hosts").

    agent free-port --bind ADDR [--port P]
        {"port": P}: a TCP port free on ADDR here (P itself when given and free), or {"error": ...}
    agent route-dev ADDR
        {"dev": "eth0", "src": "10.0.0.2", "local": false}: the interface this host would use to reach
        ADDR (`ip route get`); for an address of this host itself, the interface that holds it

torchrun's c10d rendezvous listens on node 0 at the port chosen here, and NCCL / gloo pick their
interface from NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, which the caller sets from `route-dev`.
"""

from __future__ import annotations

import errno
import json
import shutil
import socket
import subprocess
import sys


def free_port(bind: str, port: int = 0) -> dict:
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # as torchrun's store will bind it: SO_REUSEADDR, so a port in TIME_WAIT counts as free
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind, port))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else (
                "not an address of this host" if exc.errno == errno.EADDRNOTAVAIL else exc.strerror)
            return {"error": f"cannot listen on {bind}:{port}: {why}"}
        return {"port": sock.getsockname()[1]}


def _ip(*args: str) -> str:
    if not shutil.which("ip"):
        return ""
    result = subprocess.run(["ip", "-o", *args], capture_output=True, text=True, timeout=10)
    return result.stdout if result.returncode == 0 else ""


def _field(words: list[str], name: str) -> str | None:
    return words[words.index(name) + 1] if name in words[:-1] else None


def route_dev(addr: str) -> dict:
    """`ip -o route get ADDR`; an address of this host routes through `lo`, so there the interface
    that carries the address is the one the other nodes reach (from `ip -o addr show`)."""
    words = _ip("route", "get", addr).split()
    if not words:
        return {"dev": None, "src": None, "local": False,
                "error": "no route (or no `ip` command: install iproute2, or set ifname: for this host)"}
    local = words[0] == "local"
    dev = _field(words, "dev")
    if local:
        for line in _ip("addr", "show").splitlines():
            parts = line.split()
            if len(parts) > 3 and parts[3].split("/")[0] == addr:
                dev = parts[1].split("@")[0]
                break
    return {"dev": dev, "src": _field(words, "src") or (addr if local else None), "local": local}


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "route-dev":
        print(json.dumps(route_dev(argv[1])))
        return 0
    if len(argv) >= 3 and argv[0] == "free-port" and argv[1] == "--bind":
        port = int(argv[4]) if len(argv) >= 5 and argv[3] == "--port" else 0
        print(json.dumps(free_port(argv[2], port)))
        return 0
    sys.stderr.write("usage: agent route-dev ADDR | agent free-port --bind ADDR [--port P]\n")
    return 2
