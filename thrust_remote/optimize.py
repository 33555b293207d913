"""`thrust-remote optimize JOB --trials N`: an Optuna study whose trials are detached runs on a host.

Optuna runs here, in the CLI process (ask/tell); every trial is a detached run on the host (the same
supervisor as `train`), one per slot, with the slot's GPUs as CUDA_VISIBLE_DEVICES. One remote
command per poll reads every running trial's state and the new bytes of its metrics.jsonl (by
byte offset); the trainer's `return_mean`, bucketed into fixed step rungs, is what the pruner sees.

Storage (docs/optimize.md): by default the study is a SQLite file on the host,
`<workdir>/.thrust/studies/<study>.db`. For the local host Optuna opens that file directly. For a
remote host the file is fetched (verified) into `<project>/.thrust/study-cache/<host>/` at start, and
put back (snapshot, verified, atomic rename) after every change of a trial's state, so the host's
copy is the authoritative one and a rerun from any laptop continues it. `--storage URL` (e.g.
postgresql://) is used as it is: no copies, several drivers may share it.

Resume: a rerun of the same command finds the trials RUNNING in the study. Each one's run id was
stored *before* it was launched, so its run is found: still running → adopted (followed again); ended
→ told from its metrics; never started, lost or stopped → marked FAIL and its parameters enqueued
again. Only COMPLETE and PRUNED trials count towards N.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import socket
import sqlite3
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from . import pipeline, runs
from .config import Config, HostConfig, JobConfig
from .errors import ConfigError, ConnectionLostError, ExitCode, ThrustError, UsageError
from .names import valid_id
from .runner import Runner
from .session import HostSession

# The trainer's flags (trainer/train.py build_parser; a test keeps this list equal to it). Searching
# a name not in here would only fail later, on the host, as an argparse error in every trial.
TRAINER_FLAGS = frozenset({
    "env", "num-envs", "total-steps", "device", "seed", "run-dir", "resume", "export", "policy", "activation",
    "learning-rate", "num-steps", "num-minibatches", "update-epochs", "clip-coef", "ent-coef", "vf-coef", "gamma",
    "gae-lambda", "hidden", "grid-size", "action-mode", "target-kl", "max-grad-norm", "anneal-lr", "target-return",
    "eval-episodes", "eval-every", "log-interval", "checkpoint-interval", "threads", "dist-timeout", "tensorboard",
})
# Flags that name files or switch modes: the study decides them, not the sampler.
NOT_SEARCHABLE = frozenset({"env", "run-dir", "resume", "export", "tensorboard"})

# Built-in search spaces (thrust.yaml `search.<job>` replaces the one for its job). Power-of-two
# choices keep num-envs * num-steps divisible by num-minibatches.
DEFAULT_SEARCH: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole": {
        "learning-rate": {"low": 3.0e-4, "high": 1.0e-2, "log": True},
        "num-envs": {"choices": [4, 8, 16, 32]},
        "num-steps": {"choices": [16, 32, 64, 128]},
        "num-minibatches": {"choices": [1, 2, 4, 8]},
        "update-epochs": {"low": 1, "high": 8},
        "clip-coef": {"low": 0.1, "high": 0.3},
        "ent-coef": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.95, "high": 0.999},
        "gae-lambda": {"low": 0.8, "high": 0.99},
        "hidden": {"choices": [32, 64, 128]},
    },
    "snake": {
        "learning-rate": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
        "num-envs": {"choices": [128, 256, 512, 1024]},
        "num-steps": {"choices": [32, 64, 128]},
        "num-minibatches": {"choices": [2, 4, 8]},
        "update-epochs": {"low": 1, "high": 4},
        "clip-coef": {"low": 0.1, "high": 0.3},
        "ent-coef": {"low": 1.0e-4, "high": 5.0e-2, "log": True},
        "gamma": {"low": 0.95, "high": 0.995},
        "gae-lambda": {"low": 0.8, "high": 0.99},
        "hidden": {"choices": [128, 256, 512]},
    },
}

RUNGS = 20  # intermediate values per trial budget: the pruner compares trials at equal rungs
DEFAULT_LOG_INTERVAL = "0.5"  # trainer reports per second: enough for the pruner to act early
PUSH_EVERY_S = 10.0  # the longest a finished trial's result waits before it is on the host
LEASE_S = 60.0  # a remote study's driver lease: another laptop may take over after this much silence
METRICS = ("auto", "eval_return", "return_mean", "score_mean")
PRUNERS = ("median", "halving", "none")

# ------------------------------------------------------------------------------------ search space

def search_space(config: Config, job: JobConfig, fixed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The job's space (thrust.yaml `search:` or the built-in one) minus the flags fixed with --set."""
    if job.kind != "python":
        raise UsageError(f"optimize runs the built-in trainer; job {job.name!r} is a {job.kind} job",
                         "optimize a python job (snake, cartpole, or one with kind: python)")
    where = f"{config.path or 'thrust.yaml'}: search.{job.name}"
    if job.name in config.search:
        space = {k: dict(v) for k, v in config.search[job.name].items()}
    else:
        env = str(dict(job.args).get("env") or job.name)  # type: ignore[arg-type]
        if env not in DEFAULT_SEARCH:
            raise ConfigError(f"job {job.name!r} has no search space", f"add search.{job.name} to thrust.yaml")
        space = {k: dict(v) for k, v in DEFAULT_SEARCH[env].items()}
        where = f"built-in search space of {env}"
    for name in space:
        if name not in TRAINER_FLAGS or name in NOT_SEARCHABLE:
            known = ", ".join(sorted(TRAINER_FLAGS - NOT_SEARCHABLE))
            raise ConfigError(f"{where}.{name}: not a trainer flag that can be searched", f"known: {known}")
        spec = space[name]
        if "choices" in spec:
            bad = [c for c in spec["choices"] if not isinstance(c, str | int | float | bool) and c is not None]
            if bad:
                raise ConfigError(f"{where}.{name}.choices: {bad[0]!r} is not a plain value")
        elif not all(isinstance(spec.get(k), int | float) for k in ("low", "high")) or spec["low"] >= spec["high"]:
            raise ConfigError(f"{where}.{name}: expected {{low: X, high: Y}} with X < Y, or {{choices: [...]}}")
    for name in fixed:
        if name not in TRAINER_FLAGS:
            raise UsageError(f"--set {name}=...: not a trainer flag", f"known: {', '.join(sorted(TRAINER_FLAGS))}")
    space = {k: v for k, v in space.items() if k not in fixed}
    if not space:
        raise UsageError("every searched parameter is fixed with --set: nothing left to search")
    return space


def distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """thrust.yaml specs → Optuna distributions (ints stay ints when low, high and step are ints)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for name, spec in space.items():
        if "choices" in spec:
            out[name] = CategoricalDistribution(list(spec["choices"]))
            continue
        low, high, log, step = spec["low"], spec["high"], bool(spec.get("log")), spec.get("step")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) and (
                step is None or isinstance(step, int)):
            out[name] = IntDistribution(low, high, log=log, step=1 if log else (step or 1))
        else:
            out[name] = FloatDistribution(float(low), float(high), log=log,
                                          step=None if log or step is None else float(step))
    return out


# ------------------------------------------------------------------------------------------- slots

@dataclass(frozen=True)
class Slot:
    """Where one trial runs: GPUs (CUDA_VISIBLE_DEVICES) or none (a CPU slot: empty string)."""

    name: str
    gpus: tuple[int, ...] = ()

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)


def host_gpus(facts: Mapping[str, Any], host: HostConfig) -> list[int]:
    smi = facts.get("nvidia_smi") or {}
    have = [int(g.get("index", i)) for i, g in enumerate(smi.get("gpus") or [])]
    if host.gpus:
        have = [g for g in have if g in host.gpus]
    return have


def plan_slots(facts: Mapping[str, Any], host: HostConfig, gpus: str | None, parallel: int | None,
               slots_per_gpu: int = 1) -> list[Slot]:
    """`--gpus 0,2` → those GPUs (refused up front unless the host has them); default: all of the
    host's GPUs; no GPU → `--parallel` CPU slots. `slots_per_gpu` > 1 shares a GPU between trials."""
    if slots_per_gpu < 1:
        raise UsageError("--slots-per-gpu must be at least 1")
    if parallel is not None and parallel < 1:
        raise UsageError("--parallel must be at least 1")
    have = host_gpus(facts, host)
    if gpus:
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
    else:
        chosen = have
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


# ----------------------------------------------------------------------------------------- storage

def default_study_name(job: JobConfig) -> str:
    return job.name


class StudyStore:
    """Where the study lives, and (for a remote host's default SQLite) the copy kept in step with it."""

    def __init__(self, url: str, *, runner: Runner, lease: str, remote_db: str | None = None,
                 local_db: Path | None = None, label: str | None = None) -> None:
        self.url = url
        self.runner = runner
        self.lease = lease
        self.remote_db = remote_db
        self.local_db = local_db
        self.label = label or url
        self.synced = remote_db is not None
        self.sqlite_path: str | None = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        self._lease_written = 0.0
        self._token = secrets.token_hex(8)  # this driver's mark in the lease: every write checks it
        self.pushes = 0
        self.push_s = 0.0

    @classmethod
    def open(cls, config: Config, host: HostConfig, runner: Runner, paths: runs.HostPaths, study: str,
             storage: str | None) -> StudyStore:
        # one driver per study and host workdir: two would adopt each other's running trials (and two
        # copies of a synced SQLite file would overwrite each other's trials)
        lease = f"{paths.thrust}/studies/{study}.driver.json"
        if storage:
            return cls(storage, runner=runner, lease=lease, label=_redact(storage))
        remote = f"{paths.thrust}/studies/{study}.db"
        if host.is_local:
            Path(remote).parent.mkdir(parents=True, exist_ok=True)
            return cls(f"sqlite:///{remote}", runner=runner, lease=lease, label=f"sqlite:///{remote}")
        local = config.root / ".thrust" / "study-cache" / host.name / f"{study}.db"
        # not pulled here: the caller takes the lease first, then pulls (pulling replaces the local
        # cache, which a driver that already holds the lease may be writing to)
        return cls(f"sqlite:///{local}", runner=runner, lease=lease, remote_db=remote, local_db=local,
                   label=f"{host.name}:{remote}")

    def pull(self) -> None:
        """The host's copy replaces the local cache (the host's is the one that counts)."""
        assert self.runner is not None and self.remote_db is not None and self.local_db is not None
        self.local_db.parent.mkdir(parents=True, exist_ok=True)
        for stale in (self.local_db, *(Path(f"{self.local_db}-{x}") for x in ("journal", "wal", "shm"))):
            stale.unlink(missing_ok=True)
        self.runner.run(["mkdir", "-p", "--", os.path.dirname(self.remote_db)]).check("mkdir studies")
        if self.runner.exists(self.remote_db):
            self.runner.get(self.remote_db, self.local_db)

    def push(self) -> None:
        """A consistent snapshot (sqlite backup) of the local copy onto the host (verified, atomic)."""
        if not self.synced:
            return
        assert self.runner is not None and self.remote_db is not None and self.local_db is not None
        if not self._owned():  # a driver that lost its lease must not overwrite the study
            raise self._lost()
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            snap = Path(tmp) / "snapshot.db"
            src = sqlite3.connect(self.local_db)
            dst = sqlite3.connect(snap)
            try:
                src.backup(dst)
            finally:
                dst.close()
                src.close()
            self.runner.put(snap, self.remote_db)
        self.pushes += 1
        self.push_s += time.monotonic() - t0

    def acquire(self) -> None:
        """Take the study's lease on this host: refused while another driver holds it (a live pid on
        this machine, or a heartbeat younger than LEASE_S from another machine)."""
        for _attempt in range(3):
            got = self.runner.run(["cat", "--", self.lease])
            if got.ok and got.stdout.strip():
                try:
                    other = json.loads(got.stdout)
                except ValueError:
                    other = {}
                age = time.time() - float(other.get("heartbeat") or 0)
                if other.get("hostname") == socket.gethostname():
                    pid = int(other.get("pid") or 0)
                    if pid and pid != os.getpid() and _pid_alive(pid):
                        raise ThrustError(f"this study is already being driven from this machine (pid {pid})",
                                          "wait for it, or stop it: Ctrl-C twice there, or optimize --stop")
                elif age < LEASE_S:
                    raise ThrustError(
                        f"this study is being driven from {other.get('hostname')} (seen {age:.0f} s ago)",
                        f"wait {LEASE_S:.0f} s after it stops; to share one study between machines, give "
                        "each its own host and use --storage postgresql://... (docs/optimize.md)")
                # a dead driver's lease: take it over, then read it back (two takers: one wins)
                self.runner.run(["sh", "-c", 'printf "%s" "$1" > "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"', "sh",
                                 self._body(), self.lease]).check("write the study lease")
                self._lease_written = time.time()
                if not self._owned():
                    continue
                return
            # no lease: create it only if it still does not exist (sh's noclobber is O_EXCL)
            body = self._body()
            made = self.runner.run(["sh", "-c", 'set -C; printf "%s" "$1" > "$2"', "sh", body, self.lease])
            if made.ok:
                self._lease_written = time.time()
                return
        raise ThrustError(f"could not take the study lease {self.lease}")

    def _body(self) -> str:
        return json.dumps({"hostname": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time(),
                           "token": self._token})

    def _owned(self) -> bool:
        return self.runner.run(["grep", "-qF", "--", self._token, self.lease]).ok

    def _lost(self) -> ThrustError:
        return ThrustError(
            f"this driver lost the study lease {self.lease} to another driver (it was silent for more than "
            f"{LEASE_S:.0f} s); stopping here so the two do not overwrite each other's trials",
            "the other driver goes on with the study; its trials include this one's finished ones",
        )

    def heartbeat(self, force: bool = False) -> None:
        """Renew the lease, only while it is still ours (compare-and-swap on the host)."""
        if not force and time.time() - self._lease_written < LEASE_S / 4:
            return
        renewed = self.runner.run([
            "sh", "-c", 'grep -qF -- "$3" "$2" 2>/dev/null || exit 3; '
            'printf "%s" "$1" > "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"', "sh", self._body(), self.lease, self._token,
        ])
        if renewed.exit_code == 3:
            raise self._lost()
        renewed.check("write the study lease")
        self._lease_written = time.time()

    def release(self) -> None:
        """Drop the lease if it is still ours (never another driver's)."""
        self.runner.run(["sh", "-c", 'grep -qF -- "$2" "$1" 2>/dev/null && rm -f -- "$1"; exit 0', "sh",
                         self.lease, self._token])


def _redact(url: str) -> str:
    """postgresql://user:secret@db/x → postgresql://user:***@db/x (for messages and JSON)."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        cred, at, tail = rest.rpartition("@")
        if ":" in cred:
            cred = cred.split(":", 1)[0] + ":***"
        return f"{scheme}://{cred}{at}{tail}"
    return url


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --------------------------------------------------------------------------------------- the study

@dataclass
class OptimizeRequest:
    job: JobConfig
    host: HostConfig
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

    def as_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in (
            "number", "state", "value", "params", "slot", "cuda_visible_devices", "run_id", "step", "total_steps",
            "launched_at", "first_metric_at", "ended_at", "note", "launch_timing")}


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


@dataclass
class _Active:
    view: TrialView
    trial: Any  # optuna.trial.Trial
    slot: Slot
    offset: int = 0
    last: dict[str, Any] = field(default_factory=dict)  # the latest non-null value of each metric
    reported: set[int] = field(default_factory=set)


@dataclass
class Summary:
    study: str
    storage: str
    job: str
    host: str
    metric: str
    trials_target: int
    counts: dict[str, int]
    best: dict[str, Any] | None
    importances: dict[str, float] | None
    importance_note: str | None
    best_params_file: str | None
    slots: list[dict[str, Any]]
    trials: list[TrialView]
    wall_s: float
    stopped: str | None  # why the study stopped before N (abort, timeout, failures), else None
    sync: dict[str, float] = field(default_factory=dict)
    dashboard_url: str | None = None  # what optuna-dashboard opens on this machine

    @property
    def exit_code(self) -> int:
        if self.stopped == "aborted":
            return 130
        return ExitCode.OK if self.best is not None else ExitCode.FAILED

    def as_json(self) -> dict[str, Any]:
        return {
            "study": self.study, "storage": self.storage, "job": self.job, "host": self.host, "metric": self.metric,
            "direction": "maximize", "trials_target": self.trials_target, "counts": self.counts, "best": self.best,
            "importances": self.importances, "importance_note": self.importance_note,
            "best_params_file": self.best_params_file, "slots": self.slots, "wall_s": round(self.wall_s, 3),
            "stopped": self.stopped, "sync": self.sync, "dashboard_url": self.dashboard_url,
            "trials": [t.as_json() for t in self.trials],
        }


class Optimizer:
    """The scheduler: fill free slots with asked trials, poll them, report rungs, prune, tell."""

    MAX_CONSECUTIVE_FAILURES = 3

    def __init__(self, config: Config, request: OptimizeRequest, runner: Runner,
                 reporter: pipeline.Reporter | None = None, observer: Observer | None = None,
                 control: Control | None = None) -> None:
        if request.trials < 1:
            raise UsageError("--trials must be at least 1")
        if request.pruner not in PRUNERS:
            raise UsageError(f"--pruner {request.pruner!r}: expected one of {', '.join(PRUNERS)}")
        if request.metric not in METRICS:
            raise UsageError(f"--metric {request.metric!r}: expected one of {', '.join(METRICS)}")
        self.config = config
        self.request = request
        self.runner = runner
        self.reporter = reporter or pipeline.NullReporter()
        self.observer = observer or NullObserver()
        self.control = control or Control()
        self.job = request.job
        self.host = request.host
        self.study_name = request.study or default_study_name(self.job)
        if not valid_id(self.study_name):
            raise UsageError(f"--study {self.study_name!r}: use letters, digits, '_', '-', '.'")
        self.fixed = pipeline.parse_sets(request.sets)
        self.space = search_space(config, self.job, self.fixed)
        self.dists = distributions(self.space)
        self.injected: dict[str, str] = {}
        job_args = dict(self.job.args)  # type: ignore[arg-type]
        if "log-interval" not in self.fixed and "log-interval" not in job_args:
            self.injected["log-interval"] = DEFAULT_LOG_INTERVAL
        self.views: dict[int, TrialView] = {}
        self.active: dict[int, _Active] = {}
        self.free: list[Slot] = []
        self.slots: list[Slot] = []
        self.rung_steps: int | None = None
        self.consecutive_failures = 0
        self.stopped: str | None = None
        self.by_us: set[str] = set()  # run ids we are stopping (pruned or aborted)
        self.dirty_since: float | None = None  # the local copy has changes the host's lacks

    # -- set-up ---------------------------------------------------------------------------------
    def run(self) -> Summary:
        import optuna

        started = time.monotonic()
        prepared = pipeline.prepare(self.config, self.job, HostSession.open(self.runner, self.host, self.config),
                                    self.reporter, args_for_preflight=self._args({}))
        self.session = prepared.session
        self.prepared = prepared
        self.paths = prepared.paths
        self.slots = plan_slots(prepared.report.facts, self.host, self.request.gpus, self.request.parallel,
                                self.request.slots_per_gpu)
        self.free = list(self.slots)
        self.stop_file = f"{self.paths.thrust}/studies/{self.study_name}.stop"
        self.runner.run(["mkdir", "-p", "--", f"{self.paths.thrust}/studies"]).check("mkdir studies")
        self.store = StudyStore.open(self.config, self.host, self.runner, self.paths, self.study_name,
                                     self.request.storage)
        self.store.acquire()  # before anything is touched: a refused second driver must change nothing
        self.runner.run(["rm", "-f", "--", self.stop_file])
        if self.store.synced:
            self.store.pull()
        self.reporter.step(f"study {self.study_name} in {self.store.label}; slots: "
                           + ", ".join(f"{s.name} (CUDA_VISIBLE_DEVICES={s.cuda_visible_devices!r})"
                                       for s in self.slots))
        self.study = optuna.create_study(
            study_name=self.study_name, storage=self._storage(), direction="maximize", load_if_exists=True,
            sampler=optuna.samplers.TPESampler(seed=self.request.seed, constant_liar=True,
                                               n_startup_trials=min(10, max(2, self.request.trials // 3))),
            pruner=self._pruner(),
        )
        self._remember_settings()
        self.control.started = True
        ok = False
        try:
            self._resume()
            self._loop(started)
            ok = True
        except ConnectionLostError as exc:
            raise ConnectionLostError(
                f"{exc.message}; the running trials go on on {self.host.name}",
                "rerun the same command to continue the study (running trials are adopted)") from None
        finally:
            try:
                if self.control.abort and self.active:
                    self._stop_all("stopped with the study")
                self._push()
                self.store.release()
            except ThrustError:
                if ok:
                    raise
        return self._summary(time.monotonic() - started)

    def _storage(self) -> Any:
        import optuna

        path = self.store.sqlite_path
        if path is None:
            return self.store.url

        def connect() -> sqlite3.Connection:
            # WAL + synchronous=NORMAL: a commit without an fsync (~5 ms instead of ~30 ms; a launch
            # writes several), still safe against corruption; readers (optuna-dashboard) never block us
            conn = sqlite3.connect(path, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            return conn

        return optuna.storages.RDBStorage(self.store.url, engine_kwargs={"creator": connect})

    def _pruner(self) -> Any:
        import optuna

        r = self.request
        if r.pruner == "none":
            return optuna.pruners.NopPruner()
        if r.pruner == "halving":
            return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, r.prune_warmup), reduction_factor=3)
        return optuna.pruners.MedianPruner(n_startup_trials=r.prune_startup, n_warmup_steps=r.prune_warmup)

    def _remember_settings(self) -> None:
        attrs = self.study.user_attrs
        settings = {"job": self.job.name, "space": self.space, "fixed": self.fixed, "metric": self.request.metric}
        old = attrs.get("settings")
        if old is not None and json.loads(json.dumps(old)) != json.loads(json.dumps(settings)):
            self.reporter.warn(f"study {self.study_name} was started with other settings ({old}); "
                               "its earlier trials still count")
        self.study.set_user_attr("settings", settings)
        self.rung_steps = attrs.get("rung_steps")

    def _args(self, params: Mapping[str, Any]) -> list[str]:
        return pipeline.job_arguments(self.job, {**self.injected, **self.fixed}, params)

    # -- resume ---------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Trials RUNNING in the study from an earlier driver on this host: adopt, tell, or retry."""
        from optuna.trial import Trial, TrialState

        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        self._stop_orphans({t.user_attrs.get("run_id") for t in running})
        mine = [t for t in running
                if t.user_attrs.get("host") == self.host.name and t.user_attrs.get("workdir") == self.paths.workdir]
        if not mine:
            return
        self.reporter.step(f"resuming: {len(mine)} trial(s) were running when the last driver stopped")
        answer = self._poll([t.user_attrs["run_id"] for t in mine if t.user_attrs.get("run_id")])
        slots = {s.name: s for s in self.free}
        for frozen in mine:
            run_id = frozen.user_attrs.get("run_id")
            view = self._view_from(frozen)
            info = answer.get(self.paths.run(run_id)) if run_id else None
            state = info["state"] if info else "MISSING"
            slot = slots.get(frozen.user_attrs.get("slot") or (info or {}).get("slot") or "")
            trial = Trial(self.study, frozen._trial_id)
            act = _Active(view, trial, slot or Slot("?"), reported=set(frozen.intermediate_values))
            if state == "RUNNING" and slot is not None:
                self.free.remove(slot)
                del slots[slot.name]
                view.state = "RUNNING"
                self.active[frozen.number] = act
                self.observer.event(f"trial {frozen.number}: adopted its running run {run_id} on {slot.name}")
                continue
            if state == "RUNNING":
                self.observer.event(f"trial {frozen.number}: slot {frozen.user_attrs.get('slot')} is not in this "
                                    "run's slots: stopping it")
                self._stop_run(run_id)
                state = "STOPPED"
            if state == "FINISHED":
                self._drain_metrics(act)
                self.active[frozen.number] = act
                self._finish(act, "FINISHED", None)
            elif state == "FAILED":  # a genuine failure (bad value, OOM): not retried (docs/optimize.md)
                self._drain_metrics(act)
                self.active[frozen.number] = act
                self._finish(act, "FAILED", info.get("exit_code"), info.get("log_tail") or "")
            else:
                self._interrupted(act, f"run {state.lower()} while no driver watched")
        self._push()

    def _stop_orphans(self, known: set[str | None]) -> None:
        """A run of this study that no trial in the study names (its driver died between launching it
        and saving the study) would hold a slot unseen: stop it."""
        for r in runs.list_runs(self.session):
            if r["state"] == "RUNNING" and is_trial_run(r["run_id"], self.study_name) and r["run_id"] not in known:
                self.observer.event(f"stopping {r['run_id']}: a run of this study that no trial names")
                self._stop_run(r["run_id"])

    def _view_from(self, frozen: Any) -> TrialView:
        a = frozen.user_attrs
        view = TrialView(frozen.number, dict(frozen.params), a.get("slot"), a.get("cuda_visible_devices"),
                         a.get("run_id"), launched_at=a.get("launched_at"))
        self.views[frozen.number] = view
        return view

    # -- main loop --------------------------------------------------------------------------------
    def _counts(self) -> dict[str, int]:
        counts = {"COMPLETE": 0, "PRUNED": 0, "FAIL": 0, "RUNNING": 0, "WAITING": 0}
        for t in self.study.get_trials(deepcopy=False):
            counts[t.state.name] = counts.get(t.state.name, 0) + 1
        counts["done"] = counts["COMPLETE"] + counts["PRUNED"]
        return counts

    def _loop(self, started: float) -> None:
        deadline = started + self.request.timeout if self.request.timeout else None
        while True:
            tick = time.monotonic()
            if self.control.abort:
                self.stopped = "aborted"
                return
            counts = self._counts()
            if deadline is not None and tick > deadline and not self.stopped:
                self.stopped = "timeout"
                self.observer.event(f"--timeout {self.request.timeout:g} s reached: no new trials")
            if self.control.drain and not self.stopped:
                self.stopped = "drained"
            # RUNNING in the study counts every driver's running trials (a shared PostgreSQL study)
            while self.free and not self._no_new_trials() and counts["done"] + counts["RUNNING"] < self.request.trials:
                self._launch(self.free.pop(0))
                counts = self._counts()
            self.observer.update(list(self.views.values()), counts)
            if not self.active:
                return
            self._poll_active()  # waits on the host up to poll_s, less when a trial ends
            self.store.heartbeat()
            if self.dirty_since is not None and time.monotonic() - self.dirty_since > PUSH_EVERY_S:
                self._push()

    def _no_new_trials(self) -> bool:
        if self.consecutive_failures >= self.MAX_CONSECUTIVE_FAILURES and not self.stopped:
            self.stopped = "failures"
            self.observer.event(f"{self.consecutive_failures} trials failed in a row: no new trials")
        return self.stopped is not None or self.control.abort

    def _launch(self, slot: Slot) -> None:
        trial = self.study.ask(self.dists)
        params = dict(trial.params)
        run_id = f"{self.study_name}-t{trial.number:03d}-{secrets.token_hex(2)}"
        view = TrialView(trial.number, params, slot.name, slot.cuda_visible_devices, run_id, state="LAUNCHING",
                         launched_at=time.time())
        self.views[trial.number] = view
        # the run id is in the study before the run exists: a driver killed in between is recoverable
        for key, value in (("run_id", run_id), ("slot", slot.name), ("cuda_visible_devices", slot.cuda_visible_devices),
                           ("host", self.host.name), ("workdir", self.paths.workdir),
                           ("launched_at", view.launched_at)):
            trial.set_user_attr(key, value)
        self._push()
        saved = time.time()
        act = _Active(view, trial, slot)
        self.active[trial.number] = act
        try:
            self._start_run(run_id, slot, params, trial.number)
            view.launch_timing = {"save_s": round(saved - view.launched_at, 4),
                                  "launch_s": round(time.time() - saved, 4)}
        except ConnectionLostError:
            raise
        except ThrustError as exc:
            # the answer may have been lost after the run started: never leave one behind on a freed slot
            with contextlib.suppress(ThrustError):
                runs.stop(self.session, run_id)
            self._fail(act, f"launch failed: {exc.message}")
            return
        view.state = "RUNNING"
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in params.items())
        self.observer.event(f"trial {trial.number} on {slot.name}: {shown}")

    def _start_run(self, run_id: str, slot: Slot, params: Mapping[str, Any], number: int) -> None:
        """One trial = one detached run, without `--export`: a trial's ONNX export would cost seconds
        each and nobody reads it (`train --params` makes the model of the best one)."""
        env = {
            "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices,  # "" on a CPU slot: no GPU at all
            "THRUST_STUDY": self.study_name,
            "THRUST_TRIAL": str(number),
            "THRUST_SLOT": slot.name,
        }
        pipeline.launch_prepared(
            self.prepared, args=self._args(params), run_id=run_id, gpus=slot.gpus, nproc=1,
            extra_env=env, lock_job=f"{self.study_name}-trial-{number}", export=False,
            meta_extra={"study": self.study_name, "trial": number, "slot": slot.name, "params": dict(params)},
        )

    def _poll(self, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        answer = self._poll_offsets([(self.paths.run(r), 0) for r in run_ids])
        return answer["runs"]

    def _poll_offsets(self, request: Sequence[tuple[str, int]], wait: float = 0.0) -> dict[str, Any]:
        result = self.session.agent("poll", "--runs", json.dumps(request), "--stop-file", self.stop_file,
                                    "--wait", f"{wait:.3f}", timeout=60 + wait)
        if not result.ok:
            raise ThrustError(f"polling the trials on {self.host.name} failed: {result.stderr.strip()[-300:]}")
        return json.loads(result.stdout.strip().splitlines()[-1])

    def _poll_active(self) -> bool:
        """One poll of every running trial; True when a slot was freed."""
        acts = list(self.active.values())
        before = len(self.free)
        answer = self._poll_offsets([(self.paths.run(a.view.run_id or ""), a.offset) for a in acts],
                                    wait=self.request.poll_s)
        if answer.get("stop") and not self.control.abort:
            self.observer.event("a stop was requested for this study (optimize --stop): stopping the trials")
            self.runner.run(["rm", "-f", "--", self.stop_file])
            self.control.abort = True
        for act in acts:
            info = answer["runs"].get(self.paths.run(act.view.run_id or ""))
            if info is None or act.view.number not in self.active:
                continue
            self._feed(act, info.get("data") or "")
            act.offset = int(info.get("offset", act.offset))
            if act.view.number not in self.active:
                continue  # pruned while feeding
            if info["state"] != "RUNNING" and not info.get("more"):
                self._finish(act, info["state"], info.get("exit_code"), info.get("log_tail") or "")
        return len(self.free) > before

    def _drain_metrics(self, act: _Active) -> None:
        """Read a whole metrics.jsonl (a run that ended while nobody watched)."""
        act.offset = 0
        while True:
            answer = self._poll_offsets([(self.paths.run(act.view.run_id or ""), act.offset)])["runs"]
            got = next(iter(answer.values()))
            self._feed(act, got.get("data") or "", prune=False)
            act.offset = int(got.get("offset", act.offset))
            if not got.get("more"):
                return

    def _feed(self, act: _Active, data: str, prune: bool = True) -> None:
        for line in data.splitlines():
            try:
                m = json.loads(line)
            except ValueError:
                continue
            if not isinstance(m, dict):
                continue
            # a report window in which no episode ended has return_mean null: keep the one before
            act.last.update({k: v for k, v in m.items() if v is not None})
            view = act.view
            if view.first_metric_at is None:
                view.first_metric_at = time.time()
                act.trial.set_user_attr("first_metric_at", view.first_metric_at)
            view.step = int(m.get("step") or 0)
            view.total_steps = m.get("total_steps") or view.total_steps
            if self.rung_steps is None and view.total_steps:
                self.rung_steps = max(1, int(view.total_steps) // RUNGS)
                self.study.set_user_attr("rung_steps", self.rung_steps)
            value = m.get("score_mean" if self.request.metric == "score_mean" else "return_mean")
            if value is None or not math.isfinite(float(value)) or not self.rung_steps:
                continue
            view.intermediate = float(value)
            rung = view.step // self.rung_steps
            new = [r for r in range(1, rung + 1) if r not in act.reported]
            for r in new:
                act.trial.report(float(value), r)
                act.reported.add(r)
            if prune and new and act.trial.should_prune():
                self._prune(act, rung)
                return

    # -- endings ----------------------------------------------------------------------------------
    def _release(self, act: _Active) -> None:
        self.active.pop(act.view.number, None)
        act.view.ended_at = time.time()
        act.trial.set_user_attr("ended_at", act.view.ended_at)
        if act.slot in self.slots and act.slot not in self.free:
            self.free.append(act.slot)
            self.free.sort(key=self.slots.index)

    def _prune(self, act: _Active, rung: int) -> None:
        from optuna.trial import TrialState

        self._stop_run(act.view.run_id)
        self._release(act)
        self.study.tell(act.trial, state=TrialState.PRUNED)
        act.view.state = "PRUNED"
        act.view.note = f"pruned at rung {rung}/{RUNGS}"
        self.consecutive_failures = 0
        self.observer.event(f"trial {act.view.number} pruned at step {act.view.step:,} "
                            f"(return {_fmt(act.view.intermediate)})")
        self._dirty()

    def _finish(self, act: _Active, state: str, exit_code: int | None, log_tail: str = "") -> None:
        run_id = act.view.run_id or ""
        if state == "FINISHED":
            metric, value = self._final_value(act.last)
            if value is None:
                self._fail(act, "finished without the metric (no episode ended?)")
                return
            self._release(act)
            act.trial.set_user_attr("value_metric", metric)
            self.study.tell(act.trial, value)
            act.view.state, act.view.value = "COMPLETE", value
            self.consecutive_failures = 0
            self.observer.event(f"trial {act.view.number} complete: {value:.4g}")
            self._dirty()
        elif state == "FAILED":
            lines = [ln for ln in log_tail.strip().splitlines() if not ln.startswith("THRUST_")]
            last = f": {lines[-1].strip()[:200]}" if lines else ""
            self._fail(act, f"run {run_id} failed (exit code {exit_code}){last}; see thrust-remote logs {run_id} "
                            f"--host {self.host.name}")
        elif run_id in self.by_us:
            self._interrupted(act, "stopped with the study")
        elif state == "STOPPED":
            # someone ran `thrust-remote stop` on a trial: that stops the study (and is retried later)
            self._interrupted(act, "stopped by thrust-remote stop")
            if not self.control.abort:
                self.observer.event(f"trial {act.view.number} was stopped from outside: stopping the study")
                self.control.abort = True
        else:
            self._interrupted(act, f"run {state.lower()}")

    def _final_value(self, last: Mapping[str, Any]) -> tuple[str, float | None]:
        """(the metric used, its value in the trial's last metrics line)."""
        metric = self.request.metric
        if metric == "auto":
            metric = "eval_return" if last.get("eval_return") is not None else "return_mean"
        value = last.get(metric)
        if value is None or not math.isfinite(float(value)):
            return metric, None
        return metric, float(value)

    def _fail(self, act: _Active, why: str) -> None:
        from optuna.trial import TrialState

        self._release(act)
        act.trial.set_user_attr("fail_reason", why)
        self.study.tell(act.trial, state=TrialState.FAIL)
        act.view.state, act.view.note = "FAIL", why
        self.consecutive_failures += 1
        self.observer.event(f"trial {act.view.number} failed: {why}")
        self._dirty()

    def _interrupted(self, act: _Active, why: str) -> None:
        """Not the trial's fault: FAIL it and enqueue its parameters, so the study stays at N."""
        from optuna.trial import TrialState

        self._release(act)
        act.trial.set_user_attr("fail_reason", f"interrupted: {why}")
        self.study.tell(act.trial, state=TrialState.FAIL)
        self.study.enqueue_trial(dict(act.view.params), user_attrs={"retry_of": act.view.number})
        act.view.state, act.view.note = "FAIL", f"interrupted ({why}); will be retried"
        self.observer.event(f"trial {act.view.number} interrupted ({why}); its parameters are queued again")
        self._dirty()

    def _stop_run(self, run_id: str | None) -> None:
        if not run_id:
            return
        self.by_us.add(run_id)
        try:
            runs.stop(self.session, run_id, grace=10.0)
        except ConnectionLostError:
            raise
        except ThrustError as exc:
            self.reporter.warn(f"stopping {run_id}: {exc.message}")

    def _stop_all(self, why: str) -> None:
        for act in list(self.active.values()):
            self._stop_run(act.view.run_id)
            self._interrupted(act, why)

    def _push(self) -> None:
        self.store.push()
        self.dirty_since = None

    def _dirty(self) -> None:
        """An ending needs no push of its own: the host's copy still says RUNNING, and a rerun tells
        such a trial again from its run (same metrics, same value). The next launch's push carries it,
        or the periodic one (PUSH_EVERY_S), or the last one."""
        if self.dirty_since is None:
            self.dirty_since = time.monotonic()

    # -- the end ----------------------------------------------------------------------------------
    def _summary(self, wall: float) -> Summary:
        from optuna.trial import TrialState

        counts = self._counts()
        best = None
        try:
            bt = self.study.best_trial
            best = {"number": bt.number, "value": bt.value, "params": dict(bt.params),
                    "run_id": bt.user_attrs.get("run_id"), "metric": bt.user_attrs.get("value_metric")}
        except ValueError:
            pass
        importances, note = None, None
        complete = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        if len(complete) >= 2:
            importances, note = param_importances(self.study)
        else:
            note = "needs at least 2 complete trials"
        best_file = None
        if best is not None:
            out = self.request.out or (self.config.root / f"{self.study_name}-best.yaml")
            write_best_params(out, self.study_name, self.job.name, best, self.fixed)
            best_file = str(out)
        for frozen in self.study.get_trials(deepcopy=False):
            if frozen.number not in self.views and frozen.user_attrs.get("host") == self.host.name:
                view = self._view_from(frozen)
                view.state = frozen.state.name
                view.value = frozen.value
                view.ended_at = frozen.user_attrs.get("ended_at")
                view.first_metric_at = frozen.user_attrs.get("first_metric_at")
        trials = sorted(self.views.values(), key=lambda v: v.number)
        sync = {"pushes": self.store.pushes, "push_s": round(self.store.push_s, 3)} if self.store.synced else {}
        return Summary(self.study_name, self.store.label, self.job.name, self.host.name, self.request.metric,
                       self.request.trials, counts, best, importances, note, best_file,
                       [{"name": s.name, "cuda_visible_devices": s.cuda_visible_devices} for s in self.slots],
                       trials, wall, None if counts["done"] >= self.request.trials else self.stopped, sync,
                       self.store.url if self.store.url.startswith("sqlite") else self.store.label)


def param_importances(study: Any) -> tuple[dict[str, float] | None, str | None]:
    """fANOVA when Optuna can compute it here, else PED-ANOVA; a reason instead of an exception."""
    import optuna

    errors = []
    for evaluator in (optuna.importance.FanovaImportanceEvaluator, optuna.importance.PedAnovaImportanceEvaluator):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = optuna.importance.get_param_importances(study, evaluator=evaluator())
            return {k: round(float(v), 4) for k, v in result.items()}, evaluator.__name__
        except Exception as exc:  # noqa: BLE001 - any evaluator failure is just "not computable"
            errors.append(f"{evaluator.__name__}: {exc}")
    return None, "; ".join(errors)


def write_best_params(path: Path, study: str, job: str, best: Mapping[str, Any], fixed: Mapping[str, Any]) -> None:
    """The YAML that `thrust-remote train JOB --params FILE` reads: the searched values plus the flags
    fixed with --set during the study (so the run is the trial's run)."""
    params = {**{k: _plain(v) for k, v in best["params"].items()}, **{k: _plain(v) for k, v in fixed.items()}}
    body = {"params": params, "study": study, "job": job, "trial": best["number"], "value": best["value"]}
    text = (f"# best trial of study {study} (thrust-remote optimize)\n"
            f"# use it with: thrust-remote train {job} --params {path.name}\n" + yaml.safe_dump(body, sort_keys=False))
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    """--set values arrive as strings: give numbers back their type so the YAML reads naturally."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                continue
    return value


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def is_trial_run(run_id: object, study: str) -> bool:
    """Run ids of a study's trials: `<study>-t<number>-<4 hex>` (so study `a` never matches `a-t2`'s)."""
    return bool(re.fullmatch(re.escape(study) + r"-t\d+-[0-9a-f]{4}", str(run_id)))


def request_stop(runner: Runner, host: HostConfig, config: Config, study: str) -> list[str]:
    """Stop a study from anywhere: tell its driver (the stop file), then stop its running trials."""
    session = HostSession.open(runner, host, config)
    paths = session.paths
    runner.run(["mkdir", "-p", "--", f"{paths.thrust}/studies"]).check("mkdir studies")
    runner.run(["sh", "-c", 'date > "$1"', "sh", f"{paths.thrust}/studies/{study}.stop"]).check("write stop file")
    stopped = []
    for r in runs.list_runs(session):
        if r["state"] == "RUNNING" and is_trial_run(r["run_id"], study):
            runs.stop(session, r["run_id"])
            stopped.append(r["run_id"])
    return stopped

