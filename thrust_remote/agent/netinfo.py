"""What a node of a run over several hosts needs to know about its network (docs/architecture.md,
"Several hosts").

    agent free-port --bind ADDR [--port P]
        {"port": P}: a TCP port free on ADDR here (P itself when given and free), or {"error": ...}
    agent listen --port P --accept N --timeout S
        {"accepted": ["10.0.0.12", ...]}: listens on every address at P until N peers connected or S
        seconds passed (doctor's rendezvous check: node 0's side)
    agent reach ADDR PORT --timeout S
        {"ok": bool, "error", "dev", "src"}: a TCP connect to ADDR:PORT (retried while refused, up to
        S seconds: node 0's listener may start a moment later) and the interface it goes through
    agent page URL --timeout S
        {"ok": bool, "error", "text"}: the page at URL as this host reads it (a package index's page of
        a torch companion, for the builds it lists: venv.companion_source calls page() in its own process)
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
import time
import urllib.request


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


def listen(port: int, count: int, timeout: float) -> dict:
    accepted: list[str] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            return {"accepted": [], "error": f"cannot listen on port {port}: {exc.strerror}"}
        sock.listen(16)
        deadline = time.monotonic() + timeout
        while len(accepted) < count and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                conn, peer = sock.accept()
            except OSError:
                break
            conn.close()
            accepted.append(peer[0])
    return {"accepted": accepted}


def reach(addr: str, port: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    error = "timed out"
    while (left := deadline - time.monotonic()) > 0:
        try:
            with socket.create_connection((addr, port), timeout=left):
                return {"ok": True, "error": None, **route_dev(addr)}
        except ConnectionRefusedError:
            error = "connection refused"
            time.sleep(0.2)
        except OSError as exc:
            error = exc.strerror or str(exc)
            break
    return {"ok": False, "error": error, **{k: v for k, v in route_dev(addr).items() if k != "error"}}


PAGE_BYTES = 8 << 20  # PyPI's page of torchvision is ~0.5 MB; more is no index page


def page(url: str, timeout: float) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return {"ok": True, "error": None, "text": answer.read(PAGE_BYTES).decode("utf-8", "replace")}
    except (OSError, ValueError) as exc:  # URLError and HTTPError (a 404: no such project) are OSErrors
        return {"ok": False, "error": str(getattr(exc, "reason", None) or exc), "text": ""}


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "route-dev":
        print(json.dumps(route_dev(argv[1])))
        return 0
    if len(argv) == 7 and argv[0] == "listen":
        print(json.dumps(listen(int(argv[2]), int(argv[4]), float(argv[6]))))
        return 0
    if len(argv) == 5 and argv[0] == "reach":
        print(json.dumps(reach(argv[1], int(argv[2]), float(argv[4]))))
        return 0
    if len(argv) == 4 and argv[0] == "page":
        print(json.dumps(page(argv[1], float(argv[3]))))
        return 0
    if len(argv) >= 3 and argv[0] == "free-port" and argv[1] == "--bind":
        port = int(argv[4]) if len(argv) >= 5 and argv[3] == "--port" else 0
        print(json.dumps(free_port(argv[2], port)))
        return 0
    sys.stderr.write("usage: agent route-dev ADDR | free-port --bind ADDR [--port P] | "
                     "listen --port P --accept N --timeout S | reach ADDR PORT --timeout S | page URL --timeout S\n")
    return 2
