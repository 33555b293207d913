"""A job's sections that hold more than one value, as frozen dataclasses: `flags:`, `metrics:`,
`objective:`, `retry:` and `idle_stop:`. Each is parsed at its line (job_values.py, retry.py) into one of
these, so a reader asks `job.metrics.pattern`, not `job.metrics.get("pattern")`, and a typo in a key
name is an AttributeError where it is written rather than a silent None.

A field is None when the user did not write its key: `as_dict()` gives the keys written, in the shape
thrust.yaml and the job spec sent to a host have always had (host/jobspec.py), so the spec's bytes and
the preflight cache key built on them do not change with the type. A section also equals the mapping of
its keys written: what it was before it had a type (the tests that compare it to one keep their promise).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from thrust_remote.agent.protocol import MAX_DURATION, PREEMPTED, TIMEOUT

# what a followed run's retry answers (docs/architecture.md); timeout and preempted: a cluster scheduler's;
# max-duration: the job's own `max_duration:`, the protocol's STOPPED reason (asked for only: a run stopped
# at its bound stays stopped)
RETRY_ON = ("host-lost", "lost", "failed", TIMEOUT, PREEMPTED, MAX_DURATION)
RETRY_ON_DEFAULT = ("host-lost", "lost")  # a FAILED run is retried only when asked: a bug fails again


class _Section:
    """What every section shares: its keys written as a plain dict, and equality with one."""

    _omit: tuple[str, ...] = ()  # fields that are bookkeeping (a line), not a key the user wrote

    def as_dict(self) -> dict[str, Any]:
        """The keys written (a field left None was not), as plain JSON-able values."""
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None and f.name not in self._omit:
                out[f.name] = value
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        if type(other) is type(self):
            return self.as_dict() == other.as_dict()  # type: ignore[attr-defined]
        return NotImplemented

    def __hash__(self) -> int:
        return hash((type(self).__name__, tuple(sorted(self.as_dict().items()))))


@dataclass(frozen=True, eq=False)
class FlagsConfig(_Section):
    """`flags: {style, names}`: how a job of your own takes its flags (run/flags.py writes them). None:
    not written; the style then is the job kind's default, names as-is."""

    style: str | None = None  # one of model.FLAG_STYLES
    names: str | None = None  # one of model.FLAG_NAMES


@dataclass(frozen=True, eq=False)
class MetricsConfig(_Section):
    """`metrics: {tensorboard: DIR, pattern: REGEX}`: where a job's metrics come from besides its
    THRUST_METRICS lines. Neither written: THRUST_METRICS lines only."""

    tensorboard: str | None = None  # event files under this dir of the checkout ($THRUST_RUN_ID allowed)
    pattern: str | None = None  # RE2 searched in each log line; its named groups are metrics


@dataclass(frozen=True, eq=False)
class ObjectiveConfig(_Section):
    """`objective: {metric: NAME, mode: max|min}`: what optimize maximises or minimises for a job of
    your own (optimize/objective.py). Both keys are needed; a job without one has `objective` None."""

    metric: str
    mode: str = "max"


@dataclass(frozen=True, eq=False)
class RetryConfig(_Section):
    """`retry: {max: N, on: [...], hosts: [...], grace: S}`: what a followed run's retry answers, how
    often, and where it moves. `grace` None: the laptop's default (run/resume.py). `hosts_line` is where
    `hosts:` was written: the hosts are checked against `hosts:` after the whole file is read (a job may
    come before the hosts it names), and that message names this line; it is no key of the policy."""

    max: int
    on: tuple[str, ...] = RETRY_ON_DEFAULT
    hosts: tuple[str, ...] = ()
    grace: float | None = None
    hosts_line: int | None = field(default=None, repr=False)

    _omit = ("hosts_line",)


@dataclass(frozen=True, eq=False)
class IdleStop(_Section):
    """`idle_stop: {below: PERCENT, minutes: M, every: S}`: a run is stopped when its GPUs stay below
    PERCENT for M minutes, sampled every S seconds (agent/idlewatch.py; None: its default, 30)."""

    below: float
    minutes: float
    every: float | None = None
