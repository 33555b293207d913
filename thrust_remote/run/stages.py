"""The stages of one node (docs/architecture.md, "The flow of one train"): `check` (sync, the run's
tree, the preflight), `set_up` (the job's venv or cargo build, `setup:`), `prepare` (both), then
`launch_prepared` (a detached run), with what a launch needs (the GPUs, the queue, a resumed run's
checkpoint placed). Each is a function of its own, so `lifecycle` runs them over N >= 1 nodes and
optimize (many runs from one prepared host) and tests use them one by one; every one reports through
a `Reporter` and never prints. The job's config becomes one plain spec (jobspec.job_spec) once, in
`check`, and that spec is what every stage and the host see.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import RESUME_DIR, SELF_RETRY, LaunchAnswer, RunRecord, run_record
from thrust_remote.core.config import CHECKPOINT_FIELD, Config, HostConfig, JobConfig
from thrust_remote.core.errors import ThrustError, TransferError
from thrust_remote.host import payload
from thrust_remote.host.jobspec import JobSpec
from thrust_remote.host.report import Report
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import buildenv, cargo, data, jobs, pins
from thrust_remote.run.arguments import job_arguments
from thrust_remote.run.cargo import CargoPlan
from thrust_remote.run.gpus import host_gpus
from thrust_remote.run.preflight import check_local_python, check_partition, envcheck_report, preflight
from thrust_remote.run.sync import LocalState, SyncResult, local_state, sync, with_lfs
from thrust_remote.run.venv import setup_python
from thrust_remote.run.vocab import Launched, NullReporter, Reporter, ResumeFrom, Stage, TrainRequest
from thrust_remote.runs import control


@dataclass
class Prepared:
    """A host ready to run a job: synced, checked, set up. Launch any number of runs from it."""

    config: Config
    job: JobConfig
    spec: JobSpec  # the job as the host sees it, converted once (buildenv.job_spec)
    session: HostSession
    report: Report
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


def _sync_stage(config: Config, session: HostSession, reporter: Reporter, code_at: ResumeFrom | None = None,
                *, tree: str, own: data.JobData) -> tuple[LocalState | None, SyncResult | None]:
    """What we run: the exact local commit (its objects synced to a remote host, then a tree of its own
    named `tree` there; the project itself when local); `code_at`: a resumed run's commit and patch
    instead (the code the run it continues ran)."""
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
        local = with_lfs(local)
        # the untracked warning leaves out exactly what this job's files: sends
        result = sync(session, local, step=reporter.step, files=own.files)
        for w in result.warnings:
            reporter.warn(w)
        made = data.make_run_tree(config, own, session, local, result, tree, reporter)
        result.tree, result.tree_setup = made.path, made.setup
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
    report: Report
    local: LocalState | None
    sync: SyncResult | None
    timings: dict[str, float]
    data: data.JobData  # its `files:`, `setup:`, `shared:`, resolved once (data.job_data)

    @property
    def checkout(self) -> str:
        """Where the run's code is on the host: its own tree, or the workdir itself (host `local`)."""
        return self.sync.tree if self.sync is not None and self.sync.tree else self.session.paths.workdir


def prepare(config: Config, job: JobConfig, session: HostSession, reporter: Reporter | None = None,
            *, args_for_preflight: Sequence[str] = (), tree: str | None = None) -> Prepared:
    """sync (remote hosts) → envcheck preflight → setup (python deps / cargo build), each timed. The
    tree it makes (named `tree`, else a name of its own) serves every run launched from it."""
    reporter = reporter or NullReporter()
    args = [*job_arguments(job, {}, {}), *args_for_preflight]
    return set_up(check(config, job, session, reporter, args=args, tree=tree), reporter)


def check(config: Config, job: JobConfig, session: HostSession, reporter: Reporter, *,
          args: Sequence[str] = (), code_at: ResumeFrom | None = None, tree: str | None = None) -> Checked:
    """a cluster's partition (check_partition) → sync (remote hosts: the objects, then the run's tree) →
    envcheck preflight: the host runs this commit and can run the job with `args` (the run's arguments,
    resolved once by the caller: what preflight reads a CUDA ask from). `tree`: the tree's name (the
    run id); None: one of its own."""
    check_partition(session)  # a cluster's partition first: seconds here, before minutes of sync and setup
    spec = buildenv.job_spec(job)  # the one conversion: from here on the host's view of the job
    check_local_python(session, spec)
    if job.kind == "cargo" and not session.host.is_local:
        spec = cargo.shared_target(spec, session.paths)  # builds shared by every tree of the workdir
    label = jobs.config_label(config.path)
    files = jobs.job_files(job, label)  # the files it names, resolved once: checked here and after the sync
    jobs.check_before_sync(files, session, config.root)  # a script that cannot be there: before syncing
    own = data.job_data(config, job)  # its files:, setup:, shared: resolved once, for every stage
    data.check_local(config, own)  # files: that are not here: before anything is sent
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    local, sync_result = _sync_stage(config, session, reporter, code_at, own=own,
                                     tree=tree or control.new_run_id(f"{job.name}-tree"))
    checkout = sync_result.tree if sync_result is not None and sync_result.tree else session.paths.workdir
    if job.kind != "cargo":
        jobs.check_files_on_host(session, files, checkout)
    timings[Stage.SYNC] = time.monotonic() - t0

    t1 = time.monotonic()
    reporter.step(f"checking {session.name} (envcheck)")
    report = envcheck_report(session, spec, checkout=checkout)
    preflight(report, spec, args, session)
    if job.kind != "cargo":  # a torch pin the host cannot meet: refused before any venv is built
        root = Path(session.paths.workdir) if session.host.is_local else (local.root if local else config.root)
        line = job.lines.get("requirements")
        pins.check_job(session, job.requirements, job.requirements_file, root, report.facts,
                       f"{label}:{line}: jobs.{job.name}.requirements" if line else f"{label}: jobs.{job.name}",
                       label)
    timings[Stage.PREFLIGHT] = time.monotonic() - t1
    return Checked(config, job, spec, session, report, local, sync_result, timings, own)


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
        plan = cargo.snapshot(session, plan, checked.checkout)
        cwd = plan.crate_dir
        python = payload.python_of(session.runner, session.host)
    else:
        venv = setup_python(session, checked.spec, report.facts, checked.local, reporter, checkout=checked.checkout,
                            code=sync_result.code_key if sync_result else None)
        skipped, python, trainer = venv.skipped, venv.python, venv.trainer
        cwd = checked.checkout
    data.run_setup(checked.config, checked.data, session, checked.local, sync_result, cwd=checked.checkout, env=env,
                   python=python, reporter=reporter)
    timings = {**checked.timings, Stage.SETUP: time.monotonic() - t2}
    return Prepared(checked.config, job, checked.spec, session, report, env, cwd, python=python,
                    local=checked.local, sync=sync_result, setup_skipped=skipped, timings=timings, trainer=trainer,
                    cargo=plan)


@dataclass(frozen=True)
class LaunchPlan:
    """One run's launch on one host, as its backend planned it (thrust_remote/backends/): what
    `launch_prepared` starts. `args`: the job's arguments (job_arguments); `gpus` become
    CUDA_VISIBLE_DEVICES and GPU_LIST (`exclusive_gpus`: the host refuses the launch when a RUNNING run
    holds one); `gpu_count`: GPUs a cluster's scheduler gives each node (the run picks none itself);
    `gpus_used`: what GPU-hours count when not `gpus` (None: every GPU the job can see on the host);
    `nproc`: processes under torchrun (default: the job's `nproc:`, else one per GPU); `export=False`
    skips the ONNX export (a trial does not need it); `meta` goes into run.json; `rdzv`: this node's part
    of a run over several nodes; `queue`: it waits on the host for what it asks; `submit`: handed to the
    host's scheduler instead of started; `continues`: a run that submits its own next attempt (run.json's
    SELF_RETRY), whose argv is made here from `continue_args`, as this one's is."""

    args: tuple[str, ...] = ()
    run_id: str | None = None
    gpus: tuple[int, ...] = ()
    exclusive_gpus: bool = False
    gpu_count: int = 0
    gpus_used: tuple[int, ...] | None = None
    nproc: int | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    export: bool = True
    rdzv: jobs.Rendezvous | None = None
    queue: control.QueueAsk | None = None
    submit: control.Submission | None = None
    continues: Mapping[str, Any] | None = None
    continue_args: tuple[str, ...] = ()


def launch_prepared(prepared: Prepared, plan: LaunchPlan, reporter: Reporter | None = None) -> Launched:
    """Start one detached run as `plan` says (queued or submitted when it says so). The argv and env of
    each kind: jobs.py (docs/architecture.md, "Config")."""
    reporter = reporter or NullReporter()
    t3 = time.monotonic()
    job, session = prepared.job, prepared.session
    run_id = control.check_run_id(plan.run_id) if plan.run_id else control.new_run_id(job.name)
    run_dir = session.paths.run(run_id)
    gpus = list(plan.gpus)
    how = jobs.Invocation(prepared.python, run_id, run_dir, tuple(gpus), plan.export, prepared.trainer, plan.nproc,
                          plan.rdzv)
    again = (plan.continue_args, range(plan.gpu_count)) if plan.continues is not None else None
    runs = jobs.Runs(job.name, job.kind, job.command, job.script, job.module, job.nproc, job.export,  # what it reads
                     job.workers)
    made = jobs.command(runs, how, {**prepared.env, **plan.extra_env},
                        None if prepared.cargo is not None else plan.args,
                        gpus or range(plan.queue.count if plan.queue else plan.gpu_count), again)
    env = made.env
    argv = prepared.cargo.run_argv(list(plan.args)) if prepared.cargo is not None else made.argv
    assert argv is not None
    meta_extra = dict(plan.meta)
    if plan.continues is not None:  # the next attempt's argv, made as this one's
        meta_extra[SELF_RETRY] = {**plan.continues, "argv": made.again}
    sync_result = prepared.sync
    if job.idle_stop and not host_gpus(prepared.report.facts, session.host):
        reporter.warn(f"idle_stop: {session.name} has no GPUs that nvidia-smi lists: it watches GPUs, so it will "
                      "never stop this run")
    # the laptop's part of run.json, typed: a misspelt field is refused here (protocol.run_record)
    own = run_record(
        argv=argv,
        env_keys=sorted(env),
        # the values thrust-remote computed (CUDA_VISIBLE_DEVICES, LD_*, RUSTFLAGS...); the job's own
        # `env:` may hold secrets (API keys): only their names are recorded
        env={k: v for k, v in env.items() if k not in job.env},
        facts={k: prepared.report.facts.get(k)
               for k in ("hostname", "python", "python_path", "torch", "cuda_available")},
        gpus=gpus,
        # what GPU-hours count: the GPUs chosen, else every GPU the job can see there (a job given
        # none sees them all; --gpus makes the account exact), else what the backend says it asked for
        gpus_used=gpus or (list(plan.gpus_used) if plan.gpus_used is not None
                           else host_gpus(prepared.report.facts, session.host)),
        **({"idle_stop": job.idle_stop.as_dict()} if job.idle_stop else {}),
        **({"max_duration": job.max_duration} if job.max_duration else {}),  # agent/agewatch.py stops it
        project=str(prepared.config.root),  # where a fetch of it from another project is sent (run/handle.py)
    )
    meta = run_record(own, sync_result.as_meta() if sync_result else {"commit": None}, meta_extra)
    reporter.step(f"launching run {run_id}")
    answer: LaunchAnswer = control.launch(
        session, run_id=run_id, job=job.name, argv=argv, cwd=prepared.cwd, env=env,
        meta=run_record(meta, job=job.name), claim_gpus=gpus if plan.exclusive_gpus else (), queue=plan.queue,
        submit=plan.submit)
    timings = {**prepared.timings, Stage.LAUNCH: time.monotonic() - t3}
    if sync_result is not None and sync_result.dirty and prepared.local is not None:
        _save_patch(session, run_dir, prepared.local)
    pid = answer.get("pid")  # a queued run is said once, by whoever shows it next: the follow, or the detach
    return Launched(run_id, run_dir, int(pid) if pid is not None else None, session.name, job.name,
                    sync_result.commit if sync_result else None, session.paths, sync_result, prepared.setup_skipped,
                    timings, prepared.spec, position=answer.get("position") if answer.get("queued") else None,
                    scheduler_job=answer.get("scheduler_job"))


def place_checkpoint(prepared: Prepared, resume: ResumeFrom, run_id: str, *, relative: bool) -> str:
    """The checkpoint a resumed run starts from, where its job can read it on this node: the run's own
    file when it stays on the host that has it, else the pulled copy uploaded (verified: sha256 on both
    ends) into the new run's directory (0700). `relative`: the path from the job's cwd (the checkout, a
    cargo job's crate), the same on every node of a run over several hosts (each has its own workdir)."""
    session = prepared.session
    run_dir = session.paths.run(run_id)
    session.runner.run(["mkdir", "-p", "-m", "700", "--", run_dir]).check(f"mkdir {run_dir} on {session.name}")
    if resume.on_host is not None:
        # linked (else copied) into the new run's directory: the old run's tree may be reclaimed (keep:,
        # prune) while the new run has yet to read it
        target = f"{run_dir}/{RESUME_DIR}/{posixpath.basename(resume.on_host)}"
        place = 'mkdir -p -- "${2%/*}" && { ln -f -- "$1" "$2" 2>/dev/null || cp -p -- "$1" "$2"; }'
        session.runner.run(["sh", "-c", place, "sh", resume.on_host, target]).check(
            f"placing {resume.on_host} for run {run_id}")
        return posixpath.relpath(target, prepared.cwd) if relative else target
    assert resume.local is not None
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


def resume_meta(request: TrainRequest) -> RunRecord:
    """run.json's link to the run a resumed run continues (none for a new run)."""
    return request.resume.record() if request.resume is not None else run_record()


def _save_patch(session: HostSession, run_dir: str, local: LocalState) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
        tmp.write(local.patch)
        tmp.flush()
        session.runner.put(tmp.name, f"{run_dir}/uncommitted.patch")
