"""`thrust-remote train JOB`: sync → preflight → setup → launch → follow → fetch.

`train()` owns the whole sequence and reports through a Reporter; it never prints (the CLI renders,
the overhead bench passes a silent reporter). Every stage is also a function of its own, so optimize
(many runs from one prepared host) and tests can use them one by one. The job's config becomes one
plain spec (buildenv.job_spec) once, in `prepare`, and that spec is what every stage and the host
see (docs/architecture.md, "The flow of one train").
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from thrust_remote.agent.protocol import GPUS_USED, RESUMED_FROM, RUN_DIR_PREFIX, RunState
from thrust_remote.core.config import CHECKPOINT_FIELD, Config, HostConfig, JobConfig, parse_params, text_problem
from thrust_remote.core.errors import (
    ConnectionLostError,
    Detached,
    ExitCode,
    ThrustError,
    TransferError,
    UsageError,
)
from thrust_remote.core.hints import command_hint
from thrust_remote.core.names import valid_id
from thrust_remote.doctor import checklist
from thrust_remote.fetch import artifacts, checkpoints, models
from thrust_remote.host import payload
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import buildenv, cargo, jobs, pins
from thrust_remote.run.buildenv import JobSpec
from thrust_remote.run.cargo import CargoPlan
from thrust_remote.run.gpus import host_gpus, select_gpus
from thrust_remote.run.preflight import check_local_python, envcheck_report, preflight
from thrust_remote.run.sync import LocalState, SyncResult, local_state, sync
from thrust_remote.run.venv import setup_python
from thrust_remote.runs import control
from thrust_remote.runs.progress import LineSplitter, RunProgress
from thrust_remote.runs.pull import Pulled
from thrust_remote.runs.scalarwatch import ScalarSource, ScalarWatch
from trainer.args import parse_flag


class Stage(str, Enum):
    """The stages of a run, in order (docs/architecture.md, "The flow of one train"): what a caller asks
    `lifecycle.train` to run, and the keys of `timings` (`train --json`)."""

    SYNC = "sync"
    PREFLIGHT = "preflight"
    SETUP = "setup"
    LAUNCH = "launch"
    FOLLOW = "follow"
    FETCH = "fetch"

    def __str__(self) -> str:
        return self.value


ARTIFACTS_TIMING = "artifacts"  # the fetch stage's second part (the job's files), timed apart
CHECKPOINT_TIMING = "checkpoint"  # the newest checkpoint pulled when a followed run ended (fetch/checkpoints.py)


class Reporter(Protocol):
    """What the pipeline tells its caller. Following a run adds four calls: `following` when the
    log starts, `log` with its bytes exactly as the host wrote them (progress is parsed from them:
    THRUST_METRICS lines), `metrics` with a metrics object read elsewhere (a job's TensorBoard
    scalars, from another thread), `followed` when following ends for any reason (end, detach, lost link).
    `queued` comes first when the followed run still waits in its host's queue (its log starts later);
    `pulled` after each pull of the run's checkpoint and artifacts while it is followed (runs/pull.py,
    from another thread)."""

    def step(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def queued(self, host: str, position: int | None) -> None: ...
    def pulled(self, pulled: Pulled) -> None: ...
    def following(self, run_id: str, offset: int) -> None: ...
    def log(self, chunk: bytes) -> None: ...
    def metrics(self, obj: dict[str, Any]) -> None: ...
    def followed(self) -> None: ...


class NullReporter:
    """Says nothing; a base for reporters that only care about some of the calls."""

    def step(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def queued(self, host: str, position: int | None) -> None:
        pass

    def pulled(self, pulled: Pulled) -> None:
        pass

    def following(self, run_id: str, offset: int) -> None:
        pass

    def log(self, chunk: bytes) -> None:
        pass

    def metrics(self, obj: dict[str, Any]) -> None:
        pass

    def followed(self) -> None:
        pass


@dataclass(frozen=True)
class ResumeFrom:
    """What `resume` continues (run/resume.py): the run, the code it ran (commit + its uncommitted patch),
    its checkpoint (`local`: a pulled, verified copy that goes to every node; else `on_host`: its path on
    the one host the new run goes to) and the arguments that continue from it ("{checkpoint}" filled)."""

    run_id: str
    commit: str | None
    patch: bytes
    template: tuple[str, ...]
    local: Path | None = None
    local_sha256: str | None = None
    on_host: str | None = None
    label: str = ""  # the checkpoint as the messages name it


@dataclass
class TrainRequest:
    job: JobConfig
    host: HostConfig
    gpus: str | None = None  # "N" (first N free) or "0,2" (those)
    nproc: int | None = None  # processes under torchrun; default: one per selected GPU
    sets: Sequence[str] = ()  # KEY=VALUE overrides of the job's args
    params_file: Path | None = None  # YAML of parameters (optimize's best params)
    run_id: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    detach: bool = False  # return once the run has started
    share_gpus: bool = False  # --allow-shared-gpus: run on GPUs a RUNNING run holds
    fetch: bool = True  # fetch the model when the run finished
    force: bool = False  # place the fetched model even when it scores clearly worse than the placed one
    queue: bool = False  # --queue: wait on the host for the GPUs (or a CPU slot) instead of refusing
    sync_every: float | None = None  # --sync-every: seconds between pulls while followed (None: the job's)
    resume: ResumeFrom | None = None  # `resume`: the run continued, its code and its checkpoint
    params: Mapping[str, Any] | None = None  # parameters given as data (a resumed run's), under params_file's


@dataclass
class Launched:
    run_id: str
    run_dir: str
    pid: int | None  # None while it waits in the host's queue
    host: str
    job: str
    commit: str | None
    paths: HostPaths
    sync: SyncResult | None
    setup_skipped: bool
    timings: dict[str, float]
    spec: JobSpec = field(default_factory=dict)  # the job as the host saw it (buildenv.job_spec)
    position: int | None = None  # its place in the host's queue when it had to wait (1: next)

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "run_dir": self.run_dir, "pid": self.pid,
                "job": self.job, "commit": self.commit,
                **({"state": RunState.QUEUED.value, "position": self.position} if self.position
                   else {"state": RunState.RUNNING.value})}


@dataclass
class TrainOutcome:
    """What `train` (or a reattach, `reattach`) did. `status` is None when detached; `fetched` None when
    not fetched; `fetchable` False for a run that is not a train run of a configured job (an optimize
    trial: nothing to fetch); `progress` what its log said (the last metrics, THRUST_DONE)."""

    launched: Launched
    status: dict | None
    fetched: models.FetchResult | None
    exit_code: int
    timings: dict[str, float]
    progress: RunProgress = field(default_factory=RunProgress)
    fetchable: bool = True
    artifacts: artifacts.DirFetch | None = None  # the job's artifacts, when fetched (fetch/artifacts.py)
    checkpoint: checkpoints.CheckpointPull | None = None  # its newest checkpoint, when pulled at the end
    pulled: Pulled | None = None  # the last pull while it was followed
    attempts: list[dict[str, Any]] = field(default_factory=list)  # a retried run's chain, first attempt first

    def as_json(self, wall_s: float) -> dict[str, Any]:
        """`train --json` (attached) and `logs -f --json`: docs/architecture.md, "JSON shapes"."""
        status = self.status or {}
        fetched = self.fetched
        return {
            "run_id": self.launched.run_id, "host": self.launched.host, "job": self.launched.job,
            "commit": self.launched.commit, "run_dir": self.launched.run_dir,
            "state": status.get("state"), "exit_code": self.exit_code, "job_exit_code": status.get("exit_code"),
            "failed_node": status.get("failed_node"),
            "model": str(fetched.model) if fetched else None, "manifest": str(fetched.manifest) if fetched else None,
            "sha256": fetched.sha256 if fetched else None, "bytes": fetched.bytes if fetched else None,
            "artifacts": self.artifacts.as_json() if self.artifacts else None,
            "checkpoint": self.checkpoint.as_json() if self.checkpoint else None,
            "last_pull": self.pulled.as_json() if self.pulled else None,
            **({"resumed_from": status["resumed_from"]} if status.get("resumed_from") else {}),
            **({"attempts": self.attempts} if self.attempts else {}),
            **self.progress.summary(),
            "wall_s": round(wall_s, 3), "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


# ------------------------------------------------------------------------------------------ args

def parse_sets(sets: Sequence[str]) -> dict[str, str | bool]:
    """`--set KEY=VALUE` as thrust.yaml's `args:` mapping takes it: `KEY` alone or `KEY=true` is a bare
    flag (`--KEY`, as `{KEY: true}`), `KEY=false` leaves the flag out; any other value is a string."""
    out: dict[str, str | bool] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not valid_id(key) or key.startswith("-"):
            raise UsageError(f"--set {item!r}: expected KEY=VALUE (or KEY alone, a bare --KEY) with KEY like "
                             "total-steps")
        problem = text_problem(value)  # a NUL, or undecodable bytes on the command line: no host can take it
        if problem:
            raise UsageError(f"--set {key}: a value that {problem}")
        out[key] = True if not sep else {"true": True, "false": False}.get(value.strip().lower(), value)
    return out


def load_params(path: Path) -> dict[str, Any]:
    """A params file: a YAML mapping of flag -> value (what `optimize` writes), read as thrust.yaml is
    (core/config.py: parse_params; a config error at its line)."""
    return parse_params(path)


def job_arguments(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The job's own args, then the params file, then --set (last wins: argparse keeps the last);
    a command job gets KEY=VALUE words (jobs.arguments, docs/architecture.md "Config")."""
    return jobs.arguments(job, sets, params)


def check_trainer_args(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    """The built-in trainer's flags, checked here against its own table (trainer/args.py) before
    anything is synced: an unknown name, a bad type, a value outside its choices or range is a usage
    error (64) naming where it came from, not an argparse dump from the host and a FAILED run."""
    if job.kind != "trainer":
        return  # your own code's flags are its own business: it sees them as given
    sources = [(dict(job.args), f"jobs.{job.name}.args"), (params, "--params"), (sets, "--set")]  # type: ignore[arg-type]
    for values, where in sources:
        for key, value in values.items():
            if value is None or value is False:
                continue
            try:
                parse_flag(str(key), "true" if value is True else str(value))
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}",
                                 "python -m trainer.train --help lists every flag with its range") from None


# ------------------------------------------------------------------------------------------ sequence

@dataclass
class Prepared:
    """A host ready to run a job: synced, checked, set up. Launch any number of runs from it."""

    config: Config
    job: JobConfig
    spec: JobSpec  # the job as the host sees it, converted once (buildenv.job_spec)
    session: HostSession
    report: checklist.Report
    env: dict[str, str]
    cwd: str
    python: str  # the interpreter that runs the job: the job's venv python (the host's own for cargo jobs)
    local: LocalState | None
    sync: SyncResult | None
    setup_skipped: bool
    timings: dict[str, float]
    trainer: str | None = None  # the built-in trainer's zipapp on the host (kind: trainer)
    cargo: CargoPlan | None = None  # a cargo job's build and run on this host, computed once (run/cargo.py)

    @property
    def host(self) -> HostConfig:
        return self.session.host

    @property
    def paths(self) -> HostPaths:
        return self.session.paths


def _sync_stage(config: Config, session: HostSession, reporter: Reporter,
                code_at: ResumeFrom | None = None) -> tuple[LocalState | None, SyncResult | None]:
    """What we run: the exact local commit (synced to a remote host; the project itself when local);
    `code_at`: a resumed run's commit and patch instead (the code the run it continues ran)."""
    local: LocalState | None
    try:
        local = local_state(config.root)
    except ThrustError:
        if not session.host.is_local:
            raise
        local = None
    if code_at is not None and code_at.commit and local is not None:
        local = _at_run_code(local, code_at, session, reporter)
    if not session.host.is_local:
        assert local is not None
        reporter.step(f"syncing {local.commit[:12]} to {session.name}:{session.paths.workdir}")
        # a queued run will start on this checkout: it counts as using it, as a running one does
        live = lambda: [r["run_id"] for r in control.list_runs(session) if RunState.of(r["state"]).is_live]  # noqa: E731
        result = sync(session, local, step=reporter.step, busy=live)
        for w in result.warnings:
            reporter.warn(w)
        return local, result
    if local is None:
        # allowed (the code is what stands here), but nothing records which code ran, and the run's
        # .thrust/ (and a model's web/public/) go into this directory: say both
        reporter.warn(f"{config.root} is not in a git project: the run's code is not recorded as a commit, and "
                      f"its files go under {config.root}/.thrust (`git init` here, or run from your project)")
        return None, None
    if local.dirty:
        reporter.warn("the working tree has uncommitted changes: they are what runs (recorded in run.json)")
    return local, SyncResult(local.commit, "local", local.dirty, local.patch_sha256, local.untracked)


def _at_run_code(local: LocalState, code_at: ResumeFrom, session: HostSession, reporter: Reporter) -> LocalState:
    """The laptop's state moved to the code a resumed run ran: its commit with its patch. The host
    `local` runs the working tree as it stands: a difference is said, not hidden."""
    assert code_at.commit is not None
    same = local.commit == code_at.commit and local.patch == code_at.patch
    if same:
        return local
    if session.host.is_local:
        reporter.warn(f"the working tree is not the code run {code_at.run_id} ran ({code_at.commit[:12]}"
                      f"{' + its patch' if code_at.patch else ''}): on host local the tree as it stands runs")
        return local
    # a warning, not a step: what runs is not the tree in front of you (said under --json too)
    reporter.warn(f"resuming at run {code_at.run_id}'s code: {code_at.commit[:12]}"
                  f"{' + its uncommitted patch' if code_at.patch else ''} (your tree is at {local.commit[:12]})")
    return replace(local, commit=code_at.commit, patch=code_at.patch, untracked=(), lfs=None)


@dataclass
class Checked:
    """A host synced and checked (preflight passed), not yet set up: where several nodes are compared
    before any of them installs anything (multinode.py)."""

    config: Config
    job: JobConfig
    spec: JobSpec
    session: HostSession
    report: checklist.Report
    local: LocalState | None
    sync: SyncResult | None
    timings: dict[str, float]


def prepare(config: Config, job: JobConfig, session: HostSession, reporter: Reporter | None = None,
            *, args_for_preflight: Sequence[str] = ()) -> Prepared:
    """sync (remote hosts) → envcheck preflight → setup (python deps / cargo build), each timed."""
    reporter = reporter or NullReporter()
    return set_up(check(config, job, session, reporter, args_for_preflight=args_for_preflight), reporter)


def check(config: Config, job: JobConfig, session: HostSession, reporter: Reporter, *,
          args_for_preflight: Sequence[str] = (), code_at: ResumeFrom | None = None) -> Checked:
    """sync (remote hosts) → envcheck preflight: the host runs this commit and can run the job."""
    check_local_python(session, job)
    spec = buildenv.job_spec(job)  # the one conversion: from here on the host's view of the job
    label = jobs.config_label(config.path)
    jobs.check_before_sync(job, session, config.root, label)  # a script that cannot be there: before syncing
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    local, sync_result = _sync_stage(config, session, reporter, code_at)
    if job.kind != "cargo":
        jobs.check_on_host(session, job, session.paths.workdir, label)
    timings[Stage.SYNC] = time.monotonic() - t0

    t1 = time.monotonic()
    reporter.step(f"checking {session.name} (envcheck)")
    report = envcheck_report(session, spec)
    preflight(report, spec, [*job_arguments(job, {}, {}), *args_for_preflight], session)
    if job.kind != "cargo":  # a torch pin the host cannot meet: refused before any venv is built
        root = Path(session.paths.workdir) if session.host.is_local else (local.root if local else config.root)
        line = job.lines.get("requirements")
        pins.check_job(session, job.requirements, job.requirements_file, root, report.facts,
                       f"{label}:{line}: jobs.{job.name}.requirements" if line else f"{label}: jobs.{job.name}",
                       label)
    timings[Stage.PREFLIGHT] = time.monotonic() - t1
    return Checked(config, job, spec, session, report, local, sync_result, timings)


def set_up(checked: Checked, reporter: Reporter) -> Prepared:
    """The job's venv (python deps, the trainer zipapp) or its cargo build, cached per host."""
    job, session, report, sync_result = checked.job, checked.session, checked.report, checked.sync
    t2 = time.monotonic()
    plan = cargo.plan(report.facts, checked.spec) if job.kind == "cargo" else None
    env = dict(plan.env if plan else buildenv.build_env(report.facts, checked.spec))
    if sync_result is not None:
        env.setdefault("THRUST_COMMIT", sync_result.commit)
    trainer = None
    if plan is not None:
        skipped = cargo.setup_cargo(session, plan, report, sync_result, reporter)
        cwd = plan.crate_dir
        python = payload.python_of(session.runner, session.host)
    else:
        venv = setup_python(session, job, report.facts, checked.local, reporter)
        skipped, python, trainer = venv.skipped, venv.python, venv.trainer
        cwd = session.paths.workdir
    timings = {**checked.timings, Stage.SETUP: time.monotonic() - t2}
    return Prepared(checked.config, job, checked.spec, session, report, env, cwd, python=python,
                    local=checked.local, sync=sync_result, setup_skipped=skipped, timings=timings, trainer=trainer,
                    cargo=plan)


def launch_prepared(prepared: Prepared, *, args: Sequence[str], run_id: str | None = None,
                    gpus: Sequence[int] = (), nproc: int | None = None, extra_env: Mapping[str, str] | None = None,
                    exclusive_gpus: bool = False, reporter: Reporter | None = None, export: bool = True,
                    meta_extra: Mapping[str, Any] | None = None, rdzv: jobs.Rendezvous | None = None,
                    queue: control.QueueAsk | None = None) -> Launched:
    """Start one detached run. `args` are the job's arguments (job_arguments); `gpus` become
    CUDA_VISIBLE_DEVICES and GPU_LIST; `nproc` processes under torchrun (default: the job's `nproc:`,
    else one per GPU); `exclusive_gpus` makes the host refuse the launch when a RUNNING run holds one of
    them (runs of the same job and code otherwise run side by side, each in its own run dir);
    `export=False` skips the ONNX export (seconds per run that a hyperparameter trial does not need);
    `meta_extra` goes into run.json; `rdzv`: this node's part of a run over several hosts (multinode.py);
    `queue`: it waits on the host for what it asks when that is taken (`--gpus N`: chosen there).
    The argv and env of each kind: jobs.py (docs/architecture.md, "Config")."""
    reporter = reporter or NullReporter()
    t3 = time.monotonic()
    job, session = prepared.job, prepared.session
    run_id = control.check_run_id(run_id) if run_id else control.new_run_id(job.name)
    run_dir = session.paths.run(run_id)
    env = jobs.job_env(job, {**prepared.env, **(extra_env or {})}, run_id=run_id, run_dir=run_dir,
                       python=prepared.python, gpus=gpus, export=export)
    if prepared.cargo is not None:
        argv = prepared.cargo.run_argv(list(args))
    else:
        argv = jobs.job_argv(job, prepared.python, args, run_dir=run_dir,
                             nproc=jobs.process_count(job, nproc, gpus or range(queue.count if queue else 0)),
                             export=export, trainer=prepared.trainer,
                             rdzv=rdzv)
    sync_result = prepared.sync
    if job.idle_stop and not host_gpus(prepared.report.facts, session.host):
        reporter.warn(f"idle_stop: {session.name} has no GPUs that nvidia-smi lists: it watches GPUs, so it will "
                      "never stop this run")
    meta = {
        "argv": argv,
        "env_keys": sorted(env),
        # the values thrust-remote computed (CUDA_VISIBLE_DEVICES, LD_*, RUSTFLAGS...); the job's own
        # `env:` may hold secrets (API keys): only their names are recorded
        "env": {k: v for k, v in env.items() if k not in job.env},
        "facts": {k: prepared.report.facts.get(k)
                  for k in ("hostname", "python", "python_path", "torch", "cuda_available")},
        "gpus": list(gpus),
        # what GPU-hours count: the GPUs chosen, else every GPU the job can see there (a job given
        # none sees them all; --gpus makes the account exact)
        GPUS_USED: list(gpus) or host_gpus(prepared.report.facts, session.host),
        **({"idle_stop": dict(job.idle_stop)} if job.idle_stop else {}),
        **(sync_result.as_meta() if sync_result else {"commit": None}),
        **(meta_extra or {}),
    }
    reporter.step(f"launching run {run_id}")
    answer = control.launch(session, run_id=run_id, job=job.name, argv=argv, cwd=prepared.cwd, env=env,
                         meta={**meta, "job": job.name}, claim_gpus=gpus if exclusive_gpus else (), queue=queue)
    timings = {**prepared.timings, Stage.LAUNCH: time.monotonic() - t3}
    if sync_result is not None and sync_result.dirty and prepared.local is not None:
        _save_patch(session, run_dir, prepared.local)
    pid = answer.get("pid")
    if answer.get("queued"):
        reporter.step(f"run {run_id} waits in {session.name}'s queue (position {answer.get('position')}): "
                      "it starts by itself when what it asks frees")
    return Launched(run_id, run_dir, int(pid) if pid is not None else None, session.name, job.name,
                    sync_result.commit if sync_result else None, session.paths, sync_result, prepared.setup_skipped,
                    timings, prepared.spec, position=answer.get("position") if answer.get("queued") else None)


RESUME_DIR = "resume"  # under the new run's directory: the checkpoint it starts from


def place_checkpoint(prepared: Prepared, resume: ResumeFrom, run_id: str, *, relative: bool) -> str:
    """The checkpoint a resumed run starts from, where its job can read it on this node: the run's own
    file when it stays on the host that has it, else the pulled copy uploaded (verified: sha256 on both
    ends) into the new run's directory (0700). `relative`: the path from the job's cwd (the checkout, a
    cargo job's crate), the same on every node of a run over several hosts (each has its own workdir)."""
    session = prepared.session
    if resume.on_host is not None:
        return resume.on_host
    assert resume.local is not None
    run_dir = session.paths.run(run_id)
    session.runner.run(["mkdir", "-p", "-m", "700", "--", run_dir]).check(f"mkdir {run_dir} on {session.name}")
    target = f"{run_dir}/{RESUME_DIR}/{resume.local.name}"
    sha = session.runner.put(resume.local, target)
    if sha != resume.local_sha256:  # the copy here changed since it was verified: never start from it
        raise TransferError(f"the checkpoint {resume.local} changed while it was sent to {session.name} "
                            f"({sha[:12]}, verified {str(resume.local_sha256)[:12]}): not resumed from",
                            "fetch it again from the run's host, or resume where the run's checkpoints are")
    return posixpath.relpath(target, prepared.cwd) if relative else target


def resume_args(resume: ResumeFrom, path: str) -> list[str]:
    """The job's `resume:` template with "{checkpoint}" filled."""
    return [word.replace(CHECKPOINT_FIELD, path) for word in resume.template]


def resume_meta(request: TrainRequest) -> dict[str, Any]:
    """run.json's link to the run a resumed run continues."""
    return {RESUMED_FROM: request.resume.run_id} if request.resume is not None else {}


def choose_gpus(request: TrainRequest, facts: Mapping[str, Any], taken: Callable[[], Mapping[int, str]]) -> list[int]:
    """`--gpus`: a list is taken as given (the host refuses GPUs a RUNNING run holds, unless
    shared); a count picks among the GPUs no RUNNING run holds (`taken`: GPU -> run id)."""
    spec = (request.gpus or "").strip()
    if not spec.isdigit():
        return select_gpus(request.gpus, facts, request.host)
    held = taken()
    free = [g for g in host_gpus(facts, request.host) if g not in held]
    if held and int(spec) > len(free):
        other = sorted(set(held.values()))[0]
        raise ThrustError(
            f"--gpus {spec}: {request.host.name} has {len(free)} GPU(s) free; "
            f"{', '.join(f'GPU {g}: {r}' for g, r in sorted(held.items()))} (RUNNING)",
            f"{control.see_or_stop(other, request.host)}; or share them with --allow-shared-gpus",
        )
    return select_gpus(request.gpus, facts, replace(request.host, gpus=tuple(free)) if held else request.host)


def queue_ask(request: TrainRequest, facts: Mapping[str, Any],
              order: float | None) -> tuple[list[int], control.QueueAsk]:
    """`train --queue`: the GPUs to claim now (a list given, or every GPU of the host when none is asked:
    the run would see them all) and what it waits for; `--gpus N` is chosen on the host when it starts.
    A request that can never fit is refused here (64), before anything is sent."""
    spec = (request.gpus or "").strip()
    have = host_gpus(facts, request.host)
    if spec.isdigit():
        select_gpus(spec, facts, request.host)  # more than the host has: refused now, it never fits
        return [], control.QueueAsk(order, count=int(spec), pool=tuple(have))
    gpus = select_gpus(spec, facts, request.host) if spec else have
    return gpus, control.QueueAsk(order, gpus=tuple(gpus), cpu_slots=request.host.cpu_slots)


def _save_patch(session: HostSession, run_dir: str, local: LocalState) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
        tmp.write(local.patch)
        tmp.flush()
        session.runner.put(tmp.name, f"{run_dir}/uncommitted.patch")


def reattach_command(run_id: str, host: HostConfig, offset: int | None = None,
                     config_path: Path | str | None = None, node: int | None = None) -> str:
    """`logs RUN --follow`: the progress view again and, for a train run, the fetch at its end (`node`:
    a run over several hosts whose node `node`'s log was followed)."""
    args = [run_id, "--follow", *(["--node", str(node)] if node else []),
            *(["--offset", str(offset)] if offset else [])]
    return command_hint("logs", *args, host=host, config=config_path)


def fetch_command(run_id: str, host: HostConfig, config_path: Path | str | None = None) -> str:
    return command_hint("fetch", run_id, host=host, config=config_path)


@dataclass
class Followed:
    """A followed run's end: its status, the log offset reached and what the log said."""

    status: dict
    offset: int
    progress: RunProgress


def follow(session: HostSession, run_id: str, reporter: Reporter, *, offset: int = 0,
           config_path: Path | str | None = None, scalars: ScalarSource | None = None,
           node: int | None = None) -> Followed:
    """Stream the log to the reporter until the run ends; with `scalars`, the job's TensorBoard
    scalars are read on the host meanwhile (every few seconds, and at the end) as its progress.

    Ctrl-C detaches (Detached, exit 75) and a lost link is ConnectionLostError (75); both carry the
    command that reattaches from the byte offset reached, so no byte is lost or repeated (and
    `config_path`, the --config the user gave, and `node`, the node of a run over several hosts, so the
    command is exactly the one to type)."""
    host = session.host
    delivered = 0
    lines, progress = LineSplitter(), RunProgress()

    def on_bytes(chunk: bytes) -> None:
        nonlocal delivered
        delivered += len(chunk)  # counted first: a Ctrl-C while it is shown must not replay it
        reporter.log(chunk)
        for line in lines.feed(chunk):
            progress.take(line)

    def on_metrics(obj: dict[str, Any]) -> None:
        progress.take_metrics(obj)
        reporter.metrics(obj)

    reporter.following(run_id, offset)
    try:
        try:
            with _watching(session, scalars, on_metrics, reporter.warn):
                position = control.follow_log(session, run_id, offset=offset, follow=True, on_bytes=on_bytes)
        finally:
            reporter.followed()
    except KeyboardInterrupt:
        reached = offset + delivered  # nothing shown yet: the command has no --offset to explain
        where = "from where you left; without --offset for the whole log; " if reached else ""
        raise Detached(
            f"from run {run_id}; it goes on on {host.name}",
            f"reattach with: {reattach_command(run_id, host, reached, config_path, node)}   ({where}stop it with: "
            f"{command_hint('stop', run_id, host=host, config=config_path)})",
        ) from None
    except ConnectionLostError as exc:
        reached = exc.offset if exc.offset is not None else offset + delivered
        raise ConnectionLostError(
            f"connection to {host.name} lost while following run {run_id}; the run goes on",
            f"reattach with: {reattach_command(run_id, host, reached, config_path, node)}",
        ) from None
    for line in lines.close():
        progress.take(line)
    return Followed(control.status(session, run_id), position, progress)


def _watching(session: HostSession, source: ScalarSource | None, on_metrics: Callable[[dict[str, Any]], None],
              on_warn: Callable[[str], None]) -> AbstractContextManager[Any]:
    return ScalarWatch(session, source, on_metrics, on_warn) if source is not None else nullcontext()


# The codes thrust-remote itself means something by (64 usage .. 78 config): a job's own 75 passed on would
# read as "connection lost, reattach" to a script branching on ours, so those become 1 (FAILED); the
# job's code stays in the message and in `--json`'s job_exit_code.
OURS = range(ExitCode.USAGE, ExitCode.CONFIG + 1)


def exit_code_for(status: dict) -> int:
    """A run's exit code as the CLI's: 0 when FINISHED, the job's own code (1 where it is one of ours), else 1."""
    if status.get("state") == RunState.FINISHED:
        return 0
    code = status.get("exit_code")
    if isinstance(code, int) and code != 0 and code not in OURS:
        return code
    return ExitCode.FAILED


def fetch_finished(config: Config, session: HostSession, launched: Launched, job: JobConfig, status: dict,
                   reporter: Reporter, *, force: bool, timings: dict[str, float],
                   ) -> tuple[models.FetchResult | None, artifacts.DirFetch | None]:
    """A FINISHED run's model (when the job exports one) and artifacts, each timed into `timings`;
    its newest checkpoint is pulled by the caller (`pull_checkpoint`), as for any end."""
    fetched = None
    t0 = time.monotonic()
    if exports_model(job):
        reporter.step("fetching the model")
        fetched = finish(config, session, job, launched.run_dir, run_id=launched.run_id,
                         status=status, force=force)
        timings[Stage.FETCH] = time.monotonic() - t0
    got = fetch_artifacts(config, session, job, launched.run_dir, launched.run_id, reporter)
    if got is not None:
        timings[ARTIFACTS_TIMING] = got.seconds
    return fetched, got


def fetch_artifacts(config: Config, session: HostSession, job: JobConfig, run_dir: str, run_id: str,
                    reporter: Reporter) -> artifacts.DirFetch | None:
    """The job's artifacts into .thrust/fetched/<run-id>/artifacts/, only what changed (fetch/artifacts.py);
    None when the job has none. A glob that matches nothing is a warning."""
    globs = artifacts.artifact_globs(job)
    if not globs:
        return None
    reporter.step("fetching the artifacts")
    got = artifacts.fetch_artifacts(session, run_dir, run_id, config.root, globs, warn=reporter.warn)
    reporter.step(got.summary(config.root))
    return got


def pull_checkpoint(config: Config, session: HostSession, job: JobConfig, run_dir: str, run_id: str,
                    reporter: Reporter, *, every: bool = False) -> checkpoints.CheckpointPull | None:
    """The run's newest checkpoint (`every`: all) into .thrust/fetched/<run-id>/checkpoints/, verified,
    only what changed (fetch/checkpoints.py); None when the job declares no checkpoints."""
    glob = checkpoints.checkpoint_glob(job)
    if glob is None:
        return None
    got = checkpoints.pull(session, run_dir, run_id, config.root, glob, every=every)
    if not glob.startswith(RUN_DIR_PREFIX):
        got.warnings += _sharing_checkpoints(session, job, run_id, glob)
    for text in got.warnings:
        reporter.warn(text)
    reporter.step(got.summary(config.root))
    return got


def _sharing_checkpoints(session: HostSession, job: JobConfig, run_id: str, glob: str) -> list[str]:
    """Runs of the same job going on in the same checkout write where this one's `checkpoints:` looks
    (a glob under the checkout): the newest file there may be theirs. Said, with the way out."""
    others = [r["run_id"] for r in control.list_runs(session)
              if r.get("run_id") != run_id and r.get("job") == job.name and RunState.of(r.get("state")).is_live]
    if not others:
        return []
    return [f"checkpoints: {', '.join(others)} (the same job, going on in the same checkout on {session.name}) "
            f"write(s) where {glob!r} looks: the newest checkpoint may be theirs; give each run its own directory "
            f"with a glob under $THRUST_RUN_DIR/ (your code writes there: $THRUST_RUN_DIR is set for it)"]


def exports_model(job: JobConfig) -> bool:
    """The trainer and cargo jobs always leave a model in the run dir; your own python or command job
    only when it says so with `export:` (it writes $THRUST_EXPORT)."""
    return job.kind in ("trainer", "cargo") or bool(job.export)


def export_target(config: Config, job: JobConfig) -> tuple[Path, str]:
    """(directory, stem) where the job's model lands: job.export, else web/public/<job>.onnx."""
    target = config.root / (job.export or f"web/public/{job.name}.onnx")
    return target.parent, target.stem


def finish(config: Config, session: HostSession, job: JobConfig, run_dir: str, *,
           run_id: str | None = None, status: Mapping[str, Any] | None = None,
           force: bool = False) -> models.FetchResult:
    """Fetch the run's model (verified), keep it in .thrust/fetched/<run-id>/ and place it in web/public
    when its run FINISHED and it is not clearly worse than the placed one, or with `force`
    (docs/architecture.md, "Kept models"). Cargo jobs fetch `artifact:`, relative to the run's cwd (the
    crate). `status` is the run's status when the caller has it already (train), else asked here (fetch)."""
    dest, stem = export_target(config, job)
    run_id = run_id or PurePosixPath(run_dir).name
    status = status if status is not None else control.status(session, run_id)
    if job.kind == "cargo":
        if not job.artifact:
            raise ThrustError(f"job {job.name} has no `artifact:` to fetch", exit_code=ExitCode.USAGE)
        cargo.stage_artifact(session, run_dir, str(status.get("cwd") or session.paths.workdir), job.name,
                             job.artifact)
    run = models.RunFacts(run_id, session.name, job.name, status.get("state"), status.get("exit_code"))
    return models.fetch_run_model(session.runner, run_dir, stem, dest, project_root=config.root, run=run,
                                     force=force)
