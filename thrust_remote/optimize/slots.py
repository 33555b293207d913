"""Slots: where trials run. Planned per host by its backend (thrust_remote/backends/: an SSH box's GPUs
from the one GPU inventory, thrust_remote/run/gpus.py; a cluster's jobs in its scheduler); a pool that
hands free slots of every host out in their planned order, and drops a lost host's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from thrust_remote.backends import backend_for
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import UsageError


@dataclass(frozen=True)
class Slot:
    """Where one trial runs: GPUs (CUDA_VISIBLE_DEVICES) or none (a CPU slot: empty string), on `host`
    (the host's name in thrust.yaml; two hosts may both have a `cpu0`)."""

    name: str
    gpus: tuple[int, ...] = ()
    host: str = ""

    @property
    def label(self) -> str:
        """`cpu0`, or `b/cpu0` in a study over several hosts (the table's slot column)."""
        return f"{self.host}/{self.name}" if self.host else self.name

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


def plan_slots(facts: Mapping[str, Any], host: HostConfig, gpus: str | None, parallel: int | None,
               slots_per_gpu: int = 1) -> list[Slot]:
    """The host's slots as its backend plans them (thrust_remote/backends/): an SSH box's GPUs (`--gpus
    0,2`, default all; none: `--parallel` CPU slots; `slots_per_gpu` > 1 shares a GPU between trials), a
    cluster's jobs in its scheduler."""
    if slots_per_gpu < 1:
        raise UsageError("--slots-per-gpu must be at least 1")
    if parallel is not None and parallel < 1:
        raise UsageError("--parallel must be at least 1")
    return [Slot(name, on) for name, on in backend_for(host).slots(facts, host, gpus, parallel, slots_per_gpu)]


def union(per_host: Mapping[str, Sequence[Slot]]) -> list[Slot]:
    """Every host's slots, each marked with its host, taken in turn (a's first, b's first, a's second,
    ...): fewer trials than slots still spread over the hosts."""
    marked = [[replace(s, host=name) for s in slots] for name, slots in per_host.items()]
    return [lst[i] for i in range(max(map(len, marked), default=0)) for lst in marked if i < len(lst)]


class SlotPool:
    """The planned slots and the free ones; a freed slot goes back in planned order, so the next
    trial takes the lowest free slot (gpu0 before gpu1), as a reader of the table expects."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        self.slots = list(slots)
        self.free = list(slots)

    def take(self, slot: Slot | None = None) -> Slot:
        """The lowest free slot, or that one (an adopted run keeps its slot)."""
        if slot is None:
            return self.free.pop(0)
        self.free.remove(slot)
        return slot

    def find_free(self, name: str, host: str | None = None) -> Slot | None:
        return next((s for s in self.free if s.name == name and (host is None or s.host == host)), None)

    def drop_host(self, host: str) -> None:
        """A lost host's slots leave the pool (free or not: their trials are told as interrupted)."""
        self.slots = [s for s in self.slots if s.host != host]
        self.free = [s for s in self.free if s.host != host]

    def give_back(self, slot: Slot) -> None:
        if slot in self.slots and slot not in self.free:
            self.free.append(slot)
            self.free.sort(key=self.slots.index)
