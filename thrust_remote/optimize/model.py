"""The plain data every part of the study shares: the request, a trial as the table shows it, the
CLI's controls, and the knobs of the schedule."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from thrust_remote.core.config import HostConfig, JobConfig

RUNGS = 20  # intermediate values per trial budget: the pruner compares trials at equal rungs
DEFAULT_LOG_INTERVAL = "0.5"  # trainer reports per second: enough for the pruner to act early
PUSH_EVERY_S = 10.0  # the longest a finished trial's result waits before it is on the host
METRICS = ("auto", "eval_return", "return_mean", "score_mean")
PRUNERS = ("median", "halving", "none")
MAX_CONSECUTIVE_FAILURES = 3  # then no new trials: the study's settings are broken, not one trial


@dataclass
class OptimizeRequest:
    job: JobConfig
    host: HostConfig  # the first (or only) host
    trials: int
    parallel: int | None = None
    gpus: str | None = None
    slots_per_gpu: int = 1
    study: str | None = None
    storage: str | None = None
    timeout: float | None = None  # seconds after which no new trial starts
    sets: Sequence[str] = ()
    pruner: str = "median"
    prune_startup: int = 2  # median: trials that finish before pruning starts
    prune_warmup: int = 4  # rungs (of RUNGS) before a trial can be pruned
    metric: str = "auto"
    seed: int | None = None
    out: Path | None = None
    poll_s: float = 0.5
    hosts: Sequence[HostConfig] = ()  # `--host a --host b` (groups expanded); empty: `host` alone

    @property
    def all_hosts(self) -> list[HostConfig]:
        return list(self.hosts) or [self.host]


@dataclass
class TrialView:
    """One trial as the table shows it and the JSON summary lists it."""

    number: int
    params: dict[str, Any]
    slot: str | None = None
    cuda_visible_devices: str | None = None
    run_id: str | None = None
    state: str = "WAITING"  # LAUNCHING, RUNNING, COMPLETE, PRUNED, FAIL
    step: int = 0
    total_steps: int | None = None
    intermediate: float | None = None
    value: float | None = None
    launched_at: float | None = None
    first_metric_at: float | None = None
    ended_at: float | None = None
    note: str = ""
    launch_timing: dict[str, float] | None = None  # save the study, then the launch command
    host: str | None = None  # the host the trial's run is on

    @classmethod
    def from_frozen(cls, frozen: Any) -> TrialView:
        """A trial stored in the study (by this driver or an earlier one)."""
        a = frozen.user_attrs
        return cls(frozen.number, dict(frozen.params), a.get("slot"), a.get("cuda_visible_devices"),
                   a.get("run_id"), launched_at=a.get("launched_at"), host=a.get("host"))

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "number", "state", "value", "params", "slot", "cuda_visible_devices", "run_id", "step", "total_steps",
            "launched_at", "first_metric_at", "ended_at", "note", "launch_timing", "host")}


class Observer(Protocol):
    def event(self, message: str) -> None: ...
    def update(self, trials: Sequence[TrialView], counts: Mapping[str, int]) -> None: ...


class NullObserver:
    def event(self, message: str) -> None:
        pass

    def update(self, trials: Sequence[TrialView], counts: Mapping[str, int]) -> None:
        pass


@dataclass
class Control:
    """What the CLI's signal handler sets: drain (no new trials) and abort (stop the running ones)."""

    drain: bool = False
    abort: bool = False
    started: bool = False  # set once setup is done: before that, Ctrl-C just interrupts


def count_states(study: Any) -> dict[str, int]:
    """Trials per state in the whole study (every driver's), and `done` = COMPLETE + PRUNED."""
    counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0, "RUNNING": 0, "WAITING": 0}
    for t in study.get_trials(deepcopy=False):
        counts[t.state.name] = counts.get(t.state.name, 0) + 1
    counts["done"] = counts["COMPLETE"] + counts["PRUNED"]
    return counts


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def is_trial_run(run_id: object, study: str) -> bool:
    """Run ids of a study's trials: `<study>-t<number>-<4 hex>` (so study `a` never matches `a-t2`'s)."""
    return bool(re.fullmatch(re.escape(study) + r"-t\d+-[0-9a-f]{4}", str(run_id)))
