"""The words a run is told in (docs/architecture.md, "The flow of one train"): its stages, how it
reports to its caller (`Reporter`), what is asked of it (`TrainRequest`, `ResumeFrom`) and what comes
back (`Launched`, `TrainOutcome`, the exit code a run's end is). No stage lives here: every other
module of run/ speaks these, and the CLI renders them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from thrust_remote.agent.protocol import RunRecord, RunState, StatusAnswer, run_record
from thrust_remote.core.config import HostConfig, JobConfig
from thrust_remote.core.errors import ExitCode
from thrust_remote.fetch import artifacts, checkpoints, models
from thrust_remote.host.jobspec import JobSpec
from thrust_remote.host.session import HostPaths
from thrust_remote.run.sync import SyncResult
from thrust_remote.runs.progress import RunProgress
from thrust_remote.runs.pull import Pulled


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
    """What a run's stages tell their caller. Following a run adds four calls: `following` when the
    log starts, `log` with its bytes exactly as the host wrote them (progress is parsed from them:
    THRUST_METRICS lines), `metrics` with a metrics object read elsewhere (a job's TensorBoard
    scalars, from another thread), `followed` when following ends for any reason (end, detach, lost link).
    `queued` comes first when the followed run still waits in its host's queue (its log starts later);
    `pulled` after each pull of the run's checkpoint and artifacts while it is followed (runs/pull.py,
    from another thread). `note` is a turn in a run's life said as a line of its own, even where steps
    are not shown (`--json`): a retry resuming the run. `running` comes before `following`: how long the
    run has gone already (None: not started; a reattach's elapsed time goes on from it) and the command
    that shows its log (what a run quiet for long is told to look at); once more after the run ended,
    before `followed`, with its own wall time, which the final drawing shows."""

    def step(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...
    def note(self, message: str) -> None: ...
    def queued(self, host: str, position: int | None) -> None: ...
    def pulled(self, pulled: Pulled) -> None: ...
    def running(self, age_s: float | None, logs: str) -> None: ...
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

    def note(self, message: str) -> None:
        pass

    def queued(self, host: str, position: int | None) -> None:
        pass

    def pulled(self, pulled: Pulled) -> None:
        pass

    def running(self, age_s: float | None, logs: str) -> None:
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

    def record(self) -> RunRecord:
        """run.json's link to the run this one continues."""
        return run_record(resumed_from=self.run_id)


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
    nodes: int = 1  # --nodes: a cluster scheduler's nodes for one run (torchrun across them)


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
    scheduler_job: str | None = None  # a cluster scheduler's job id (the run is QUEUED there until it starts)

    def as_json(self) -> dict[str, Any]:
        if self.scheduler_job:
            state: dict[str, Any] = {"state": RunState.QUEUED.value, "scheduler_job": self.scheduler_job}
        elif self.position:
            state = {"state": RunState.QUEUED.value, "position": self.position}
        else:
            state = {"state": RunState.RUNNING.value}
        return {"run_id": self.run_id, "host": self.host, "run_dir": self.run_dir, "pid": self.pid,
                "job": self.job, "commit": self.commit, **state}


@dataclass
class TrainOutcome:
    """What `train` (or a reattach, `reattach`) did. `status` is None when detached; `fetched` None when
    not fetched; `fetchable` False for a run that is not a train run of a configured job (an optimize
    trial: nothing to fetch); `progress` what its log said (the last metrics, THRUST_DONE)."""

    launched: Launched
    status: StatusAnswer | None
    fetched: models.FetchResult | None
    exit_code: int
    timings: dict[str, float]
    progress: RunProgress = field(default_factory=RunProgress)
    fetchable: bool = True
    artifacts: artifacts.DirFetch | None = None  # the job's artifacts, when fetched (fetch/artifacts.py)
    checkpoint: checkpoints.CheckpointPull | None = None  # its newest checkpoint, when pulled at the end
    pulled: Pulled | None = None  # the last pull while it was followed
    attempts: list[dict[str, Any]] = field(default_factory=list)  # a retried run's chain, first attempt first
    next_steps: list[str] = field(default_factory=list)  # what to type after an end other than FINISHED

    def as_json(self, wall_s: float) -> dict[str, Any]:
        """`train --json` (attached) and `logs -f --json`: docs/architecture.md, "JSON shapes"."""
        status = self.status or {}
        fetched = self.fetched
        return {
            "run_id": self.launched.run_id, "host": self.launched.host, "job": self.launched.job,
            "commit": self.launched.commit, "run_dir": self.launched.run_dir,
            "state": status.get("state"), "exit_code": self.exit_code, "job_exit_code": status.get("exit_code"),
            "failed_node": status.get("failed_node"),
            # why a run ended that did not end by itself (its max_duration:, idle GPUs, a scheduler's word)
            **{k: status[k] for k in ("reason", "reason_detail") if status.get(k)},
            "model": str(fetched.model) if fetched else None, "manifest": str(fetched.manifest) if fetched else None,
            "sha256": fetched.sha256 if fetched else None, "bytes": fetched.bytes if fetched else None,
            "artifacts": self.artifacts.as_json() if self.artifacts else None,
            "checkpoint": self.checkpoint.as_json() if self.checkpoint else None,
            "last_pull": self.pulled.as_json() if self.pulled else None,
            **({"resumed_from": status["resumed_from"]} if status.get("resumed_from") else {}),
            **({"attempts": self.attempts} if self.attempts else {}),
            "next_steps": self.next_steps,
            **self.progress.summary(),
            "wall_s": round(wall_s, 3), "timings": {k: round(v, 3) for k, v in self.timings.items()},
        }


# The codes thrust-remote itself means something by (64 usage .. 78 config): a job's own 75 passed on would
# read as "connection lost, reattach" to a script branching on ours, so those become 1 (FAILED); the
# job's code stays in the message and in `--json`'s job_exit_code.
OURS = range(ExitCode.USAGE, ExitCode.CONFIG + 1)


def exit_code_for(status: StatusAnswer) -> int:
    """A run's exit code as the CLI's: 0 when FINISHED, the job's own code (1 where it is one of ours), else 1."""
    if status.get("state") == RunState.FINISHED:
        return 0
    code = status.get("exit_code")
    if isinstance(code, int) and code != 0 and code not in OURS:
        return code
    return ExitCode.FAILED


LOW_DISK_BYTES = 64 << 20  # less free than this where a run ended badly: a full disk is named as a likely cause


def disk_note(status: StatusAnswer) -> str:
    """What a FAILED or LOST run's host says of its disk (the agent's `disk_free`), when nearly full: a
    clause for the line that says how the run ended; else ""."""
    free = status.get("disk_free")
    if not isinstance(free, int) or isinstance(free, bool) or free >= LOW_DISK_BYTES:
        return ""
    where = f" on {status['host']}" if status.get("host") else ""
    return (f"; the run's disk{where} has {free / (1 << 20):.1f} MiB free: a full disk may have ended it "
            "(free space there, then resume it)")
