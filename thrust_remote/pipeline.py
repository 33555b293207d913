"""`thrust-remote train JOB`: sync → preflight → setup → launch → follow → fetch.

`train()` owns the whole sequence and reports through a Reporter; it never prints (the CLI renders,
the overhead bench passes a silent reporter). Every stage is also a function of its own, so optimize
(many runs from one prepared host) and tests can use them one by one. The job's config becomes one
plain spec (buildenv.job_spec) once, in `prepare`, and that spec is what every stage and the host
see (docs/architecture.md, "The flow of one train").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from trainer.args import parse_flag

from . import artifacts, buildenv, doctor, payload, runs
from .buildenv import JobSpec
from .config import Config, HostConfig, JobConfig
from .errors import ConfigError, ConnectionLostError, Detached, ExitCode, ThrustError, UsageError
from .gpus import select_gpus
from .names import valid_id
from .session import HostPaths, HostSession
from .stages import (  # noqa: F401 - re-exported: the stages are part of the pipeline's API
    CRITICAL_CHECKS,
    TRAINER_REQUIREMENTS,
    envcheck_report,
    preflight,
    setup_cargo,
    setup_python,
    stage_cargo_artifact,
)
from .sync import LocalState, SyncResult, local_state, sync


class Reporter(Protocol):
    """What the pipeline tells its caller. Following a run adds three calls: `following` when the
    log starts, `log` with its bytes exactly as the host wrote them (progress is parsed from them:
    THRUST_METRICS lines), `followed` when following ends for any reason (end, detach, lost link)."""

    def step(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def following(self, run_id: str, offset: int) -> None: ...
    def log(self, chunk: bytes) -> None: ...
    def followed(self) -> None: ...


class NullReporter:
    """Says nothing; a base for reporters that only care about some of the calls."""

    def step(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass

    def following(self, run_id: str, offset: int) -> None:
        pass

    def log(self, chunk: bytes) -> None:
        pass

    def followed(self) -> None:
        pass


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
    fetch: bool = True  # fetch the model when the run finished


@dataclass
class Launched:
    run_id: str
    run_dir: str
    pid: int
    host: str
    job: str
    commit: str | None
    paths: HostPaths
    sync: SyncResult | None
    setup_skipped: bool
    timings: dict[str, float]
    spec: JobSpec = field(default_factory=dict)  # the job as the host saw it (buildenv.job_spec)

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "run_dir": self.run_dir, "pid": self.pid,
                "job": self.job, "commit": self.commit}


@dataclass
class TrainOutcome:
    """What `train` did. `status` is None when detached; `fetched` None when not fetched."""

    launched: Launched
    status: dict | None
    fetched: artifacts.FetchResult | None
    exit_code: int
    timings: dict[str, float]


# ------------------------------------------------------------------------------------------ args

def parse_sets(sets: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not valid_id(key) or key.startswith("-"):
            raise UsageError(f"--set {item!r}: expected KEY=VALUE with KEY like total-steps")
        out[key] = value
    return out


def load_params(path: Path) -> dict[str, Any]:
    """A params file: a YAML mapping of trainer flag -> value (what `optimize` writes)."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read params file: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("params"), dict):
        data = data["params"]
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of parameter: value")
    for key in data:
        if not isinstance(key, str) or not valid_id(key) or key.startswith("-"):
            raise ConfigError(f"{path}: {key!r} is not a parameter name")
    return data


def job_arguments(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The job's own args, then the params file, then --set (last wins: argparse keeps the last)."""
    if job.kind == "cargo":
        out = list(job.args)  # type: ignore[arg-type]
        merged: dict[str, Any] = {**params, **sets}
    else:
        out = []
        merged = {**dict(job.args), **params, **sets}  # type: ignore[arg-type]
    for key, value in merged.items():
        if value is None or value is False:
            continue
        if value is True:
            out.append(f"--{key}")
        else:
            out += [f"--{key}", str(value)]
    return out


def check_trainer_args(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    """The built-in trainer's flags, checked here against its own table (trainer/args.py) before
    anything is synced: an unknown name, a bad type, a value outside its choices or range is a usage
    error (64) naming where it came from, not an argparse dump from the host and a FAILED run."""
    if job.kind != "python":
        return
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


def python_argv(host: HostConfig, args: Sequence[str], run_dir: str, nproc: int, export: bool = True, *,
                python: str | None = None, trainer: str | None = None) -> list[str]:
    """The built-in trainer's argv: `python` (the job's venv; default the host's `python:`) runs the
    `trainer` zipapp uploaded by setup (default: `-m trainer.train` from the cwd's checkout)."""
    python = python or host.python
    entry = [trainer] if trainer else ["-m", "trainer.train"]
    entry += [*args, "--run-dir", run_dir]
    if export:
        entry += ["--export", f"{run_dir}/model.onnx"]
    if nproc > 1:
        # --standalone: a private rendezvous on a free port, so two runs on one host never collide
        return [python, "-u", "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "--max-restarts=0", *entry]
    return [python, "-u", *entry]


# ------------------------------------------------------------------------------------------ sequence

@dataclass
class Prepared:
    """A host ready to run a job: synced, checked, set up. Launch any number of runs from it."""

    config: Config
    job: JobConfig
    spec: JobSpec  # the job as the host sees it, converted once (buildenv.job_spec)
    session: HostSession
    report: doctor.Report
    env: dict[str, str]
    cwd: str
    python: str  # the interpreter that runs the job: the job's venv python (the host's own for cargo jobs)
    local: LocalState | None
    sync: SyncResult | None
    setup_skipped: bool
    timings: dict[str, float]
    trainer: str | None = None  # the built-in trainer's zipapp on the host (kind: trainer)

    @property
    def host(self) -> HostConfig:
        return self.session.host

    @property
    def paths(self) -> HostPaths:
        return self.session.paths


def _sync_stage(config: Config, session: HostSession,
                reporter: Reporter) -> tuple[LocalState | None, SyncResult | None]:
    """What we run: the exact local commit (synced to a remote host; the project itself when local)."""
    local: LocalState | None
    try:
        local = local_state(config.root)
    except ThrustError:
        if not session.host.is_local:
            raise
        local = None
    if not session.host.is_local:
        assert local is not None
        reporter.step(f"syncing {local.commit[:12]} to {session.name}:{session.paths.workdir}")
        result = sync(session, local, step=reporter.step,
                      busy=lambda: [r["run_id"] for r in runs.list_runs(session) if r["state"] == "RUNNING"])
        for w in result.warnings:
            reporter.warn(w)
        return local, result
    if local is None:
        return None, None
    if local.dirty:
        reporter.warn("the working tree has uncommitted changes: they are what runs (recorded in run.json)")
    return local, SyncResult(local.commit, "local", local.dirty, local.patch_sha256, local.untracked)


def prepare(config: Config, job: JobConfig, session: HostSession, reporter: Reporter | None = None,
            *, args_for_preflight: Sequence[str] = ()) -> Prepared:
    """sync (remote hosts) → envcheck preflight → setup (python deps / cargo build), each timed."""
    reporter = reporter or NullReporter()
    spec = buildenv.job_spec(job)  # the one conversion: from here on the host's view of the job
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    local, sync_result = _sync_stage(config, session, reporter)
    timings["sync"] = time.monotonic() - t0

    t1 = time.monotonic()
    reporter.step(f"checking {session.name} (envcheck)")
    report = envcheck_report(session, spec)
    preflight(report, spec, [*job_arguments(job, {}, {}), *args_for_preflight], session)
    timings["preflight"] = time.monotonic() - t1

    t2 = time.monotonic()
    env = dict(buildenv.build_env(report.facts, spec))
    if sync_result is not None:
        env.setdefault("THRUST_COMMIT", sync_result.commit)
    trainer = None
    if job.kind == "cargo":
        skipped = setup_cargo(session, spec, report, sync_result, reporter)
        cwd = buildenv.crate_dir(report.facts, spec)
        python = payload.python_of(session.runner, session.host)
    else:
        venv = setup_python(session, job, report.facts, local, reporter)
        skipped, python, trainer = venv.skipped, venv.python, venv.trainer
        cwd = session.paths.workdir
    timings["setup"] = time.monotonic() - t2
    return Prepared(config, job, spec, session, report, env, cwd, python=python, local=local, sync=sync_result,
                    setup_skipped=skipped, timings=timings, trainer=trainer)


def launch_prepared(prepared: Prepared, *, args: Sequence[str], run_id: str | None = None,
                    gpus: Sequence[int] = (), nproc: int | None = None, extra_env: Mapping[str, str] | None = None,
                    lock_job: str | None = None, reporter: Reporter | None = None, export: bool = True,
                    meta_extra: Mapping[str, Any] | None = None) -> Launched:
    """Start one detached run. `args` are the trainer's flags (job_arguments); `gpus` become
    CUDA_VISIBLE_DEVICES; `lock_job` names the lock (default: the job's name); `export=False` skips
    the ONNX export (seconds per run that a hyperparameter trial does not need); `meta_extra` goes
    into run.json."""
    reporter = reporter or NullReporter()
    t3 = time.monotonic()
    job, session = prepared.job, prepared.session
    env = dict(prepared.env)
    env.update(extra_env or {})
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    run_id = runs.check_run_id(run_id) if run_id else runs.new_run_id(job.name)
    run_dir = session.paths.run(run_id)
    if job.kind == "cargo":
        argv = [*buildenv.cargo_run_argv(prepared.report.facts, prepared.spec)[:1], *args]
    else:
        argv = python_argv(session.host, args, run_dir, nproc or max(1, len(gpus)), export=export,
                           python=prepared.python, trainer=prepared.trainer)
    sync_result = prepared.sync
    meta = {
        "argv": argv,
        "env_keys": sorted(env),
        # the values thrust-remote computed (CUDA_VISIBLE_DEVICES, LD_*, RUSTFLAGS...); the job's own
        # `env:` may hold secrets (API keys): only their names are recorded
        "env": {k: v for k, v in env.items() if k not in job.env},
        "facts": {k: prepared.report.facts.get(k)
                  for k in ("hostname", "python", "python_path", "torch", "cuda_available")},
        "gpus": list(gpus),
        **(sync_result.as_meta() if sync_result else {"commit": None}),
        **(meta_extra or {}),
    }
    reporter.step(f"launching run {run_id}")
    answer = runs.launch(session, run_id=run_id, job=lock_job or job.name, argv=argv, cwd=prepared.cwd, env=env,
                         meta={**meta, "job": job.name})
    timings = {**prepared.timings, "launch": time.monotonic() - t3}
    if sync_result is not None and sync_result.dirty and prepared.local is not None:
        _save_patch(session, run_dir, prepared.local)
    return Launched(run_id, run_dir, int(answer["pid"]), session.name, job.name,
                    sync_result.commit if sync_result else None, session.paths, sync_result, prepared.setup_skipped,
                    timings, prepared.spec)


def start(config: Config, request: TrainRequest, session: HostSession, reporter: Reporter | None = None) -> Launched:
    """Everything up to a running, detached job on the host."""
    sets = parse_sets(request.sets)
    params = load_params(request.params_file) if request.params_file else {}
    check_trainer_args(request.job, sets, params)
    args = job_arguments(request.job, sets, params)
    prepared = prepare(config, request.job, session, reporter, args_for_preflight=args)
    gpus = select_gpus(request.gpus, prepared.report.facts, request.host)
    return launch_prepared(prepared, args=args, run_id=request.run_id, gpus=gpus, nproc=request.nproc,
                           extra_env=request.extra_env, reporter=reporter)


def _save_patch(session: HostSession, run_dir: str, local: LocalState) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
        tmp.write(local.patch)
        tmp.flush()
        session.runner.put(tmp.name, f"{run_dir}/uncommitted.patch")


def reattach_command(run_id: str, host: HostConfig, offset: int | None = None) -> str:
    import shlex

    argv = ["thrust-remote", "logs", run_id, "--follow", "--host", host.name]
    if offset:
        argv += ["--offset", str(offset)]
    return shlex.join(argv)


def follow(session: HostSession, run_id: str, reporter: Reporter, *, offset: int = 0) -> tuple[dict, int]:
    """Stream the log to the reporter until the run ends; returns (status, offset).

    Ctrl-C detaches (Detached, exit 75) and a lost link is ConnectionLostError (75); both carry the
    command that reattaches from the byte offset reached, so no byte is lost or repeated."""
    host = session.host
    delivered = 0

    def on_bytes(chunk: bytes) -> None:
        nonlocal delivered
        reporter.log(chunk)
        delivered += len(chunk)

    reporter.following(run_id, offset)
    try:
        try:
            position = runs.follow_log(session, run_id, offset=offset, follow=True, on_bytes=on_bytes)
        finally:
            reporter.followed()
    except KeyboardInterrupt:
        raise Detached(
            f"from run {run_id}; it goes on on {host.name}",
            f"reattach with: {reattach_command(run_id, host, offset + delivered)}   (from where you left; "
            f"without --offset for the whole log; stop it with: thrust-remote stop {run_id} "
            f"--host {host.name})",
        ) from None
    except ConnectionLostError as exc:
        reached = getattr(exc, "offset", offset + delivered)
        raise ConnectionLostError(
            f"connection to {host.name} lost while following run {run_id}; the run goes on",
            f"reattach with: {reattach_command(run_id, host, reached)}",
        ) from None
    return runs.status(session, run_id), position


def exit_code_for(status: dict) -> int:
    """A run's exit code as the CLI's: 0 when FINISHED, the job's own code, else 1."""
    if status.get("state") == "FINISHED":
        return 0
    code = status.get("exit_code")
    if isinstance(code, int) and code != 0:
        return code
    return ExitCode.FAILED


def train(config: Config, request: TrainRequest, session: HostSession,
          reporter: Reporter | None = None) -> TrainOutcome:
    """The whole sequence: sync → preflight → setup → launch → follow → fetch (docs/architecture.md)."""
    reporter = reporter or NullReporter()
    launched = start(config, request, session, reporter)
    timings = dict(launched.timings)
    if request.detach:
        return TrainOutcome(launched, None, None, 0, timings)
    status, _offset = follow(session, launched.run_id, reporter)
    code = exit_code_for(status)
    if status["state"] != "FINISHED" or not request.fetch:
        return TrainOutcome(launched, status, None, code, timings)
    reporter.step("fetching the model")
    t0 = time.monotonic()
    fetched = finish(config, session, request.job, launched.run_dir, spec=launched.spec)
    timings["fetch"] = time.monotonic() - t0
    return TrainOutcome(launched, status, fetched, code, timings)


def export_target(config: Config, job: JobConfig) -> tuple[Path, str]:
    """(directory, stem) where the job's model lands: job.export, else web/public/<job>.onnx."""
    target = config.root / (job.export or f"web/public/{job.name}.onnx")
    return target.parent, target.stem


def finish(config: Config, session: HostSession, job: JobConfig, run_dir: str, *,
           spec: JobSpec | None = None) -> artifacts.FetchResult:
    """Fetch the run's model into web/public (verified, atomic). Cargo jobs fetch `artifact:`.
    `spec` is the job's spec when the caller has it already (train), else it is made here (fetch)."""
    dest, stem = export_target(config, job)
    if job.kind == "cargo":
        if not job.artifact:
            raise ThrustError(f"job {job.name} has no `artifact:` to fetch", exit_code=ExitCode.USAGE)
        stage_cargo_artifact(session, run_dir, spec or buildenv.job_spec(job))
    return artifacts.fetch_run_model(session.runner, run_dir, stem, dest)
