"""What a run over several hosts asks of each host's network (the agent's `netinfo` subcommands):
the address the laptop's SSH reached, a rendezvous port free on node 0, the interface towards an
address. A run's plan (run/multinode.py) and `doctor` over several hosts (doctor/rdzv.py) both ask
them, so they live here, below both.
"""

from __future__ import annotations

from typing import Any

from thrust_remote.core.errors import UnreachableError
from thrust_remote.host.session import HostSession, parse_json


def ssh_endpoint(session: HostSession) -> tuple[str, int]:
    """The address and port the laptop's SSH connection reached (what other nodes try first)."""
    transport = getattr(session.runner, "transport", None)  # an SSHRunner's; the local host has none
    if transport is None:
        return "127.0.0.1", 22
    peer = transport().getpeername()
    return str(peer[0]), int(peer[1])


def rendezvous_port(head: HostSession, address: str) -> int:
    """`rdzv_port:` if free on the rendezvous host, else a free port there (agent `free-port`)."""
    bind = "::" if ":" in address else "0.0.0.0"  # torchrun's store listens on every address
    answer = head.agent_json("free-port", "free-port", "--bind", bind,
                             *(["--port", str(head.host.rdzv_port)] if head.host.rdzv_port else []))
    if "error" in answer:
        raise UnreachableError(f"{head.name}: rendezvous port: {answer['error']}",
                               f"free it, or set another rdzv_port: under hosts.{head.name}")
    return int(answer["port"])


def route(session: HostSession, address: str) -> dict[str, Any]:
    """agent `route-dev`: {"dev", "src", "local"} towards `address` from this node."""
    answer = parse_json(session.agent("route-dev", address), "route-dev", check=False)
    return answer if isinstance(answer, dict) else {}
