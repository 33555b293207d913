"""The scheduler: fill free slots (of every host) with asked trials, follow them through the monitor,
and tell the study how each ended. The ONLY place that calls `study.tell` (docs/optimize.md,
"Trials are detached runs"): every ending (complete, pruned, failed, interrupted) goes through `_tell`. A host lost in a
study over several hosts takes only its running trials with it (interrupted: retried elsewhere)."""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from thrust_remote.agent.protocol import RunState, run_record
from thrust_remote.core.errors import ConnectionLostError, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.optimize.fleet import Fleet
from thrust_remote.optimize.hostops import Reporter
from thrust_remote.optimize.model import (
    MAX_CONSECUTIVE_FAILURES,
    PUSH_EVERY_S,
    RUNGS,
    Control,
    Observer,
    TrialView,
    count_states,
    fmt,
)
from thrust_remote.optimize.monitor import ActiveTrial, Ended, Monitor, Prune
from thrust_remote.optimize.resume import Resumer
from thrust_remote.optimize.slots import Slot, SlotPool
from thrust_remote.optimize.store import HostsStore, StudyStore
from thrust_remote.optimize.usage import UsageSources, refused_early, usage_error


@dataclass(frozen=True)
class Plan:
    """What the scheduler runs, fixed before it starts."""

    study_name: str
    dists: dict[str, Any]  # Optuna distributions of the searched flags
    args: Callable[[Mapping[str, Any]], list[str]]  # a trial's parameters → the trainer's argv flags
    trials: int  # COMPLETE + PRUNED to reach
    timeout: float | None  # seconds after which no new trial starts
    poll_s: float
    sources: UsageSources | None = None  # where a trial's arguments come from (a usage error names it)


class Scheduler(Resumer):
    def __init__(self, plan: Plan, study: Any, hosts: Fleet, store: StudyStore | HostsStore, monitor: Monitor,
                 pool: SlotPool, observer: Observer, control: Control, reporter: Reporter) -> None:
        self.plan = plan
        self.study = study
        self.hosts = hosts
        self.store = store
        self.monitor = monitor
        self.pool = pool
        self.observer = observer
        self.control = control
        self.reporter = reporter
        self.views: dict[int, TrialView] = {}
        self.active: dict[int, ActiveTrial] = {}
        self.consecutive_failures = 0
        self.stopped: str | None = None  # why no new trials start (timeout, drained, failures, aborted)
        self.by_us: set[str] = set()  # run ids we are stopping (pruned or aborted)
        self.dirty_since: float | None = None  # the local copy has changes the host's lacks
        self.fatal: ThrustError | None = None  # the study cannot work (a metric that never appears, a usage error)

    def _view(self, view: TrialView) -> TrialView:
        self.views[view.number] = view
        return view

    # -- the loop ---------------------------------------------------------------------------------
    def loop(self, started: float) -> None:
        deadline = started + self.plan.timeout if self.plan.timeout else None
        while True:
            tick = time.monotonic()
            if self.control.abort:
                self.stopped = "aborted"
                return
            counts = count_states(self.study)
            if deadline is not None and tick > deadline and not self.stopped:
                self.stopped = "timeout"
                self.observer.event(f"--timeout {self.plan.timeout:g} s reached: no new trials")
            if self.control.drain and not self.stopped:
                self.stopped = "drained"
            # RUNNING in the study counts every driver's running trials (a shared PostgreSQL study)
            while (self.pool.free and not self._no_new_trials()
                   and counts["done"] + counts["RUNNING"] < self.plan.trials):
                self._launch(self.pool.take())
                counts = count_states(self.study)
            self.observer.update(list(self.views.values()), counts)
            if not self.active:
                return
            self._poll_active()  # waits on the host up to poll_s, less when a trial ends
            for name, exc in self.store.heartbeat().items():
                self._lose_host(name, exc)
            if self.dirty_since is not None and time.monotonic() - self.dirty_since > PUSH_EVERY_S:
                self._push()

    def close(self) -> None:
        """The end, however it came: stop the trials of an aborted study, save, drop the lease."""
        if self.control.abort and self.active:
            for act in list(self.active.values()):
                self._stop_run(act.view.run_id, act.slot.host)
                if act.view.number in self.active:  # not already told (its host lost meanwhile)
                    self._interrupted(act, "stopped with the study")
        self._push()
        self.store.release()

    def _no_new_trials(self) -> bool:
        if self.consecutive_failures >= MAX_CONSECUTIVE_FAILURES and not self.stopped:
            self.stopped = "failures"
            self.observer.event(f"{self.consecutive_failures} trials failed in a row: no new trials")
        return self.stopped is not None or self.control.abort

    def _launch(self, slot: Slot) -> None:
        trial = self.study.ask(self.plan.dists)
        params = dict(trial.params)
        run_id = f"{self.plan.study_name}-t{trial.number:03d}-{secrets.token_hex(2)}"
        host = self.hosts.of(slot)
        view = self._view(TrialView(trial.number, params, slot.name, slot.cuda_visible_devices, run_id,
                                    state="LAUNCHING", launched_at=time.time(), host=slot.host))
        # the run id is in the study before the run exists: a driver killed in between is recoverable
        for key, value in (("run_id", run_id), ("slot", slot.name), ("cuda_visible_devices", slot.cuda_visible_devices),
                           ("host", slot.host), ("workdir", host.paths.workdir),
                           ("launched_at", view.launched_at)):
            trial.set_user_attr(key, value)
        self._push()
        saved = time.time()
        act = ActiveTrial(view, trial, slot)
        self.active[trial.number] = act
        env = {
            "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices,  # "" on a CPU slot: no GPU at all
            "THRUST_STUDY": self.plan.study_name,
            "THRUST_TRIAL": str(trial.number),
            "THRUST_SLOT": slot.name,
        }
        meta = run_record(study=self.plan.study_name, trial=trial.number, slot=slot.name, params=dict(params))
        try:
            host.launch(run_id, self.plan.args(params), slot.gpus, env, meta)
            view.launch_timing = {"save_s": round(saved - (view.launched_at or saved), 4),
                                  "launch_s": round(time.time() - saved, 4)}
        except ThrustError as exc:
            if self.hosts.tolerates(slot.host, exc):
                self._lose_host(slot.host, exc)  # this trial too: interrupted, retried on another host
                return
            if isinstance(exc, ConnectionLostError):
                raise
            # the answer may have been lost after the run started: never leave one behind on a freed slot
            with contextlib.suppress(ThrustError):
                host.stop_run(run_id)
            self._fail(act, f"launch failed: {exc.message}")
            return
        view.state = "RUNNING"
        shown = ", ".join(f"{k}={fmt(v)}" for k, v in params.items())
        self.observer.event(f"trial {trial.number} on {self.hosts.where(slot)}: {shown}")

    def _poll_active(self) -> None:
        """One poll of every running trial, then each one's outcome, in order."""
        acts = list(self.active.values())
        answer = self.monitor.poll(acts, self.plan.poll_s)
        for name, exc in answer.get("lost", {}).items():
            self._lose_host(name, exc)
        if answer.get("stop") and not self.control.abort:
            self.observer.event("a stop was requested for this study (optimize --stop): stopping the trials")
            for name, exc in self.hosts.clear_stop().items():
                self._lose_host(name, exc)
            self.control.abort = True
        for act in acts:
            if act.view.number not in self.active:  # told already (pruned, or its host was lost)
                continue
            info = answer["runs"].get(self.monitor.run_dir(act))
            if info is None:
                continue
            live = (RunState.QUEUED, RunState.RUNNING)
            if info.get("state") in live and act.view.state in live:
                act.view.state = str(info["state"])  # pending in a cluster's scheduler: QUEUED, not a failure
            outcome = self.monitor.outcome(act, info)
            if isinstance(outcome, Prune):
                self._prune(act, outcome.rung)
            elif isinstance(outcome, Ended):
                self._finish(act, outcome)

    # -- endings: each one tells the study once ---------------------------------------------------
    def _tell(self, act: ActiveTrial, state: str, value: float | None = None) -> None:
        from optuna.trial import TrialState

        self.active.pop(act.view.number, None)
        act.view.ended_at = time.time()
        act.trial.set_user_attr("ended_at", act.view.ended_at)
        self.pool.give_back(act.slot)
        if state == "COMPLETE":
            self.study.tell(act.trial, value)
        else:
            self.study.tell(act.trial, state=TrialState[state])
        act.view.state = state
        self._dirty()

    def _prune(self, act: ActiveTrial, rung: int) -> None:
        self._stop_run(act.view.run_id, act.slot.host)
        if act.view.number not in self.active:  # its host was lost while stopping it: interrupted
            return
        self._tell(act, "PRUNED")
        act.view.note = f"pruned at rung {rung}/{RUNGS}"
        self.consecutive_failures = 0
        self.observer.event(f"trial {act.view.number} pruned at step {act.view.step:,} "
                            f"(return {fmt(act.view.intermediate)})")

    def _finish(self, act: ActiveTrial, ended: Ended) -> None:
        run_id = act.view.run_id or ""
        if ended.state == RunState.FINISHED:
            metric, value = self.monitor.final(act)
            if value is None:
                self._missing(act)
                return
            act.trial.set_user_attr("value_metric", metric)
            self._tell(act, "COMPLETE", value)
            act.view.value = value
            self.consecutive_failures = 0
            self.observer.event(f"trial {act.view.number} complete: {value:.4g}")
        elif ended.state == RunState.FAILED:
            if self._usage(act, ended):
                return
            lines = [ln for ln in ended.log_tail.strip().splitlines() if not ln.startswith("THRUST_")]
            last = f": {lines[-1].strip()[:200]}" if lines else ""
            self._fail(act, f"run {run_id} failed (exit code {ended.exit_code}){last}; see "
                            + command_hint("logs", run_id, host=self.hosts.hint_host(act.slot.host)))
        elif run_id in self.by_us:
            self._interrupted(act, "stopped with the study")
        elif ended.state == RunState.STOPPED:
            # someone ran `thrust-remote stop` on a trial: that stops the study (and is retried later)
            self._interrupted(act, "stopped by thrust-remote stop")
            if not self.control.abort:
                self.observer.event(f"trial {act.view.number} was stopped from outside: stopping the study")
                self.control.abort = True
        else:
            self._interrupted(act, f"run {ended.state.lower()}")

    def _missing(self, act: ActiveTrial) -> None:
        """A finished trial without the metric. A job of your own whose first finished trial never
        reported it is misconfigured: stop the study (the running trials too) with that error."""
        error = self.monitor.missing(act)
        if error is None or count_states(self.study)["COMPLETE"] > 0:
            self._fail(act, "finished without the metric (no episode ended?)")
            return
        self._stop_for(act, error)

    def _usage(self, act: ActiveTrial, ended: Ended) -> bool:
        """A trial that died of a usage error before any trial ran through, or of a searched choice the
        job refuses at any time: the arguments are the job's problem, not this trial's, so the study
        stops (the running trials too) with that error."""
        if self.plan.sources is None:
            return False
        # once a trial ran through, the flags are fine: only a searched choice the job refuses stays fatal
        ran_through = count_states(self.study)["done"] > 0
        error = usage_error(ended.exit_code, ended.log_tail, act.view.number, self.plan.sources,
                            only_choices=ran_through)
        if error is None and not ran_through and act.view.first_metric_at is None:
            error = refused_early(ended.exit_code, ended.log_tail, act.view.number, self.plan.sources)
        if error is None:
            return False
        self._stop_for(act, error)
        return True

    def _stop_for(self, act: ActiveTrial, error: ThrustError) -> None:
        """The trial failed for a reason every trial would share: it stops the study with `error`, which
        the command prints once at its end (the trial's own line only points to it)."""
        self._fail(act, error.message, said="the study stops: the error below says why")
        if self.fatal is None:
            self.fatal = error
            self.control.abort = True

    def _fail(self, act: ActiveTrial, why: str, *, said: str | None = None) -> None:
        act.trial.set_user_attr("fail_reason", why)
        self._tell(act, "FAIL")
        act.view.note = why
        self.consecutive_failures += 1
        self.observer.event(f"trial {act.view.number} failed: {said or why}")

    def _interrupted(self, act: ActiveTrial, why: str) -> None:
        """Not the trial's fault: FAIL it and enqueue its parameters, so the study stays at N."""
        act.trial.set_user_attr("fail_reason", f"interrupted: {why}")
        self._tell(act, "FAIL")
        self.study.enqueue_trial(dict(act.view.params), user_attrs={"retry_of": act.view.number})
        act.view.note = f"interrupted ({why}); will be retried"
        self.observer.event(f"trial {act.view.number} interrupted ({why}); its parameters are queued again")

    def _stop_run(self, run_id: str | None, host: str) -> None:
        if not run_id or host not in self.hosts.hosts:
            return
        self.by_us.add(run_id)
        try:
            self.hosts[host].stop_run(run_id, grace=10.0)
        except ThrustError as exc:
            if self.hosts.tolerates(host, exc):
                self._lose_host(host, exc)
            elif isinstance(exc, ConnectionLostError):
                raise
            else:
                self.reporter.warn(f"stopping {run_id}: {exc.message}")

    # -- losing a host ----------------------------------------------------------------------------
    def _guarded(self, host: str, call: Callable[[], None]) -> None:
        """A host call whose link error loses that host (several hosts) or is raised (the last one)."""
        try:
            call()
        except ThrustError as exc:
            if not self.hosts.tolerates(host, exc):
                raise
            self._lose_host(host, exc)

    def _lose_host(self, name: str, exc: ThrustError) -> None:
        """Its slots leave the pool and its running trials are told as interrupted (their parameters
        run again on the other hosts); the study goes on. The last host's loss is raised as before."""
        if name in self.hosts.lost:
            return
        if not self.hosts.tolerates(name, exc):
            raise exc
        self.hosts.lose(name, exc.message)
        self.pool.drop_host(name)
        self.store.forget(name)
        acts = [a for a in self.active.values() if a.slot.host == name]
        self.reporter.warn(f"lost host {name}: {exc.message}; the study goes on on {', '.join(self.hosts.names)}"
                           + (f" ({len(acts)} trial(s) that ran there are retried)" if acts else ""))
        for act in acts:
            self._interrupted(act, f"host {name} lost")

    # -- saving the study -------------------------------------------------------------------------
    def _push(self) -> None:
        self.store.push()
        self.dirty_since = None

    def _dirty(self) -> None:
        """An ending needs no push of its own: the host's copy still says RUNNING, and a rerun tells
        such a trial again from its run (same metrics, same value). The next launch's push carries it,
        or the periodic one (PUSH_EVERY_S), or the last one."""
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()
