"""A node's watch on the other nodes of its run (docs/architecture.md, "Several hosts").

Why our own, small as it is: torchrun's c10d rendezvous only looks at its members when they
rendezvous again, and a collective over a dead link (gloo, NCCL) blocks for the process group's
timeout, 30 minutes by default. A node whose peer's host cannot be reached any more would hang that
long; this watch stops it instead, within `timeout` seconds plus the stop's grace.

Each peer is probed with a TCP connect to its SSH endpoint (the address and port the laptop reached
it at) every POLL_S seconds. A peer is watched only once a probe has succeeded, so a node that cannot
reach its peers' SSH ports at all (a jump host, a firewall) is never stopped by this watch; torch's
own timeouts are then what remains. When a watched peer has not answered for `timeout` seconds the
verdict is written to the run dir (PEER_FAILED) and `on_lost` stops the job.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable

from .protocol import PEER_FAILED

POLL_S = 2.0


def reachable(address: str, port: int, timeout: float = POLL_S) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return True
    except OSError:
        return False


def record(run_dir: str, verdict: dict) -> None:
    """The first verdict stays: a run fails for the node that was lost first."""
    path = os.path.join(run_dir, PEER_FAILED)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({**verdict, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))


def watch(run_dir: str, peers: list[dict], timeout: float, done: threading.Event,
          on_lost: Callable[[], None]) -> threading.Thread:
    """Start the watch thread; it ends when `done` is set or after it has stopped the job."""

    def loop() -> None:
        last_ok: dict[int, float] = {}
        while not done.wait(POLL_S):
            now = time.monotonic()
            for peer in peers:
                node = int(peer["node"])
                if reachable(str(peer["address"]), int(peer["port"])):
                    last_ok[node] = now
                elif node in last_ok and now - last_ok[node] > timeout:
                    record(run_dir, {"node": node, "host": peer.get("host"),
                                     "why": f"{peer['address']}:{peer['port']} unreachable for {timeout:.0f} s"})
                    on_lost()
                    return

    thread = threading.Thread(target=loop, name="peerwatch", daemon=True)
    thread.start()
    return thread
