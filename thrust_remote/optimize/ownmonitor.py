"""Watching the trials of a job of your own: the objective's metric from its `THRUST_METRICS {json}`
lines (the run's log, read by the agent's `poll` with source "log"), or from its TensorBoard scalars
(agent `scalars`, run on the host by the job's venv python, at most every TB_EVERY_S and once more when
a run finishes). Intermediate values reach the pruner at fixed step rungs, as the trainer's do: the
rung size comes from a `total_steps` the job reports, else from the first finished trial's last step
(that trial's own rungs are then reported from its points before it is told)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from thrust_remote.agent.protocol import RunState
from thrust_remote.core.errors import ThrustError
from thrust_remote.optimize.fleet import Fleet
from thrust_remote.optimize.hostops import StudyHost
from thrust_remote.optimize.model import RUNGS
from thrust_remote.optimize.monitor import ActiveTrial, Monitor
from thrust_remote.optimize.objective import Objective, missing_metric
from thrust_remote.runs.progress import LinePattern, parse_tagged

TB_EVERY_S = 5.0  # each read starts a python that imports tensorboard (~1 s): not every poll


def numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def value_at(series: Sequence[tuple[int, float]], step: int) -> float:
    """The last value reported at or before `step` (the first one when none was)."""
    out = series[0][1]
    for s, v in series:
        if s > step:
            break
        out = v
    return out


class OwnMonitor(Monitor):
    def __init__(self, hosts: Fleet, study: Any, objective: Objective, rung_steps: int | None) -> None:
        super().__init__(hosts, study, objective.metric, rung_steps)
        self.objective = objective
        self.tb_read_at = 0.0
        self.seen_value = False  # some trial of this driver reported the metric
        self.pattern = LinePattern(objective.pattern) if objective.pattern else None

    def entry(self, act: ActiveTrial, offset: int) -> tuple[Any, ...]:
        return (self.run_dir(act), offset, "raw" if self.pattern is not None else "log")

    def poll(self, acts: Sequence[ActiveTrial], wait: float) -> dict[str, Any]:
        answer = super().poll(acts, wait)
        if self.objective.source == "tensorboard" and time.monotonic() - self.tb_read_at >= TB_EVERY_S:
            self.read_scalars([a for a in acts if a.slot.host not in answer["lost"]
                               and answer["runs"].get(self.run_dir(a), {}).get("state") == RunState.RUNNING])
        return answer

    def read_scalars(self, acts: Sequence[ActiveTrial]) -> None:
        """New TensorBoard points of these trials, into their series (pruning is for the next feed)."""
        self.tb_read_at = time.monotonic()
        if not acts:
            return
        got: dict[str, Any] = {}
        for name in dict.fromkeys(a.slot.host for a in acts):  # each host's checkout, by its own python
            host = self.hosts[name]
            request = [(self.run_dir(a), self._events(host, a.view.run_id or ""), a.series[-1][0] if a.series else -1)
                       for a in acts if a.slot.host == name]
            got.update(host.scalars(request, self.objective.metric))
        for act in acts:
            one = got.get(self.run_dir(act)) or {}
            act.names.update(one.get("tags") or [])
            act.series += [(int(s), float(v)) for s, v in one.get("points") or []]

    def _events(self, host: StudyHost, run_id: str) -> str:
        """The trial's events directory: under its own tree (or the checkout the trials share)."""
        return self.objective.events_under(host.cwd_of(run_id) if run_id else host.prepared.cwd, run_id)

    def objects(self, data: str) -> Iterator[dict[str, Any]]:
        """The metrics in a poll's data: JSON lines (source "log"), or whole log lines (source "raw", the
        job's pattern): its THRUST_METRICS lines and what the pattern reads from its own."""
        for line in data.splitlines():
            if self.pattern is not None:
                tag, m = parse_tagged(line)
                m = m if tag == "THRUST_METRICS" else None if tag else self.pattern.read(line)
            else:
                try:
                    m = json.loads(line)
                except ValueError:
                    continue
            if isinstance(m, dict):
                yield m

    def feed(self, act: ActiveTrial, data: str, prune: bool = True) -> int | None:
        for m in self.objects(data):
            act.last.update({k: v for k, v in m.items() if v is not None})
            self._progress(act, m)
            if self.objective.source == "lines":
                act.names.update(k for k, v in m.items() if k not in ("step", "total_steps") and numeric(v))
                value = m.get(self.metric)
                if numeric(value):
                    act.series.append((act.view.step, float(value)))
        return self._report(act, prune)

    def _progress(self, act: ActiveTrial, m: Mapping[str, Any]) -> None:
        view = act.view
        if view.first_metric_at is None:
            view.first_metric_at = time.time()
            act.trial.set_user_attr("first_metric_at", view.first_metric_at)
        if numeric(m.get("step")):
            view.step = int(m["step"])
        if numeric(m.get("total_steps")):
            view.total_steps = int(m["total_steps"])
        if self.rung_steps is None and view.total_steps:
            self._fix_rungs(view.total_steps)

    def _fix_rungs(self, total: int) -> None:
        self.rung_steps = max(1, int(total) // RUNGS)
        self.study.set_user_attr("rung_steps", self.rung_steps)

    def _report(self, act: ActiveTrial, prune: bool) -> int | None:
        """Report the rungs the trial's points reached; the rung when the pruner says stop."""
        if not act.series:
            return None
        self.seen_value = True
        act.view.intermediate = act.series[-1][1]
        act.view.step = max(act.view.step, act.series[-1][0])
        if not self.rung_steps:
            return None
        rung = act.series[-1][0] // self.rung_steps
        new = [r for r in range(1, rung + 1) if r not in act.reported]
        for r in new:
            act.trial.report(value_at(act.series, r * self.rung_steps), r)
            act.reported.add(r)
        if prune and new and act.trial.should_prune():
            return rung
        return None

    def drain(self, act: ActiveTrial) -> None:
        super().drain(act)
        if self.objective.source == "tensorboard":
            self.read_scalars([act])
            self._report(act, prune=False)

    def final(self, act: ActiveTrial) -> tuple[str, float | None]:
        if self.objective.source == "tensorboard":
            self.read_scalars([act])  # the run ended: every point it wrote is on disk
        if not act.series:
            return self.metric, None
        if self.rung_steps is None:
            self._fix_rungs(act.series[-1][0])
        self._report(act, prune=False)
        return self.metric, act.series[-1][1]

    def missing(self, act: ActiveTrial) -> ThrustError | None:
        if self.seen_value or act.series:
            return None
        return missing_metric(self.objective, act.view.number, sorted(act.names))
