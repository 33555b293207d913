"""`doctor --host a --host b`: can every node reach node 0's rendezvous, and through which interface?
(docs/architecture.md, "Several hosts").

Nothing listens on the rendezvous port outside a run, so the check makes it true for a moment: node
0's agent listens on the port a run would use (`listen`), and every other node connects to node 0's
address there (`reach`) at the same time. The answer is one row per node, as data (doctor.Check):
`rdzv-port` on node 0, `rdzv-reach` on the others, with the exact fix for what failed.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from thrust_remote.core.errors import ThrustError
from thrust_remote.host.fleet import each
from thrust_remote.host.netinfo import rendezvous_port, route, ssh_endpoint
from thrust_remote.host.report import Check
from thrust_remote.host.session import HostSession

LISTEN_S = 20.0
REACH_S = 8.0


def rendezvous_checks(sessions: Sequence[HostSession]) -> list[Check]:
    """One Check per node, node 0 first."""
    head = sessions[0]
    address = head.host.rdzv_address or ssh_endpoint(head)[0]
    try:
        port = rendezvous_port(head, address)
    except ThrustError as exc:
        row = Check("rdzv-port", "rendezvous port free on node 0", "fail", str(exc),
                    f"set rdzv_port: under hosts.{head.name} to a free port")
        return [row] + [_skip(s) for s in sessions[1:]]
    # what it heard is not needed: each connecting node says whether it got through
    listener = threading.Thread(target=_listen, args=(head, port, len(sessions) - 1), daemon=True)
    listener.start()
    answers = each(lambda s: _reach(s, address, port), list(sessions[1:]))
    listener.join(LISTEN_S + 10)
    try:
        own = route(head, address)
    except ThrustError:
        own = {}
    rows = [Check("rdzv-port", "rendezvous port free on node 0", "ok",
                  f"port {port} free on {head.name}; the other nodes reach it at {address}:{port} "
                  f"(interface {head.host.ifname or own.get('dev') or '?'})")]
    rows += [_row(s, a, head.name, address, port) for s, a in zip(sessions[1:], answers, strict=True)]
    return rows


def _listen(head: HostSession, port: int, count: int) -> dict[str, Any]:
    try:
        return head.agent_json("listen", "listen", "--port", str(port), "--accept", str(count),
                               "--timeout", str(LISTEN_S), timeout=LISTEN_S + 30)
    except ThrustError as exc:
        return {"error": str(exc)}


def _reach(session: HostSession, address: str, port: int) -> dict[str, Any]:
    try:
        return session.agent_json("reach", "reach", address, str(port), "--timeout", str(REACH_S),
                                  timeout=REACH_S + 30)
    except ThrustError as exc:
        return {"ok": False, "error": str(exc)}


def _row(session: HostSession, answer: dict[str, Any], head: str, address: str, port: int) -> Check:
    dev = session.host.ifname or answer.get("dev")
    how = f"through {dev}" + (f" (from {answer['src']})" if answer.get("src") else "") if dev else "no route found"
    if answer.get("ok"):
        return Check("rdzv-reach", "reaches node 0's rendezvous", "ok",
                     f"{session.name} reaches node 0 ({head}) at {address}:{port} {how}")
    return Check("rdzv-reach", "reaches node 0's rendezvous", "fail",
                 f"{session.name} cannot reach node 0 ({head}) at {address}:{port}: {answer.get('error')} ({how})",
                 f"open TCP ports from {session.name} to {head} (the rendezvous: set rdzv_port: under hosts.{head} "
                 f"and open that one), or set rdzv_address: under hosts.{head} to an address {session.name} "
                 "reaches")


def _skip(session: HostSession) -> Check:
    return Check("rdzv-reach", "reaches node 0's rendezvous", "skip", f"{session.name}: node 0 has no free port")
