"""`wait RUN...`: every run named asked on its own host until each has ended, its checkpoint pulled
meanwhile and once more at its end (docs/architecture.md, "Checkpoints and resume").

One connection per host however many runs it holds; the loop itself (each run asked every few
seconds, a host that stops answering sat out, the deadline) is `lifecycle.wait`. What happens is told
to a `WaitView`; this module never prints.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from thrust_remote.agent.protocol import RunState, StatusAnswer
from thrust_remote.core.config import Config
from thrust_remote.core.errors import ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.session import HostSession
from thrust_remote.run import lifecycle
from thrust_remote.run.vocab import NullReporter
from thrust_remote.runs import index, progress, pull, scalarwatch


class WaitView(Protocol):
    """What a wait tells its caller: a warning, a run that ended (its last status), a pull of a run's
    checkpoint and artifacts (from the puller's thread), what the pull at a run's end brought (`said`),
    and after each round the runs still going with their last status and metrics (`going`: the view
    says them now and then, so a wait in a pipe is not silent for hours)."""

    def warn(self, message: str) -> None: ...
    def ended(self, status: StatusAnswer) -> None: ...
    def pulled(self, run_id: str, pulled: pull.Pulled) -> None: ...
    def said(self, run_id: str, message: str) -> None: ...
    def going(self, runs: Sequence[StatusAnswer], metrics: Callable[[str], dict[str, object]]) -> None: ...


class _EndPull(NullReporter):
    """A run's last checkpoint and artifacts pulled at its end: its warnings and what came shown (a run
    that ended before its first pull, as a cluster's short run does, has no other line saying so)."""

    def __init__(self, view: WaitView, run_id: str) -> None:
        self.view, self.run_id = view, run_id

    def warn(self, message: str) -> None:
        self.view.warn(message)

    def step(self, message: str) -> None:
        if not message.startswith("fetching "):  # what came, not that it is coming
            self.view.said(self.run_id, message)


def wait(fleet: Fleet, run_ids: Sequence[str], view: WaitView, *, host: str | None = None,
         timeout: float | None = None, sync_every: float | None = None) -> list[StatusAnswer]:
    """Each run asked on its own host (`host`, else the index's, else the default) over one session per
    host; their last statuses, in the order given (lifecycle.wait: StillGoing past `timeout`, Detached
    on Ctrl-C). A run of a job of this config has its checkpoint pulled every `sync_every` s (None:
    the job's), and once more when it ends."""
    config = fleet.config
    with contextlib.ExitStack() as stack:
        sessions: dict[str, HostSession] = {}

        def session_for(run_id: str) -> HostSession:
            name = index.resolve_host(config, run_id, host) or config.default_host
            if name not in sessions:
                sessions[name] = stack.enter_context(fleet.open(name))
            return sessions[name]

        last: dict[str, StatusAnswer] = {}

        def asked(run_id: str) -> StatusAnswer:
            last[run_id] = st = lifecycle.status(session_for(run_id), run_id, fleet)
            return st

        def slept(seconds: float) -> None:  # a round's end: the runs still going, as last asked
            going = [st for st in last.values() if not RunState.of(st.get("state")).is_terminal]
            if going:
                view.going(going, lambda r: _metrics(config, session_for(r), r))
            time.sleep(seconds)

        asks = [(r, functools.partial(asked, r)) for r in run_ids]
        pullers = _pullers(config, stack, run_ids, session_for, sync_every, view)

        def ended(st: StatusAnswer) -> None:
            run_id = str(st.get("run_id"))
            metrics = _metrics(config, session_for(run_id), run_id)
            if metrics:  # the numbers it ended with, as its own lines or THRUST_METRICS said them
                st["metrics"] = metrics
            view.ended(st)
            lifecycle.tell_ended(config, st, view.warn)
            puller = pullers.pop(run_id, None)
            if puller is not None:  # its last checkpoint and artifacts, whatever its host does next
                puller.__exit__(None)
                lifecycle.pull_at_end(config, puller.session, run_id, puller.job, _EndPull(view, run_id))

        told: set[str] = set()

        def trouble(run_id: str, exc: ThrustError) -> None:  # once per outage of a run's host
            if run_id not in told:
                told.add(run_id)
                view.warn(f"{run_id}: its host does not answer now ({exc.message}); it goes on there: asking again")

        return lifecycle.wait(asks, timeout=timeout, on_end=ended, on_trouble=trouble, sleep=slept,
                              again=lambda going: command_hint("wait", *going, host=host, config=config.given_path))


def _metrics(config: Config, session: HostSession, run_id: str) -> dict[str, object]:
    """A run's last metrics as wait says them: the job's objective first, as the live line has it (a
    TensorBoard job's tags come sorted by name), Lightning's placeholder hp_metric left out (progress.py)."""
    entry = index.lookup(config.root, run_id)
    job = config.jobs.get(entry.job) if entry else None
    try:
        got = lifecycle.ended_metrics(session, run_id, job)
        if not got and job is not None and job.metrics.tensorboard:  # its numbers are its scalars
            source = scalarwatch.source_for(session, run_id, job.name, job.metrics.tensorboard)
            got = (scalarwatch.latest_metrics(session, source) or {}) if source is not None else {}
    except ThrustError:
        return {}  # the numbers are a courtesy: the run's end is what wait tells
    objective = job.objective.metric if job is not None and job.objective is not None else None
    return _objective_first(progress.without_placeholder(got, objective), objective)


def _objective_first(metrics: dict[str, object], objective: str | None) -> dict[str, object]:
    """The step (where the numbers were read: the x of every metric), then the job's objective, then
    the rest as they came."""
    if objective is None or objective not in metrics:
        return metrics
    lead = {k: metrics[k] for k in ("step", objective) if k in metrics}
    return {**lead, **{k: v for k, v in metrics.items() if k not in lead}}


def _pullers(config: Config, stack: contextlib.ExitStack, run_ids: Sequence[str],
             session_for: Callable[[str], HostSession], given: float | None,
             view: WaitView) -> dict[str, pull.Puller]:
    """A Puller per run whose job this config has (runs/pull.py); stopped when the wait ends."""
    out: dict[str, pull.Puller] = {}
    for run_id in run_ids:
        entry = index.lookup(config.root, run_id)
        job = config.jobs.get(entry.job) if entry else None
        # a job with something to pull gets its end pull even with --sync-every 0, as a follow does
        if job is None or not pull.has_files(job):
            continue
        every = pull.sync_every(job, given)
        session = session_for(run_id)

        def shown(p: pull.Pulled, run_id: str = run_id) -> None:
            view.pulled(run_id, p)

        out[run_id] = stack.enter_context(pull.Puller(session, job, session.paths.run(run_id), run_id, config.root,
                                                      every, shown, view.warn))
    return out
