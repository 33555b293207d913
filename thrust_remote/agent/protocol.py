"""The host protocol, spelled once and imported by both sides: the agent on the host (this package,
stdlib-only, Python 3.8+) and the laptop (thrust_remote). A run's states, the agent's exit codes, the
run directory's file names and the shapes of the JSON answers live here and nowhere else
(docs/architecture.md, "The host agent", "The run directory on the host" and "JSON shapes").
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any, TypedDict, cast  # 3.8+, the agent's oldest python


class RunState(str, enum.Enum):
    """A run's state. A str, so it compares and serialises as the word in the JSON answers."""

    QUEUED = "QUEUED"  # waiting on the host for its GPUs or CPU slot (`train --queue`); starts by itself
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"  # exit 0
    FAILED = "FAILED"  # exit != 0 (or, over several hosts, a node failed)
    STOPPED = "STOPPED"  # stopped on request
    LOST = "LOST"  # nothing recorded an end (the host rebooted, the supervisor was killed)
    UNREACHABLE = "UNREACHABLE"  # the laptop's word for a node that did not answer: never on a host

    def __str__(self) -> str:  # f"{state}" is the word on every Python (3.12 changed the mixin's format)
        return self.value

    @property
    def is_terminal(self) -> bool:
        """Ended for good: nothing will change its state again."""
        return self in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED, RunState.LOST)

    @property
    def ended_well(self) -> bool:
        """Still going (or waiting to) or finished: not a failure (a node's peers keep going)."""
        return self in (RunState.QUEUED, RunState.RUNNING, RunState.FINISHED)

    @property
    def is_live(self) -> bool:
        """Queued or running: its checkout must stay, its log may still grow, `stop` has work to do."""
        return self in (RunState.QUEUED, RunState.RUNNING)

    @classmethod
    def of(cls, value: object) -> RunState:
        """The state of an answer's `state` field (an unknown word is LOST: nothing says how it ended)."""
        try:
            return cls(value)
        except ValueError:
            return cls.LOST


class AgentExit(enum.IntEnum):
    """The agent's exit codes, each subcommand's meaning in docs/architecture.md ("The host agent")."""

    OK = 0
    MISSING = 2  # `logs`: the run has no log; `list-files`: no run.json
    REFUSED = 3  # launch: exists / gpus-taken; lease: present / not ours; scalars: no tensorboard
    UNAVAILABLE = 69  # venv: the venv cannot be made or pip failed


# the run directory's files (docs/architecture.md, "The run directory on the host")
# Agent subcommands that look at the host's installed packages (torch, numpy...): they run with site
# (a command of their own without `-S`; over `agent serve`, site.main() in the request's process). The
# others import only the standard library and run with `python -S`: no site-packages scan, no .pth files.
SITE_COMMANDS = frozenset({"preflight", "missing-modules", "dist-versions"})

# `agent serve`'s request words beside "id" (agent/serve.py): a request runs {"argv"...}; CANCEL ends one;
# PING is answered at once by the server's own loop, exit 0, so the laptop can tell a server that is
# stopped or frozen (SIGSTOP, a debugger, swapped out) from a request that is merely long
SERVE_CANCEL = "cancel"
SERVE_PING = "ping"
# Subcommands that read (or, `launch-outcome`, settle once): a request of one whose server stopped
# answering is asked once more on a fresh server (host/session.py); asking twice does what asking once did.
IDEMPOTENT_COMMANDS = frozenset({"status", "list", "list-files", "git-state", "tree-size", "store-missing",
                                "missing-modules", "dist-versions", "route-dev", "launch-outcome"})

# What `agent logs` writes before the log's first byte: a line an account's start-up file printed for the
# command comes before it and is not the log (nor counted in the reattach offset).
LOG_START = b"\x1ethrust-log\x1e\n"

RUN_JSON = "run.json"
# what either side reads of a run's JSON files (run.json, peer-failed.json): ours are a few KB, and one
# far larger (a hostile or broken host) is refused, never read whole into memory
RUN_JSON_MAX = 1 << 20
LOG = "log"
EXIT_CODE = "exit_code"
# bytes set aside at launch for the run's end: on a disk the job filled, `exit_code` is written into
# them in place (no new block), so the run ends FAILED with its code, not LOST
END_RESERVE = ".exit_code.reserve"
END_RESERVE_BYTES = 512
STOPPED = "stopped"
METRICS = "metrics.jsonl"
MODEL = "model.onnx"
MANIFEST = "manifest.json"
PEER_FAILED = "peer-failed.json"
TREE_REMOVED = "tree-removed.json"  # when the run's tree was removed, and by what (prune, keep:): a fetch says so
DEADLINE_ERROR = "deadline"  # a list-files answer's "error" when its walk ran out of time
# A run dir whose launch the laptop gave up on (its agent stopped answering) and found not started
# (`launch-outcome`): a launch that arrives late is refused, never runs unrecorded
WITHDRAWN = "withdrawn"
CHECKPOINTS = "checkpoints"
PATCH = "uncommitted.patch"
RUNS_DIR = ".thrust/runs"  # under a host's workdir: one directory per run id

# What both sides name alike when a run goes on from another: the laptop (`resume`, run/stages.py) and
# a cluster's run continuing itself on its allocation (its scheduler's step module)
RESUME_DIR = "resume"  # under the new run's directory: the checkpoint it starts from
CHECKPOINT_FIELD = "{checkpoint}"  # in a job's `resume:` template: the checkpoint's path on the host


def new_run_id(job: str) -> str:
    """A new run's id: its job, the UTC time to the second, four hex digits (`cartpole-20261201-225551-3f2a`)."""
    return f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


RUN_DIR_ENV = "THRUST_RUN_DIR"  # the job's environment: its run directory
RUN_DIR_PREFIX = f"${RUN_DIR_ENV}/"  # an artifacts glob under the run directory, not the cwd


class LaunchAnswer(TypedDict, total=False):
    pid: int
    run_dir: str
    marker: str
    error: str  # with exit 3: "exists", "gpus-taken", "never-fits" or "withdrawn"
    run_id: str
    gpus: list
    queued: bool  # launch --queue: it waits on the host (no pid yet)
    position: int  # its place in the host's queue, 1 first
    launched: bool  # `launch-outcome`: the run was launched (its run.json exists); False: withdrawn
    state: str  # `launch-outcome` of a launched run: its RunState word now
    scheduler_job: str  # a cluster's launch: the job id its scheduler gave (the run is QUEUED there)
    detail: str  # a cluster's launch its scheduler refused (its own `error` word): what the scheduler said


# run.json's `queue` of a run launched with --queue (agent/runqueue.py): what it waits for, its order
QUEUE = "queue"

# run.json's (and status's) run id of the run this one continues (`thrust-remote resume`)
RESUMED_FROM = "resumed_from"
SELF_RETRY = "self_retry"  # run.json: a cluster's run continues itself at its time limit (its scheduler's module)
# SELF_RETRY's key for the job's `resume: {checkpoint_at: P}`: where the next attempt's checkpoint is placed
CHECKPOINT_AT = "checkpoint_at"

# run.json's `scheduler` of a run submitted to a cluster's scheduler (a host with `scheduler:`):
# SchedulerRecord, whose `kind` names the agent module that speaks to it (agent/scheduled.py); its state
# is what that scheduler's word makes it (SchedulerView)
SCHEDULER = "scheduler"
# A run over several of a cluster's nodes: torchrun's rendezvous address in the argv the laptop builds,
# filled in on the allocation by each node's supervisor (node 0's address and a port free there, from
# `rdzv.json` in the shared run directory; each node's own --local-addr and --rdzv-conf is_host)
RDZV_PENDING = "thrust-rdzv-pending"
RDZV_FILE = "rdzv.json"
# A job that starts its own workers (`workers: {port: FLAG}`): the argv word after FLAG, replaced by the
# job's supervisor with a TCP port free on its node as the job starts (a queued run may start hours
# after the laptop built its argv, a cluster's job on a node the laptop never sees)
FREE_PORT = "thrust-free-port"
NODES_DIR = "nodes"  # a run over several nodes: node I's log, run.json and exit_code in nodes/I/ (I >= 1)


class SchedulerView(TypedDict, total=False):
    """A run's state as its cluster scheduler's word makes it (that scheduler's agent module, looked up
    by agent/scheduled.py): the state, and why."""

    state: RunState
    reason: str  # QUEUED: the scheduler's pending reason; an end not the job's own: timeout, preempted...
    reason_detail: str


def utc_now() -> str:
    """A time as the run files record it (started_at, ended_at): UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def never_started_end() -> str:
    """`exit_code` of a run that ended before its job started (stopped while queued or pending, refused
    by a cluster's scheduler): no code, since no job ran, and the time it ended."""
    return json.dumps({"exit_code": None, "never_started": True, "ended_at": utc_now(), "ended_ts": time.time()})


# A job's `max_duration:` (agent/agewatch.py): its STOPPED reason (never "timeout", a cluster's time limit,
# which a retry and a cluster's self-continuation read as "continue me"), and the TERM-to-KILL grace the
# job has to write its last checkpoint (a cluster's time limit is set past both)
MAX_DURATION = "max-duration"
MAX_DURATION_GRACE_S = 60.0

# A run's end `reason` (StatusAnswer's, the STOPPED file's, a retry's `on:` word): spelled here once,
# since the agent writes them, the laptop reads them and thrust.yaml names them
USER_STOP = "user"  # STOPPED: `stop` asked
IDLE = "idle"  # STOPPED: the idle-GPU stop (agent/idlewatch.py)
TIMEOUT = "timeout"  # a cluster's time limit (FAILED): a retry and self-continuation read "continue me"
PREEMPTED = "preempted"  # the scheduler preempted it (LOST): continued as a timeout is
CANCELLED = "cancelled"  # STOPPED by the scheduler (scancel), not by `stop`
OUT_OF_MEMORY = "out-of-memory"  # FAILED: the scheduler's OOM kill
NOT_SUBMITTED = "not-submitted"  # the scheduler never gave it a job id (refused, or its launch cut meanwhile)

# run.json's GPUs a run could use (GPU-hours count them): the chosen ones, else all the job could see
GPUS_USED = "gpus_used"
# run.json's runs that continue a cluster's run that resubmitted itself, and why one did not
CONTINUED_BY = "continued_by"
CONTINUE_ERROR = "continue_error"


class SchedulerRecord(TypedDict, total=False):
    """run.json's `scheduler`: the cluster scheduler a run was submitted to (agent/scheduled.py looks up
    the agent module speaking to `kind`); that module may record more of its own (its options)."""

    kind: str  # the scheduler's name, as the host's `scheduler:` says it
    job_id: str  # the scheduler's id for the run's job, once the submit gave one
    submitted_ts: float  # when the launch submitted it (a job not known yet is pending, not gone)
    nodes: int  # the nodes of its allocation (1 unless the run spans several)


class RunRecord(TypedDict, total=False):
    """run.json: what a run's launch and start record in its run directory (docs/architecture.md, "The
    run directory on the host"). The laptop sends its part as the launch's `meta`; the agent adds its own
    and writes it whole (`run_record`); every reader on the host reads it capped (agent/runjson.py
    `read_record`). Every field may be absent: an older agent, a launch cut short, a queued run."""

    # the laptop's part (run/stages.py's launch meta)
    job: str  # the job's name in thrust.yaml
    host: str  # the host's name in thrust.yaml
    argv: list  # the job's command line (the agent's launch replaces it with the one it ran)
    env_keys: list  # the names of every variable of the job's env
    env: dict  # the values thrust-remote computed (THRUST_PYTHON...); the job's own `env:` only by name
    facts: dict  # the host's preflight facts the run started with (hostname, python, torch...)
    gpus: list  # the GPU indices the run claims (a queued `--gpus N`: chosen when it starts)
    gpus_used: list  # GPUS_USED: the GPUs GPU-hours count
    idle_stop: dict  # the job's idle-GPU stop: {below, minutes} (agent/idlewatch.py)
    max_duration: float  # the job's `max_duration:` in seconds: stopped at that age (agent/agewatch.py)
    commit: str | None  # the synced commit (None: no git)
    project: str  # the laptop project's directory it was launched from: where another project's fetch sends you
    sync: str  # how the code got there
    dirty: bool  # uncommitted changes came along (PATCH in the run dir)
    patch_sha256: str
    untracked: list
    checkout: str
    shallow: bool
    lfs: list
    submodules: dict
    submodules_not_sent: list
    tree: str  # the run's own tree on the host (docs/architecture.md, "Trees")
    resumed_from: str  # RESUMED_FROM: the run this one continues
    self_retry: dict  # SELF_RETRY: {on, max, attempt, argv, checkpoints, host, ...} of a cluster's run
    # a node of a run over several hosts (run/multinode.py)
    node: int  # this node's rank
    nodes: list  # every node: [{"host", ...}]
    rdzv: str  # node 0's rendezvous address:port
    watch_peers: list  # the other nodes this one watches (agent/peerwatch.py)
    peer_timeout: float  # seconds a peer may not answer before the run fails for it
    # an optimize trial (optimize/scheduler.py)
    study: str
    trial: int
    slot: str  # the host's slot the trial runs on
    params: dict  # the trial's parameters
    # the agent's part (agent/launcher.py, job.py, and a scheduler's module)
    run_id: str
    cwd: str  # where the job runs
    marker: str  # THRUST_RUN_MARKER: the run's processes carry it (a recycled pid is not our run)
    supervisor_pid: int
    supervisor_start: str  # the supervisor's start time as /proc says it (agent/procs.py)
    pid: int  # the job's: present once it started
    pid_start: str
    started_at: str  # utc_now() when it started
    started_ts: float
    queue: dict  # QUEUE: a run launched with --queue, what it waits for (agent/runqueue.py)
    scheduler: SchedulerRecord  # SCHEDULER: a run submitted to a cluster's scheduler
    continued_by: list  # CONTINUED_BY: [{"run_id", "host", "scheduler_job"}], where a cluster's run went on
    continue_error: str  # CONTINUE_ERROR: why a run that was to continue itself did not


# the fields `run_record` takes by name: a misspelt one is an error at once, not a field nobody reads
RUN_RECORD_FIELDS = frozenset(RunRecord.__annotations__)


def run_record(*parts: Mapping[str, Any], **fields: Any) -> RunRecord:
    """A run.json's record: `parts` (the laptop's meta, the record so far, a scheduler module's own
    fields) merged in order, then `fields` (RunRecord's, by name) over them. The one way the agent makes
    a record it writes (agent/runjson.py `write_record`)."""
    unknown = sorted(set(fields) - RUN_RECORD_FIELDS)
    if unknown:
        raise TypeError(f"not a run.json field: {', '.join(unknown)}")
    record: dict[str, Any] = {}
    for part in parts:
        record.update(part)
    record.update(fields)
    return cast(RunRecord, record)


class StatusAnswer(TypedDict, total=False):
    """agent `status` and each item of `list` (a node of a run over several hosts adds the last three).
    A cluster's run adds its scheduler module's own fields (its nodes' parts: agent/scheduled.py)."""

    run_id: str
    state: str  # a RunState word
    exit_code: int | None
    pid: int | None
    started_at: str | None
    ended_at: str | None
    ended_ts: float | None
    host: str | None
    job: str | None
    commit: str | None
    cwd: str | None
    gpus: list
    wall_hours: float | None  # started to ended (or now, while it runs; a LOST run: its log's last write)
    gpu_hours: float | None  # wall_hours x the GPUs it could use (run.json's gpus_used); 0.0 on the CPU
    queued_at: str | None  # a run launched with --queue: when it joined the queue
    position: int  # a QUEUED run's place in the host's queue (1: next to start)
    reason: str  # a STOPPED run's: USER_STOP (stop), IDLE, MAX_DURATION; a cluster's run's: SchedulerView's
    reason_detail: str
    unreadable: str  # a path of the run this account may not read (permission denied): the rest is a guess
    disk_free: int  # a FAILED or LOST run: bytes free on its run directory's filesystem now (a full disk?)
    oversize: str  # the run's run.json, larger than RUN_JSON_MAX: not read (the rest is a guess)
    scheduler_job: str  # a cluster's run's job id (run.json's `scheduler`)
    node: int
    nodes: list
    peer_failed: dict | None
    resumed_from: str  # the run this one continues from a checkpoint (`resume`, a retry)
    tree: str  # `list --trees` and `status`: the run's own tree on the host (docs/architecture.md, "Trees")
    tree_kept: bool  # the tree is still there
    tree_bytes: int | None  # its own files' size
    # the laptop's additions: a run over several hosts (multinode.aggregate) and a run resumed since
    failed_node: dict | None  # {"node", "host", "why"[, "log_tail"]}: the node that failed first
    continued_by: list  # [{"run_id", "host"}]: the runs that continue it (`status`); a cluster's run's own too
    continue_error: str  # a cluster's run that was to resubmit itself at its time limit and did not: why


class ServeAnswer(TypedDict):
    """One answer of `agent serve` (agent/serve.py), as the laptop reads it: out and err decoded."""

    id: int
    exit: int
    out: bytes
    err: bytes


def serve_answer(data: bytes) -> ServeAnswer:
    """The JSON after `THRUST-AGENT ` on an answer line, checked whole: `{"id": N, "exit": CODE, "out":
    B64, "err": B64}`. ValueError saying what is malformed (the laptop fails that link's requests with
    it, at once, instead of a reader that dies and requests that wait for their deadline)."""
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than json's parser goes
        raise ValueError("an answer that is not JSON") from None
    if not isinstance(answer, dict):
        raise ValueError("an answer that is not a JSON object")
    numbers = {}
    for name, what in (("id", "request id"), ("exit", "exit code")):
        value = answer.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"an answer whose {what} is not a whole number")
        numbers[name] = value
    streams = {}
    for name in ("out", "err"):
        value = answer.get(name, "")
        try:
            if not isinstance(value, str):
                raise ValueError
            streams[name] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"an answer whose {name} is not base64") from None
    return {"id": numbers["id"], "exit": numbers["exit"], "out": streams["out"], "err": streams["err"]}
