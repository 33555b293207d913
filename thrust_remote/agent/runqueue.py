"""The host-side queue of `train --queue` (docs/architecture.md, "The queue").

A run launched with `--queue` whose GPUs (or, on a host without GPUs, a CPU slot) are held by RUNNING
runs of the same workdir waits on the host: its supervisor starts as for any launch, writes run.json
with `queue` (this module's spec) and no pid, and looks again every POLL_S seconds under the launch
lock; when its turn comes it takes its GPUs, starts the job and is an ordinary supervisor from then on.
No laptop is needed for any of it.

The order is FIFO by `order`: [the laptop's submit time, run id], the same on every node of a run over
several hosts, so two such runs queue in the same order on every host and neither can hold one host's
slot while the other holds the next host's. A run starts when what it wants is free and no run ahead
of it wants any of the same (so nobody overtakes a run waiting for the same GPU, and a run waiting for
GPU 0 does not hold back one that wants only GPU 1).

What a run wants (`spec`): `gpus` (those, as `--gpus 0,2` gives them), or `count` of `pool` (`--gpus
N`: the first N of the host's GPUs to be free, chosen when it starts), or neither: one of the host's
`cpu_slots` (RUNNING runs that hold no GPU each take one).

Pure functions over what the supervisor read: the state of each run dir is its business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .protocol import RunState

POLL_S = 0.25  # a freed slot's run starts within this (plus a python start); the poll costs ~1 ms of CPU
CPU = "cpu"


@dataclass
class Entry:
    """One run dir of the workdir, as the queue sees it."""

    run_id: str
    state: str  # a RunState (a str)
    gpus: Sequence[int]  # a RUNNING run's GPUs (run.json `gpus`)
    spec: dict | None  # a QUEUED run's run.json `queue`


def wants(spec: dict) -> set[str]:
    """The resources a queued run waits for, as names ("gpu:0", "cpu"): what it conflicts on."""
    if spec.get("gpus"):
        return {f"gpu:{int(g)}" for g in spec["gpus"]}
    if spec.get("count"):
        return {f"gpu:{int(g)}" for g in spec.get("pool") or []}
    return {CPU}


def never_fits(spec: dict) -> str | None:
    """Why a spec can never be met on this host (refused at launch), or None."""
    count, pool = int(spec.get("count") or 0), spec.get("pool") or []
    if count and count > len(pool):
        return f"asks {count} GPU(s) of {len(pool)}"
    if not spec.get("gpus") and not count and int(spec.get("cpu_slots") or 1) < 1:
        return "cpu_slots is 0"
    return None


def order_key(spec: dict) -> tuple[float, str]:
    order = spec.get("order") or [0, ""]
    return (float(order[0]), str(order[1]))


def take(spec: dict, entries: Sequence[Entry]) -> list[int] | None:
    """The GPUs the run takes now ([] for a CPU slot), or None while it must wait."""
    held = {int(g) for e in entries if e.state == RunState.RUNNING for g in e.gpus}
    if spec.get("gpus"):
        gpus = [int(g) for g in spec["gpus"]]
        return gpus if not held & set(gpus) else None
    if spec.get("count"):
        free = [int(g) for g in spec.get("pool") or [] if int(g) not in held]
        return free[: int(spec["count"])] if len(free) >= int(spec["count"]) else None
    busy = sum(1 for e in entries if e.state == RunState.RUNNING and not e.gpus)
    return [] if busy < int(spec.get("cpu_slots") or 1) else None


def blocked_by(spec: dict, run_id: str, entries: Sequence[Entry]) -> str | None:
    """The queued run ahead of this one that wants some of the same, or None."""
    mine, key = wants(spec), order_key({**spec, "order": spec.get("order") or [0, run_id]})
    for e in sorted((e for e in entries if e.state == RunState.QUEUED and e.spec and e.run_id != run_id),
                    key=lambda e: order_key(e.spec or {})):
        if order_key(e.spec or {}) < key and wants(e.spec or {}) & mine:
            return e.run_id
    return None


def may_start(spec: dict, run_id: str, entries: Sequence[Entry]) -> list[int] | None:
    """`take`, once nobody ahead wants the same: the GPUs to start with, or None to keep waiting."""
    if blocked_by(spec, run_id, entries) is not None:
        return None
    return take(spec, entries)


def position(spec: dict, run_id: str, entries: Sequence[Entry]) -> int:
    """Its place among the workdir's queued runs, 1 next (FIFO, whatever each waits for)."""
    key = order_key(spec)
    return 1 + sum(1 for e in entries if e.state == RunState.QUEUED and e.spec and e.run_id != run_id
                   and order_key(e.spec) < key)
