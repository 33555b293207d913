"""The one seam between the agent's run modules and a cluster's scheduler (docs/architecture.md, "The host
agent"): a run's run.json `scheduler.kind` names the agent module that speaks to that scheduler; a run
without one is the direct case (the host's own supervisor), and no module but this table names a kind.

    launcher.py   `launch --KIND`: `Scheduler.launch` submits the supervisor instead of forking it
    supervisor.py a run's state: `Scheduler.view`, the scheduler's word on what its run dir recorded
    runs.py       `status`: `Scheduler.status_fields` (its nodes' parts); `stop`: `Scheduler.cancel`
    batchstep.py  `supervise` on the allocation: the kind's step module (`Kind.step`)
    serve.py      the kind's doctor check ends with its link (`Kind.check`)

A kind's modules are imported only when a run of that kind is looked at: a host's `status` of a plain
run reads none of them. Imports nothing of the agent but the protocol: every run module may import it
(tests/test_agent_scheduled.py adds the table's imports to the agent's graph: no circle through them).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple, Protocol, cast

from .protocol import SCHEDULER, RunRecord, SchedulerView


class Kind(NamedTuple):
    module: str  # the agent module a Scheduler: submit, view, status fields, cancel
    step: str  # the agent module whose `main` is `supervise`, the batch step on the allocation
    check: str  # the laptop doctor's subcommand of a login node (agent/__main__.py COMMANDS)


# run.json's scheduler kind (a host's `scheduler:`, the launch's `--KIND`) -> its agent modules
KINDS: dict[str, Kind] = {"slurm": Kind("slurm", "slurmstep", "slurm-check")}


class Scheduler(Protocol):
    """What a kind's module answers: module-level functions of these names."""

    def launch(self, run_dir: str, cwd: str, payload: dict, env: dict, record: RunRecord) -> dict:
        """Submit the run (`payload`: the launch's stdin, its scheduler options under the kind's own
        key) and write its run.json: {"queued", "scheduler_job", ...}, else {"error", ...} (exit 3)."""

    def view(self, run_dir: str, record: RunRecord, *, exit_code: int | None, ended: bool,
             stopped: bool) -> SchedulerView:
        """The run's state: what its run directory recorded with the scheduler's word on it."""

    def status_fields(self, run_dir: str, record: RunRecord, status: dict) -> dict:
        """What `status` adds to the run's status object (its nodes' parts), {} for nothing."""

    def cancel(self, run_dir: str, record: RunRecord) -> dict:
        """`stop`: {"stopped": True, ...} once the scheduler took the cancel, else {"stopped": False, "error"}."""


def kind_of(record: RunRecord | dict) -> str | None:
    """The scheduler kind run.json names; None for the direct case (or a kind this agent does not know)."""
    sched: Any = record.get(SCHEDULER)
    kind = sched.get("kind") if isinstance(sched, dict) else None
    return kind if isinstance(kind, str) and kind in KINDS else None


def scheduler(kind: str) -> Scheduler:
    """The module that speaks to `kind` (one of KINDS), imported now."""
    return cast(Scheduler, importlib.import_module(f".{KINDS[kind].module}", __package__))


def of(record: RunRecord | dict) -> Scheduler | None:
    """The module that speaks to the run's scheduler; None for a run its host's supervisor runs directly."""
    kind = kind_of(record)
    return scheduler(kind) if kind else None


def launch_kind(flags: dict[str, bool]) -> str | None:
    """The kind a launch's `--KIND` flag asked for (`flags`: each kind's flag as parsed), None: direct."""
    return next((kind for kind in KINDS if flags.get(kind)), None)


LINK_BOUND_CHECKS = frozenset(k.check for k in KINDS.values())  # read for the laptop's doctor, nobody else
