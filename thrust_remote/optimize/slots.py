"""Slots: where trials run. Planned per host on top of the one GPU inventory (thrust_remote/run/gpus.py);
a pool that hands free slots of every host out in their planned order, and drops a lost host's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import UsageError
from thrust_remote.run.gpus import host_gpus


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


def _chosen_gpus(gpus: str | None, have: list[int], host: HostConfig) -> list[int]:
    """`--gpus 0,2` → those (refused unless the host has them); none given → all of the host's."""
    if not gpus:
        return have
    try:
        chosen = [int(x) for x in gpus.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {gpus!r}: expected a list of GPU indices like 0,1,2,3") from None
    bad = [g for g in chosen if g not in have]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        listed = ", ".join(map(str, have)) if have else "none"
        raise UsageError(f"--gpus {gpus}: {host.name} has GPUs [{listed}]; "
                         f"{bad or 'duplicates'} not among them",
                         "leave --gpus out to use all of them" if have else
                         "this host has no GPU nvidia-smi lists: use --parallel K for K CPU slots")
    return chosen


def plan_slots(facts: Mapping[str, Any], host: HostConfig, gpus: str | None, parallel: int | None,
               slots_per_gpu: int = 1) -> list[Slot]:
    """`--gpus 0,2` → those GPUs (refused up front unless the host has them); default: all of the
    host's GPUs; no GPU → `--parallel` CPU slots. `slots_per_gpu` > 1 shares a GPU between trials."""
    if slots_per_gpu < 1:
        raise UsageError("--slots-per-gpu must be at least 1")
    if parallel is not None and parallel < 1:
        raise UsageError("--parallel must be at least 1")
    if host.slurm is not None:
        return _scheduler_slots(host, gpus, parallel)
    chosen = _chosen_gpus(gpus, host_gpus(facts, host), host)
    if not chosen:
        return [Slot(f"cpu{i}") for i in range(parallel or 1)]
    slots = [Slot(f"gpu{g}" if slots_per_gpu == 1 else f"gpu{g}.{k}", (g,))
             for k in range(slots_per_gpu) for g in chosen]
    if parallel is not None:
        if parallel > len(slots):
            names = ", ".join(s.name for s in slots)
            raise UsageError(f"--parallel {parallel}: only {len(slots)} GPU slot(s) ({names})",
                             "add GPUs with --gpus, or share them with --slots-per-gpu M")
        slots = slots[:parallel]
    return slots


def _scheduler_slots(host: HostConfig, gpus: str | None, parallel: int | None) -> list[Slot]:
    """A Slurm cluster: a slot is a job in its scheduler (`--parallel` of them at once, pending ones
    included); `--gpus N`: each trial's GPUs, which Slurm picks (the slot holds only their count)."""
    if gpus and not gpus.isdigit():
        raise UsageError(f"--gpus {gpus}: on {host.name}, a Slurm cluster, the scheduler picks the GPUs",
                         "give how many each trial gets, like --gpus 1")
    per_trial = int(gpus or 0)
    return [Slot(f"job{i}", tuple(range(per_trial))) for i in range(parallel or 1)]


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
