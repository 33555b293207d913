"""Watching running trials: one poll of the host for all of them, their metrics.jsonl lines parsed,
the chosen metric reported to the study at fixed step rungs, and what became of each trial (pruned,
ended) handed back to the scheduler, which alone tells the study (scheduler.py)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from thrust_remote.agent.protocol import RunState
from thrust_remote.core.errors import ThrustError
from thrust_remote.optimize.fleet import Fleet
from thrust_remote.optimize.hostops import StudyHost
from thrust_remote.optimize.model import RUNGS, TrialView
from thrust_remote.optimize.slots import Slot


@dataclass
class ActiveTrial:
    """A trial with a run on the host: how far its metrics were read, and what was reported."""

    view: TrialView
    trial: Any  # optuna.trial.Trial
    slot: Slot
    offset: int = 0  # bytes of metrics.jsonl read so far
    last: dict[str, Any] = field(default_factory=dict)  # the latest non-null value of each metric
    reported: set[int] = field(default_factory=set)  # rungs reported to the study
    # a job of your own (OwnMonitor): the objective's (step, value) points, and every metric name seen
    series: list[tuple[int, float]] = field(default_factory=list)
    names: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Prune:
    """The pruner wants the trial stopped at this rung."""

    rung: int


@dataclass(frozen=True)
class Ended:
    """The trial's run ended (FINISHED, FAILED, STOPPED, LOST, MISSING) and every line of it was read."""

    state: str
    exit_code: int | None = None
    log_tail: str = ""


class Monitor:
    def __init__(self, hosts: Fleet, study: Any, metric: str, rung_steps: int | None) -> None:
        self.hosts = hosts
        self.study = study
        self.metric = metric
        self.rung_steps = rung_steps  # steps per rung: fixed by the first total_steps seen, kept in the study

    def run_dir(self, act: ActiveTrial) -> str:
        return self.hosts.of(act.slot).run_dir(act.view.run_id or "")

    def entry(self, act: ActiveTrial, offset: int) -> tuple[Any, ...]:
        """A trial's part of a poll request: the trainer's metrics.jsonl from `offset`."""
        return (self.run_dir(act), offset)

    def poll(self, acts: Sequence[ActiveTrial], wait: float) -> dict[str, Any]:
        """New lines of every trial, every host at once: waits on each host up to `wait`, less when a
        trial ends there. "lost": the hosts whose link failed (several hosts only; fleet.py)."""
        requests: dict[str, list[tuple[Any, ...]]] = {}
        for a in acts:
            requests.setdefault(a.slot.host, []).append(self.entry(a, a.offset))
        return self.hosts.poll(requests, wait)

    def snapshot(self, host: StudyHost, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The state of these runs on `host` (by run directory), no metrics consumed: for resuming."""
        return host.poll([(host.run_dir(r), 0) for r in run_ids])["runs"]

    def outcome(self, act: ActiveTrial, info: Mapping[str, Any]) -> Prune | Ended | None:
        """Feed a trial's part of a poll; what the scheduler must do with it (None: it runs on)."""
        rung = self.feed(act, info.get("data") or "")
        act.offset = int(info.get("offset", act.offset))
        if rung is not None:
            return Prune(rung)
        if RunState.of(info["state"]).is_terminal and not info.get("more"):
            return Ended(info["state"], info.get("exit_code"), info.get("log_tail") or "")
        return None

    def drain(self, act: ActiveTrial) -> None:
        """Read a whole metrics.jsonl (a run that ended while nobody watched); no pruning."""
        act.offset = 0
        while True:
            answer = self.hosts.of(act.slot).poll([self.entry(act, act.offset)])["runs"]
            got = next(iter(answer.values()))
            self.feed(act, got.get("data") or "", prune=False)
            act.offset = int(got.get("offset", act.offset))
            if not got.get("more"):
                return

    def feed(self, act: ActiveTrial, data: str, prune: bool = True) -> int | None:
        """Take metrics lines; report new rungs. Returns the rung when the pruner says stop."""
        for line in data.splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if not isinstance(m, dict):
                continue
            # a report window in which no episode ended has return_mean null: keep the one before
            act.last.update({k: v for k, v in m.items() if v is not None})
            rung = self._take(act, m)
            if rung is None:
                continue
            new = [r for r in range(1, rung + 1) if r not in act.reported]
            for r in new:
                act.trial.report(act.view.intermediate, r)
                act.reported.add(r)
            if prune and new and act.trial.should_prune():
                return rung
        return None

    def _take(self, act: ActiveTrial, m: Mapping[str, Any]) -> int | None:
        """One metrics line into the view; the rung it reaches when it carries a usable value."""
        view = act.view
        if view.first_metric_at is None:
            view.first_metric_at = time.time()
            act.trial.set_user_attr("first_metric_at", view.first_metric_at)
        view.step = int(m.get("step") or 0)
        view.total_steps = m.get("total_steps") or view.total_steps
        if self.rung_steps is None and view.total_steps:
            self.rung_steps = max(1, int(view.total_steps) // RUNGS)
            self.study.set_user_attr("rung_steps", self.rung_steps)
        value = m.get("score_mean" if self.metric == "score_mean" else "return_mean")
        if value is None or not math.isfinite(float(value)) or not self.rung_steps:
            return None
        view.intermediate = float(value)
        return view.step // self.rung_steps

    def final(self, act: ActiveTrial) -> tuple[str, float | None]:
        """(the metric used, the trial's value) once its run FINISHED and every line of it was read."""
        return self.final_value(act.last)

    def missing(self, act: ActiveTrial) -> ThrustError | None:
        """The error that stops the study when a finished trial lacks the metric (own jobs only)."""
        return None

    def final_value(self, last: Mapping[str, Any]) -> tuple[str, float | None]:
        """(the metric used, its value in the trial's last metrics line)."""
        metric = self.metric
        if metric == "auto":
            metric = "eval_return" if last.get("eval_return") is not None else "return_mean"
        value = last.get(metric)
        if value is None or not math.isfinite(float(value)):
            return metric, None
        return metric, float(value)
