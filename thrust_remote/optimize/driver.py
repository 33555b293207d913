"""The driver: check the request, prepare the host, plan the slots, take the study's lease, open the
study, build the monitor and the scheduler from all of that, run, summarise. Also `optimize --stop`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from thrust_remote.core.config import BEST_PARAMS_SUFFIX, Config, HostConfig
from thrust_remote.core.errors import ConnectionLostError, ThrustError, UsageError
from thrust_remote.core.names import valid_id
from thrust_remote.host.runner import Runner
from thrust_remote.optimize import hostops
from thrust_remote.optimize.fleet import Fleet, in_parallel
from thrust_remote.optimize.hostops import StudyHost
from thrust_remote.optimize.model import (
    DEFAULT_LOG_INTERVAL,
    METRICS,
    PRUNERS,
    Control,
    NullObserver,
    Observer,
    OptimizeRequest,
    is_trial_run,
)
from thrust_remote.optimize.monitor import Monitor
from thrust_remote.optimize.objective import objective_for
from thrust_remote.optimize.ownmonitor import OwnMonitor
from thrust_remote.optimize.scheduler import Plan, Scheduler
from thrust_remote.optimize.slots import Slot, SlotPool, plan_slots, union
from thrust_remote.optimize.space import distributions, search_space
from thrust_remote.optimize.store import (
    HostsStore,
    StudyStore,
    default_study_name,
    open_storage,
    open_study,
    remember_settings,
)
from thrust_remote.optimize.summary import Summary, build_summary
from thrust_remote.optimize.usage import UsageSources


class Optimizer:
    """One `optimize` command: everything checked at construction, before any host is touched."""

    def __init__(self, config: Config, request: OptimizeRequest, runner: Runner | Mapping[str, Runner],
                 reporter: hostops.Reporter | None = None, observer: Observer | None = None,
                 control: Control | None = None) -> None:
        """`runner`: the host's, or one per host name (a study over several hosts)."""
        if request.trials < 1:
            raise UsageError("--trials must be at least 1")
        if request.pruner not in PRUNERS:
            raise UsageError(f"--pruner {request.pruner!r}: expected one of {', '.join(PRUNERS)}")
        if request.metric not in METRICS:
            raise UsageError(f"--metric {request.metric!r}: expected one of {', '.join(METRICS)}")
        self.config = config
        self.request = request
        self.runners: Mapping[str, Runner] = runner if isinstance(runner, Mapping) else {request.host.name: runner}
        missing = [h.name for h in request.all_hosts if h.name not in self.runners]
        if missing:
            raise UsageError(f"no runner for host(s) {', '.join(missing)}")
        self.reporter = reporter or hostops.NullReporter()
        self.observer = observer or NullObserver()
        self.control = control or Control()
        self.job = request.job
        self.study_name = request.study or default_study_name(self.job)
        if not valid_id(self.study_name):
            raise UsageError(f"--study {self.study_name!r}: use letters, digits, '_', '-', '.'")
        self.objective = objective_for(config, self.job, request.metric)
        self.fixed = hostops.parse_sets(request.sets, self.job)
        self.space = search_space(config, self.job, self.fixed)
        self.dists = distributions(self.space)
        self.injected: dict[str, str] = {}
        if self.job.kind == "trainer":
            job_args = dict(self.job.args)  # type: ignore[arg-type]
            if "log-interval" not in self.fixed and "log-interval" not in job_args:
                self.injected["log-interval"] = DEFAULT_LOG_INTERVAL
            # One training per trial: the study is the search, a trial's score is its own run's (the
            # preset's --candidates would train several per slot and report the first one's metrics,
            # and its --snapshots would spend the trial's end on games its score does not read).
            for name in ("candidates", "snapshots"):
                if name not in self.fixed and name not in job_args:
                    self.injected[name] = "1"
        if self.job.kind == "cargo" or any(h.is_local for h in request.all_hosts):  # before any host is touched
            self._check_shared_events(request.parallel or 1)

    def _check_shared_events(self, slots: int) -> None:
        """Event files in one DIR of a checkout trials share (the local host's) cannot be told apart between
        trials that run at the same time: with several slots there, DIR must name the run (docs/optimize.md,
        "Objective and pruning"). A remote host's trials each write into their own tree."""
        o = self.objective
        if o.source == "tensorboard" and slots > 1 and not o.per_run_dir:
            raise UsageError(
                f"{slots} trials at once would write TensorBoard events into the same {o.events_dir}/ "
                "of the host's checkout, and their scalars could not be told apart",
                f"use --parallel 1, or write events under {o.events_dir}/$THRUST_RUN_ID (e.g. "
                f"SummaryWriter(os.path.join({o.events_dir!r}, os.environ['THRUST_RUN_ID']))) and set "
                f"metrics: {{tensorboard: {o.events_dir}/$THRUST_RUN_ID}}")

    def _args(self, params: Mapping[str, Any]) -> list[str]:
        return hostops.trial_args(self.job, {**self.injected, **self.fixed}, params)

    def run(self) -> Summary:
        started = time.monotonic()
        r = self.request
        # --storage first: a URL, password or driver that cannot work must not cost a sync and a venv
        storage = open_storage(r.storage) if r.storage else None
        fleet, pool = self._prepare_hosts()
        # trials side by side in one checkout: the local host's, a cargo job's (each remote trial has its own tree)
        self._check_shared_events(max((sum(s.host == h.host.name for s in pool.slots) for h in fleet.live
                                       if not h.own_trees), default=1))
        store = self._open_store(fleet)
        store.acquire()  # before anything is touched: a refused second driver must change nothing
        for name, exc in fleet.clear_stop().items():
            self._lose_at_start(fleet, pool, store, name, exc)
        if store.synced:
            store.pull()
        self.reporter.step(f"study {self.study_name} in {store.label}; slots: "
                           + ", ".join(f"{fleet.where(s)} (CUDA_VISIBLE_DEVICES={s.cuda_visible_devices!r})"
                                       for s in pool.slots))
        study = open_study(store, self.study_name, r, self.objective.direction, storage)
        o = self.objective
        settings = {"job": self.job.name, "space": self.space, "fixed": self.fixed, "metric": o.metric}
        if o.own:
            settings["mode"] = o.mode
        rung_steps = remember_settings(study, settings, self.reporter)
        monitor = OwnMonitor(fleet, study, o, rung_steps) if o.own else Monitor(fleet, study, o.metric, rung_steps)
        plan = Plan(self.study_name, self.dists, self._args, r.trials, r.timeout, r.poll_s,
                    UsageSources(self.config, self.job, self.fixed))
        scheduler = Scheduler(plan, study, fleet, store, monitor, pool, self.observer, self.control, self.reporter)
        self.control.started = True
        self._drive(scheduler, started)
        if scheduler.fatal is not None:
            raise scheduler.fatal
        names = [h.name for h in r.all_hosts]
        return build_summary(study, name=self.study_name, job=self.job.name, host=",".join(names), request=r,
                             fixed=self.fixed, best_file=self.config.root / f"{self.study_name}{BEST_PARAMS_SUFFIX}",
                             store=store, slots=pool.slots, views=scheduler.views, stopped=scheduler.stopped,
                             wall=time.monotonic() - started, metric=o.metric, direction=o.direction,
                             hosts=names, lost=fleet.lost)

    def _prepare_hosts(self) -> tuple[Fleet, SlotPool]:
        """Every host prepared at once (sync, preflight, setup: a thread per host), its slots planned,
        its study directory made. A host that cannot be reached is left out with a warning while
        another one can (several hosts); any other failure stops the command, naming the host."""
        r = self.request
        hosts = r.all_hosts
        several = len(hosts) > 1

        def prepare(host: HostConfig) -> tuple[StudyHost, list[Slot]]:
            reporter = _HostReporter(self.reporter, host.name) if several else self.reporter
            prepared = hostops.prepare(self.config, self.job, host, self.runners[host.name], reporter,
                                       self._args({}))
            slots = plan_slots(prepared.report.facts, host, r.gpus, r.parallel, r.slots_per_gpu)
            study_host = StudyHost.open(prepared, self.study_name)
            if self.objective.source == "tensorboard":
                study_host.scalars([], self.objective.metric)  # tensorboard importable there? (else 78)
            return study_host, slots

        done, lost = in_parallel({h.name: (lambda h=h: prepare(h)) for h in hosts})
        if not done:
            first = next(iter(lost.values()))
            raise type(first)("no host of this study can be reached: "
                              + "; ".join(f"{n}: {e.message}" for n, e in lost.items()), first.hint)
        for name, exc in lost.items():
            self.reporter.warn(f"host {name} cannot be reached and takes no trials: {exc.message}")
        live = [h.name for h in hosts if h.name in done]
        fleet = Fleet([done[n][0] for n in live], {n: e.message for n, e in lost.items()})
        return fleet, SlotPool(union({n: done[n][1] for n in live}))

    def _open_store(self, fleet: Fleet) -> StudyStore | HostsStore:
        r = self.request
        if not fleet.several:  # one host: the study lives there (docs/optimize.md, "Where the study lives")
            host = fleet.live[0]
            return StudyStore.open(self.config, host.host, host.session, hostops.studies_dir(host.paths),
                                   self.study_name, r.storage)
        return HostsStore.open(self.config, [(h.host.name, h.session, hostops.studies_dir(h.paths))
                                             for h in fleet.live], self.study_name, r.storage)

    def _lose_at_start(self, fleet: Fleet, pool: SlotPool, store: StudyStore | HostsStore, name: str,
                       exc: ThrustError) -> None:
        if not fleet.tolerates(name, exc):
            raise exc
        fleet.lose(name, exc.message)
        pool.drop_host(name)
        store.forget(name)
        self.reporter.warn(f"lost host {name}: {exc.message}; the study goes on on {', '.join(fleet.names)}")

    def _drive(self, scheduler: Scheduler, started: float) -> None:
        ok = False
        try:
            scheduler.resume()
            scheduler.loop(started)
            ok = True
        except ConnectionLostError as exc:
            raise ConnectionLostError(
                f"{exc.message}; the running trials go on on {', '.join(h.name for h in self.request.all_hosts)}",
                "rerun the same command to continue the study (running trials are adopted)") from None
        finally:
            try:
                scheduler.close()
            except ThrustError:
                if ok:
                    raise


class _HostReporter(hostops.NullReporter):
    """Steps and warnings of one host's preparation, named (several hosts prepare at once)."""

    def __init__(self, inner: hostops.Reporter, name: str) -> None:
        self.inner = inner
        self.name = name

    def step(self, message: str) -> None:
        self.inner.step(f"{self.name}: {message}")

    def warn(self, message: str) -> None:
        self.inner.warn(f"{self.name}: {message}")


def request_stop(runner: Runner, host: HostConfig, config: Config, study: str) -> list[str]:
    """Stop a study from anywhere: tell its driver (the stop file), then stop its running trials."""
    session = hostops.open_session(runner, host, config)
    hostops.write_stop(session, f"{hostops.studies_dir(session.paths)}/{study}.stop")
    stopped = []
    for run_id in hostops.running_run_ids(session):
        if is_trial_run(run_id, study):
            hostops.stop_run(session, run_id)
            stopped.append(run_id)
    return stopped
