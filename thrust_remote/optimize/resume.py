"""Resuming a study (docs/optimize.md, "Resume, interruptions, stopping"): the trials RUNNING in it
when this driver starts. Each one's run is found on its host: still running → adopted, ended → told
from its metrics, never started / lost / stopped → interrupted (retried). A run of the study that no
trial names is stopped. The Scheduler's first part: the endings themselves are its (scheduler.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from thrust_remote.agent.protocol import RunState
from thrust_remote.optimize.fleet import Fleet
from thrust_remote.optimize.hostops import Reporter, StudyHost
from thrust_remote.optimize.model import Observer, TrialView, is_trial_run
from thrust_remote.optimize.monitor import ActiveTrial, Ended, Monitor
from thrust_remote.optimize.slots import Slot, SlotPool


class Resumer:
    """Needs, from the Scheduler: these attributes, and the endings below (`_finish`, `_interrupted`,
    `_stop_run`, `_guarded`, `_push`, `_view`)."""

    plan: Any  # scheduler.Plan
    study: Any
    hosts: Fleet
    store: Any
    monitor: Monitor
    pool: SlotPool
    observer: Observer
    reporter: Reporter
    views: dict[int, TrialView]
    active: dict[int, ActiveTrial]

    def resume(self) -> None:
        """Trials RUNNING in the study from an earlier driver on these hosts: adopt, tell, or retry."""
        from optuna.trial import TrialState

        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        known = {t.user_attrs.get("run_id") for t in running}

        def on(host: StudyHost, t: Any) -> bool:
            return t.user_attrs.get("host") == host.host.name and t.user_attrs.get("workdir") == host.paths.workdir

        for host in self.hosts.live:
            mine = [t for t in running if on(host, t)]
            self._guarded(host.host.name, lambda h=host, m=mine: self._resume_host(h, m, known))
        if self.store.exclusive:  # nobody else drives this study: a trial of a host not here is stale
            for frozen in running:
                if frozen.number not in self.views and not any(on(h, frozen) for h in self.hosts.live):
                    name = frozen.user_attrs.get("host") or "?"
                    act = ActiveTrial(self._view(TrialView.from_frozen(frozen)),
                                      self._trial(frozen), Slot("?", host=name))
                    self._interrupted(act, f"its host {name} is not reachable in this run")
        if self.views:  # some trial was adopted, told or retried: the study changed
            self._push()

    def _resume_host(self, host: StudyHost, mine: list[Any], known: set[str | None]) -> None:
        self._stop_orphans(host, known)
        if not mine:
            return
        where = f" on {host.host.name}" if self.hosts.several else ""
        self.reporter.step(f"resuming{where}: {len(mine)} trial(s) were running when the last driver stopped")
        answer = self.monitor.snapshot(host, [t.user_attrs["run_id"] for t in mine if t.user_attrs.get("run_id")])
        for frozen in mine:
            run_id = frozen.user_attrs.get("run_id")
            info = answer.get(host.run_dir(run_id)) if run_id else None
            self._resume_one(host.host.name, frozen, info)

    def _trial(self, frozen: Any) -> Any:
        from optuna.trial import Trial

        return Trial(self.study, frozen._trial_id)

    def _resume_one(self, host: str, frozen: Any, info: Mapping[str, Any] | None) -> None:
        run_id = frozen.user_attrs.get("run_id")
        view = self._view(TrialView.from_frozen(frozen))
        state = info["state"] if info else "MISSING"
        slot = self.pool.find_free(frozen.user_attrs.get("slot") or (info or {}).get("slot") or "", host)
        act = ActiveTrial(view, self._trial(frozen), slot or Slot("?", host=host),
                          reported=set(frozen.intermediate_values))
        if state == RunState.RUNNING and slot is not None:
            self.pool.take(slot)
            view.state = "RUNNING"
            self.active[frozen.number] = act
            self.observer.event(f"trial {frozen.number}: adopted its running run {run_id} on {self.hosts.where(slot)}")
            return
        if state == RunState.RUNNING:
            self.observer.event(f"trial {frozen.number}: slot {frozen.user_attrs.get('slot')} is not in this "
                                "run's slots: stopping it")
            self._stop_run(run_id, host)
            state = RunState.STOPPED
        if state in (RunState.FINISHED, RunState.FAILED):  # a genuine failure is not retried (docs/optimize.md)
            assert info is not None
            self.monitor.drain(act)
            self.active[frozen.number] = act
            self._finish(act, Ended(state, info.get("exit_code"), info.get("log_tail") or ""))
        else:
            self._interrupted(act, f"run {state.lower()} while no driver watched")

    def _stop_orphans(self, host: StudyHost, known: set[str | None]) -> None:
        """A run of this study that no trial in the study names (its driver died between launching it
        and saving the study) would hold a slot unseen: stop it."""
        for run_id in host.running_run_ids():
            if is_trial_run(run_id, self.plan.study_name) and run_id not in known:
                self.observer.event(f"stopping {run_id}: a run of this study that no trial names")
                self._stop_run(run_id, host.host.name)

