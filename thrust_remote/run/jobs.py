"""The job kinds on the launch side: the argv and the environment each kind runs with on the host,
how `--set` / `--params` reach it, and the checks that the files a job names are in the commit that
runs (docs/architecture.md, "Config (thrust.yaml)": the job kinds).

    trainer   PYTHON -u -m trainer.train ARGS... --run-dir RUN [--export RUN/model.onnx]
    python    PYTHON -u SCRIPT ARGS...        or   PYTHON -u -m MODULE ARGS...
    command   COMMAND... [KEY=VALUE...]       (as is: no shell, no interpreter added)

A job with `workers: {count: FLAG, port: FLAG}` starts its own workers (torch.multiprocessing.spawn):
it runs once, never under torchrun, with `FLAG N` (the process count) and `FLAG P` (a port free on its
node as it starts: FREE_PORT, filled in by its supervisor) after its arguments.

With several processes a trainer or python job runs under `PYTHON -u -m torch.distributed.run
--standalone --nproc-per-node=N --max-restarts=0` (the same SCRIPT or `-m MODULE` after it); on
several hosts under `--nnodes=N --rdzv-backend=c10d --rdzv-endpoint=ADDR:PORT --rdzv-id=RUN_ID
--local-addr=OWN` instead of `--standalone` (Rendezvous, multinode.py; no `--node-rank`: c10d ranks the
nodes by their `--local-addr`).
Every job runs with the checkout as its cwd and THRUST_RUN_ID, THRUST_RUN_DIR, THRUST_PYTHON,
THRUST_EXPORT (when it exports), CUDA_VISIBLE_DEVICES and GPU_LIST (when GPUs are selected).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from thrust_remote.agent.protocol import FREE_PORT, MODEL, RUN_DIR_ENV
from thrust_remote.core.config import CONFIG_NAME, JobConfig
from thrust_remote.core.config.discovery import work_tree
from thrust_remote.core.config.model import Workers
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.host.session import HostSession, parse_json

TRAINER_MODULE = "trainer.train"


@dataclass(frozen=True)
class Runs:
    """How a job runs: the fields of it a launch's argv and env read (process_count, job_argv,
    job_env), made by the launch from the job (stages.launch_prepared) so `command` is handed what it
    reads, not the job. A JobConfig has the same fields: the functions below take either."""

    name: str
    kind: str
    command: tuple[str, ...] = ()
    script: str | None = None
    module: str | None = None
    nproc: int | None = None
    export: str | None = None
    workers: Workers | None = None


RunsLike = JobConfig | Runs  # what process_count, job_argv, exports and job_env read of a job
EXPORT_NAME = MODEL  # in the run directory, where fetch looks for a model


# ------------------------------------------------------------------------------------------ argv / env

def process_count(job: RunsLike, nproc: int | None, gpus: Sequence[int]) -> int:
    """--nproc > the job's `nproc:` > one per selected GPU > 1. A command job starts its own processes;
    so does a job with `workers:`, which is told the count by its flag."""
    if job.kind == "command" and job.workers is None:
        if nproc is not None and nproc > 1:
            raise UsageError(f"--nproc {nproc}: job {job.name!r} is a command job, which starts its own processes",
                             "drop --nproc, or say the flag it takes the count by, under the job: "
                             "`workers: {count: --num-gpus}` (then --nproc N passes N by it)")
        return 1
    if nproc is not None:
        return nproc
    return job.nproc or max(1, len(gpus))


QUEUE_WAIT_S = 7 * 24 * 3600  # how long a queued run's first node waits for the others at the rendezvous


@dataclass(frozen=True)
class Rendezvous:
    """One node's part of a run over several hosts: torchrun's c10d rendezvous at node 0's
    `address:port`, keyed by the run id (docs/architecture.md, "Several hosts")."""

    nnodes: int
    node_rank: int
    address: str  # node 0's address as every node reaches it
    port: int
    run_id: str
    local_addr: str | None = None  # this node's own address as the others reach it
    max_restarts: int = 0
    is_host: bool = False  # this node serves the rendezvous (it has `address`)
    queued: bool = False  # `train --queue`: each node starts when its host frees, the others may come later

    def conf(self) -> str:
        """--rdzv-conf. A queued run's nodes start as their hosts free, hours apart maybe: the nodes that
        start first wait at the rendezvous (join_timeout; read_timeout for a node whose store host has
        not started yet) up to QUEUE_WAIT_S instead of torch's 600 and 60 s."""
        conf = f"is_host={'true' if self.is_host else 'false'}"
        return f"{conf},join_timeout={QUEUE_WAIT_S},read_timeout={QUEUE_WAIT_S}" if self.queued else conf

    def argv(self) -> list[str]:
        host = f"[{self.address}]" if ":" in self.address else self.address
        # is_host said outright: torchrun would guess it from the hostname, which every node of one
        # machine (or every network namespace) shares; --local-addr likewise for the workers' store.
        # No --node-rank: c10d ignores it (with a warning) and ranks the nodes by --local-addr
        return [f"--nnodes={self.nnodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={host}:{self.port}", f"--rdzv-id={self.run_id}",
                f"--rdzv-conf={self.conf()}",
                *([f"--local-addr={self.local_addr}"] if self.local_addr else []),
                f"--max-restarts={self.max_restarts}"]


def torchrun(python: str, nproc: int, rdzv: Rendezvous | None = None) -> list[str]:
    base = [python, "-u", "-m", "torch.distributed.run"]
    if rdzv is not None:
        return [*base, f"--nproc-per-node={nproc}", *rdzv.argv()]
    # --standalone: a private rendezvous on a free port, so two runs on one host never collide
    return [*base, "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0"]


def job_argv(job: RunsLike, python: str, args: Sequence[str], *, run_dir: str, nproc: int,
             export: bool = True, trainer: str | None = None, rdzv: Rendezvous | None = None) -> list[str]:
    """The argv a trainer, python or command job runs (cargo's comes from buildenv.cargo_run_argv).
    `trainer`: the built-in trainer's zipapp on the host (uploaded by setup), else `-m trainer.train`
    from the checkout."""
    if job.workers is not None:
        return own_workers_argv(job, job.workers, python, args, nproc, rdzv)
    if job.kind == "command":
        return [*job.command, *args]
    if job.kind == "python":
        entry = [job.script] if job.script else ["-m", str(job.module)]
        entry += list(args)
    else:
        entry = [trainer] if trainer else ["-m", TRAINER_MODULE]
        entry += [*args, "--run-dir", run_dir]
        if export:
            entry += ["--export", f"{run_dir}/{EXPORT_NAME}"]
    if nproc > 1 or rdzv is not None:
        return [*torchrun(python, nproc, rdzv), *entry]  # torchrun takes `-m MODULE` and a script path alike
    return [python, "-u", *entry]


def own_workers_argv(job: RunsLike, workers: Workers, python: str, args: Sequence[str], nproc: int,
                     rdzv: Rendezvous | None) -> list[str]:
    """A job that starts its own workers: once, its count and port by its own flags, last so that they
    win over the same flags in its `args:` (argparse keeps the last)."""
    if rdzv is not None:
        raise UsageError(f"job {job.name!r} starts its own workers (workers:), on one host: a run over several "
                         "hosts or nodes starts torchrun on each", "give one --host and no --nodes")
    told = [workers.count, str(nproc), *([workers.port, FREE_PORT] if workers.port else [])]
    if job.kind == "command":
        return [*job.command, *args, *told]
    entry = [job.script] if job.script else ["-m", str(job.module)]
    return [python, "-u", *entry, *args, *told]


def exports(job: RunsLike, export: bool) -> bool:
    """Whether this run writes a model: the trainer always (unless a trial skips it), others with `export:`."""
    return export and (job.kind == "trainer" or (job.kind != "cargo" and job.export is not None))


def job_env(job: RunsLike, base: Mapping[str, str], *, run_id: str, run_dir: str, python: str,
            gpus: Sequence[int], export: bool) -> dict[str, str]:
    """`base` (buildenv's env + the job's `env:` + extras) plus what every job is told about its run.

    CUDA_VISIBLE_DEVICES and GPU_LIST (comma-separated, the seeds' sweep convention) are set only when
    GPUs were selected (--gpus, optimize's slots); otherwise the job sees the host's GPUs as they are."""
    env = dict(base)
    env.update({"THRUST_RUN_ID": run_id, RUN_DIR_ENV: run_dir, "THRUST_PYTHON": python})
    if exports(job, export):
        env["THRUST_EXPORT"] = f"{run_dir}/{EXPORT_NAME}"
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = env["GPU_LIST"] = ",".join(str(g) for g in gpus)
    return env


@dataclass(frozen=True)
class Invocation:
    """What one launch knows of a run besides its job: its interpreter (`trainer`: the built-in
    trainer's zipapp), its id and directory, the GPUs it is given, whether it exports, the `--nproc` asked
    (None: the job's) and its node's rendezvous when it runs over several."""

    python: str
    run_id: str
    run_dir: str
    gpus: tuple[int, ...] = ()
    export: bool = True
    trainer: str | None = None
    nproc: int | None = None
    rdzv: Rendezvous | None = None


@dataclass(frozen=True)
class Command:
    """A run's command line and environment on its host (`argv` None: the caller has its own, a cargo
    run's); `again`: the argv of the attempt a run that continues itself submits next."""

    argv: list[str] | None
    env: dict[str, str]
    again: list[str] | None = None


def command(job: Runs, how: Invocation, base: Mapping[str, str], args: Sequence[str] | None,
            seen: Sequence[int], again: tuple[Sequence[str], Sequence[int]] | None = None) -> Command:
    """The argv (`args` None: none made) and env of one launch, in one call: job_env, then job_argv with
    process_count over the GPUs the run will see (`seen`); `again`: the next attempt's (args, seen)."""
    env = job_env(job, base, run_id=how.run_id, run_dir=how.run_dir, python=how.python, gpus=how.gpus,
                  export=how.export)

    def argv_of(words: Sequence[str], gpus: Sequence[int]) -> list[str]:
        return job_argv(job, how.python, words, run_dir=how.run_dir, export=how.export, trainer=how.trainer,
                        nproc=process_count(job, how.nproc, gpus), rdzv=how.rdzv)

    return Command(argv_of(args, seen) if args is not None else None, env,
                   argv_of(*again) if again is not None else None)


# ------------------------------------------------------------------------------------------ files

def module_paths(module: str) -> list[str]:
    """Where a module lives in a checkout: a/b.py, a/b/__main__.py (python -m a.b), a/b/__init__.py."""
    base = module.replace(".", "/")
    return [f"{base}.py", f"{base}/__main__.py", f"{base}/__init__.py"]


@dataclass(frozen=True)
class JobFiles:
    """What of a job must be in the commit that runs, resolved once from it (job_files): the files it
    names (`files`: its script, its requirements file, as (key, path)), a python job's `module`, whether
    `requirements:` may install that module (`installs`), and where each key is said in thrust.yaml
    (`where`: the `thrust.yaml:LINE: jobs.NAME.KEY` a message starts with)."""

    files: tuple[tuple[str, str], ...]
    module: str | None
    installs: bool
    where: Mapping[str, str]

    def missing(self, key: str, what: str, hint: str) -> ConfigError:
        return ConfigError(f"{self.where[key]}: {what}", hint)


def job_files(job: JobConfig, label: str) -> JobFiles:
    """The job's files and module, with where each is said (`label`: the config file's name)."""
    files = []
    if job.kind == "python" and job.script:
        files.append(("script", job.script))
    if job.requirements_file:
        files.append(("requirements", job.requirements_file))
    where = {}
    for key in ("script", "requirements", "module"):
        line = job.lines.get(key) or job.lines.get("job")
        where[key] = f"{label}:{line}: jobs.{job.name}.{key}" if line else f"{label}: jobs.{job.name}.{key}"
    module = job.module if job.kind == "python" and job.module else None
    return JobFiles(tuple(files), module, bool(job.requirements or job.requirements_file), where)


def config_label(path: Path | None) -> str:
    return str(path) if path else CONFIG_NAME


def check_local(files: JobFiles, root: Path, *, synced: bool) -> None:
    """Before anything is synced: each file the job names is in `root` (where it will run) and, when
    the tree is `synced` to a host, tracked by git (untracked files are not sent, docs/architecture.md)."""
    for key, path in files.files:
        if not (root / path).is_file():
            raise files.missing(key, f"{path} does not exist in {root}",
                                f"paths in `{key}:` are relative to the repository root")
        if synced and not _tracked(root, path):
            raise files.missing(key, f"{path} is not committed, and untracked files are not synced",
                                f"git add {path} && git commit")
    if files.module and synced:
        for path in module_paths(files.module):
            if (root / path).is_file() and not _tracked(root, path):
                raise files.missing("module", f"{path} (module {files.module}) is not committed, and "
                                    "untracked files are not synced", f"git add {path} && git commit")


def _tracked(root: Path, path: str) -> bool:
    result = subprocess.run(["git", "-C", str(root), "ls-files", "--error-unmatch", "--", path],
                            capture_output=True)
    return result.returncode == 0


def check_on_host(session: HostSession, job: JobConfig, cwd: str, label: str) -> None:
    """check_files_on_host of the job's files (job_files)."""
    check_files_on_host(session, job_files(job, label), cwd)


def check_files_on_host(session: HostSession, files: JobFiles, cwd: str) -> None:
    """After the sync, before setup and launch: the files are in the host's checkout. A module not in
    the checkout may be installed on the host (checked with its python) or come from `requirements:`."""
    runner = session.runner
    for key, path in files.files:
        if not runner.exists(f"{cwd}/{path}"):
            raise files.missing(key, f"{path} is not in the synced commit ({session.name}:{cwd})",
                                "commit it (untracked files are not synced), and check the path")
    module = files.module
    if not module:
        return
    if any(runner.exists(f"{cwd}/{path}") for path in module_paths(module)):
        return
    if files.installs:
        return  # the job's requirements may install it; python's own error says so otherwise
    # the top-level name only: find_spec("a.b") imports a, and raises when a is missing
    probe = session.agent("missing-modules", module.split(".")[0], timeout=60)
    if probe.ok and parse_json(probe, "missing-modules"):
        raise files.missing("module", f"module {module} is neither in the synced commit "
                            f"({', '.join(module_paths(module))}) nor installed on {session.name}",
                            "commit it, or list the package that provides it under `requirements:`")


def check_before_sync(files: JobFiles, session: HostSession, config_root: Path) -> None:
    """The laptop's part of the file checks: nothing synced yet, no round trip to the host."""
    if not files.files and not files.module:
        return
    if session.host.is_local:  # runs in place: the files as they are, tracked or not
        check_local(files, Path(session.paths.workdir), synced=False)
        return
    top = work_tree(config_root)
    if top is not None:  # not a repository: the sync stage says so, with its hint
        check_local(files, top, synced=True)
