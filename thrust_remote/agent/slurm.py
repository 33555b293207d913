"""Runs on a Slurm cluster, from its login node (docs/architecture.md, "Slurm clusters").

A `scheduler: slurm` host's launch is one `sbatch --parsable` of a small batch script that runs this
agent's `supervise` on the allocation: the same supervisor as on any host (log, run.json's pid,
`exit_code`), so the run directory on the shared filesystem holds the same files. What only the
scheduler knows (pending and why, a time limit, a cancel, a failed node) comes from one `squeue` for
all of the account's jobs, kept `POLL_S` seconds in `.thrust/slurm/squeue.json` and shared by every
agent process of the account on that login node (a login node is shared: `status`, `logs --follow` and
`wait` of many runs cost one scheduler call per 10 s between them; a job submitted after the kept
answer was taken reads as pending until the next one). The mapping of Slurm's words to
run states is slurmstate.slurm_state's.

The agent's run modules reach this one through agent/scheduled.py (run.json's `scheduler.kind` is
SLURM): `launch` (`launch --slurm`), `view`, `status_fields` and `cancel` answer there.

On the allocation the batch step (slurmstep.py) places each node (`place_node`), notes Slurm's warning
and a preemption, and submits a run's next attempt itself (`continue_itself`) with what is here. Every
run file is read through runjson.py, capped at RUN_JSON_MAX as on any host.

Flags are the ones Slurm 20.11 and later take (`squeue --states=all --format`, no `--only-job-state`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import TypedDict

from . import placing
from .files import write_atomic
from .protocol import (
    CHECKPOINT_AT,
    CHECKPOINT_FIELD,
    CONTINUE_ERROR,
    CONTINUED_BY,
    EXIT_CODE,
    NODES_DIR,
    NOT_SUBMITTED,
    PATCH,
    PREEMPTED,
    RDZV_FILE,
    RDZV_PENDING,
    RESUME_DIR,
    RUN_JSON,
    SCHEDULER,
    SELF_RETRY,
    STOPPED,
    TIMEOUT,
    RunRecord,
    RunState,
    SchedulerRecord,
    SchedulerView,
    never_started_end,
    new_run_id,
    run_record,
    utc_now,
)
from .runjson import oversize, read_json, read_record, record_for_update, write_record
from .slurmstate import SLURM, SLURM_STATES, slurm_state
from .walk import list_files

POLL_S = 10.0  # the least time between two squeue calls of one account on one login node
CALL_S = 30.0  # one scheduler command's deadline (a busy slurmctld answers slowly, not never)
BATCH = "slurm-batch.sh"  # the batch script in the run directory
ENV = ".env.json"  # the job's env for the supervisor on the allocation (0600: it may hold secrets)
SLURM_OUT = "slurm.out"  # what the batch step prints before the supervisor takes the log
END = "scheduler-end.json"  # the scheduler's word on an ended job, kept: asked once, never again
NEAR_LIMIT = "time-limit"  # written when Slurm's warning came: the job was stopped for its time limit
PREEMPT_MARK = "preempted"  # written when a TERM was Slurm's preemption (scontrol's PreemptTime is set)
CANNOT_START = "cannot-start"  # {reason, detail, at}: Slurm can never start the job; it was cancelled, the run FAILED
PENDING_SEEN = "pending-reason"  # the last pending reason the run's log was told of
LOG = "log"  # the run's log (protocol.LOG): a pending run's reasons are said there, before the job's own lines
# what a run's launch wrote and its start added: the next attempt's run.json starts from the first only
_STARTED = ("pid", "pid_start", "started_at", "started_ts", "supervisor_pid", "supervisor_start", SCHEDULER,
            CONTINUED_BY, CONTINUE_ERROR, "slurm_node")
# Slurm's warning before the time limit (sbatch --signal=B:USR1@S, to the batch step's supervisor only)
LIMIT_SIGNAL = signal.SIGUSR1
SBATCH = "sbatch"  # the launch's stdin key for the job's sbatch options; its refusal's `error` word


class SlurmScheduler(SchedulerRecord, total=False):
    """run.json's `scheduler` of a Slurm run."""

    sbatch: list  # the whole sbatch command line it was submitted with (its partition: `_partition`)


class SlurmNodeRecord(RunRecord, total=False):
    """run.json of a Slurm run's node (the run dir's for node 0, `nodes/I/` for node I): `place_node`'s."""

    slurm_node: int  # SLURM_NODEID: the node's index in the allocation
    slurm_node_name: str  # Slurm's name for the node (status shows it)


class SlurmNodePart(TypedDict, total=False):
    """One node of a Slurm run over several, in its status (`node_states`)."""

    node: int
    slurm_node: str | None  # Slurm's name for it
    state: str  # a RunState word
    exit_code: int | None
    ended_at: str | None
    pid: int | None
    oversize: str  # the node's run.json, larger than RUN_JSON_MAX: not read


class SlurmStatus(TypedDict, total=False):
    """What `status` of a Slurm run over several nodes adds (`status_fields`); the laptop reads it."""

    slurm_nodes: list  # [SlurmNodePart...]: not `nodes` (hosts the laptop would open), its own key
    oversize: str  # a node's run.json past the cap: refused as the run's own would be


def _put(path: str, text: str, mode: int = 0o600) -> None:
    write_atomic(path, text.encode(), mode)


def _slurm_dir(run_dir: str) -> str:
    """`<workdir>/.thrust/slurm`, beside `runs/`."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(run_dir))), SLURM)


# One supervisor a node (srun); one that fails ends the others (the run failed). --cpu-bind=none: the
# step's one task would otherwise be bound to one CPU where the cluster binds tasks (task/affinity) when
# the job holds more (`exclusive`, `cpus-per-task`: srun of Slurm 22.05 to 23.02 does not inherit that),
# while the step holds all the job's CPUs on its node: each node's job gets them all, as the batch step
# of a one-node run has.
NODE_STEP = ("srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--cpu-bind=none")


def _user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def launch(run_dir: str, cwd: str, payload: dict, env: dict, record: RunRecord) -> dict:
    """`launch --slurm` (scheduled.Scheduler): `submit` with the launch's sbatch options (stdin's SBATCH)."""
    return submit(run_dir, cwd, list(payload.get(SBATCH) or []), env, record)


def submit(run_dir: str, cwd: str, sbatch: list[str], env: dict, meta: RunRecord) -> dict:
    """Write the batch script and the job's env, `sbatch --parsable` it, record the job id in run.json.
    The answer: {"queued", "scheduler_job", "run_dir", "marker"} or {"error", "detail"}."""
    script = os.path.join(run_dir, BATCH)
    # a new file, 0600, renamed over the name: never written through a link, nor into an older file's mode
    _put(os.path.join(run_dir, ENV), json.dumps(env))
    # The script runs this agent's supervisor in the foreground: Slurm's job is the supervisor, its
    # end the job's end. `exec` so a signal Slurm sends (time limit, scancel) reaches it directly.
    nodes = next((int(o.split("=", 1)[1]) for o in sbatch if o.startswith("--nodes=")), 1)
    step = NODE_STEP if nodes > 1 else ()
    body = "#!/bin/sh\nexec " + shlex.join([*step, sys.executable, "-S", os.path.abspath(sys.argv[0]), "supervise",
                                       "--run-dir", run_dir]) + "\n"
    _put(script, body, 0o700)
    argv = [SBATCH, "--parsable", f"--job-name=thrust-{os.path.basename(run_dir)}",
            f"--output={os.path.join(run_dir, SLURM_OUT)}", f"--chdir={cwd}", *sbatch, script]
    scheduler: SlurmScheduler = {"kind": SLURM, "submitted_ts": time.time(), SBATCH: argv, "nodes": nodes}
    meta = run_record(meta, scheduler=scheduler)
    write_record(run_dir, meta)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_S, check=False, env=_submit_env(),
                              preexec_fn=_ignore_term)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return _not_submitted(run_dir, meta, f"sbatch could not be run: {exc}")
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-600:]
        if not said and done.returncode < 0:
            said = f"sbatch was ended by signal {-done.returncode}"
        return _not_submitted(run_dir, meta, said)
    job_id = done.stdout.strip().split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"
    if not job_id.isdigit():  # exit 0 and no job (--test-only, --help...): nothing will ever run it
        said = (done.stdout + done.stderr).strip()[-600:] or "nothing"
        return _not_submitted(run_dir, meta, f"sbatch gave no job id (it said: {said})")
    update_meta(run_dir, {}, job_id=job_id)  # the job may have started already: its pid stays
    return {"queued": True, "scheduler_job": job_id, "run_dir": run_dir, "marker": meta.get("marker")}


def _ignore_term() -> None:
    """In sbatch's process before exec (an ignored signal stays ignored): a run continuing itself calls
    sbatch from its step, and when another node's supervisor exits first, srun (--kill-on-bad-exit) TERMs
    every process of the step; sbatch, cut mid-submit, would lose the next attempt. Its own timeout
    (CALL_S, a KILL) and Slurm's KILL after KillWait still end it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


# sbatch reads options from these too; a login profile that sets one would make the run an array, a
# wait, another cluster's job or a log split in two, which the sbatch: keys are refused for (scheduler.py)
NOT_FROM_ENV = frozenset({"SBATCH_ARRAY_INX", "SBATCH_WAIT", "SBATCH_CLUSTERS", "SBATCH_ERROR", "SBATCH_INPUT",
                          "SBATCH_OUTPUT", "SBATCH_OPEN_MODE", "SBATCH_JOB_NAME", "SBATCH_REQUEUE",
                          "SBATCH_EXPORT", "SBATCH_CHDIR", "SBATCH_TEST_ONLY"})


def _submit_env() -> dict[str, str]:
    """sbatch's environment: on an allocation (a run continuing itself) the job's own SLURM_* would be
    taken as the next job's options (its nodes, tasks, memory): only SLURM_CONF, which names the cluster.
    The SBATCH_* that stand for options a run sets or refuses are left out (NOT_FROM_ENV)."""
    return {k: v for k, v in os.environ.items()
            if (not k.startswith("SLURM_") or k == "SLURM_CONF") and k not in NOT_FROM_ENV}


def update_meta(run_dir: str, changes: dict, *, job_id: str | None = None) -> RunRecord:
    """run.json read, changed and written whole under its own lock: the login node records the job id
    while the allocation's supervisor may be recording the pid (a job can start before sbatch returns)."""
    fd = os.open(os.path.join(run_dir, ".run.json.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        meta = run_record(record_for_update(run_dir), changes)  # capped: an oversize one is refused
        if job_id:
            meta = run_record(meta, scheduler={**(meta.get(SCHEDULER) or {}), "job_id": job_id})
        write_record(run_dir, meta)
        return meta
    finally:
        os.close(fd)


def _not_submitted(run_dir: str, meta: RunRecord, detail: str) -> dict:
    """sbatch refused (a bad partition, account or QOS...): the run ended before it began."""
    _put(os.path.join(run_dir, EXIT_CODE), never_started_end())
    forget_env(run_dir)  # no job will ever read it
    return {"error": SBATCH, "detail": detail, "run_id": meta.get("run_id")}


def near_limit(run_dir: str) -> None:
    """Slurm's warning came: the time limit is near (the end then reads as a timeout)."""
    with contextlib.suppress(OSError):
        _put(os.path.join(run_dir, NEAR_LIMIT), utc_now())


RDZV_WAIT_S = 120.0  # how long a node waits for node 0's rendezvous address (it starts on the same allocation)


def place_node(run_dir: str, meta: SlurmNodeRecord, env: dict, argv: list[str]) -> tuple[str, list[str]]:
    """On the allocation: this node's directory for its log, run.json and end (the run dir on node 0,
    `nodes/I/` on node I) and its argv, torchrun's rendezvous filled in over several nodes: node 0's
    address as Slurm knows it (SLURM_LAUNCH_NODE_IPADDR: srun runs on node 0) and a port free there, put
    on the shared run dir's `rdzv.json` by node 0 and read by the others; each node's own --local-addr
    and the interface that reaches node 0 for gloo and NCCL."""
    nnodes = int((meta.get(SCHEDULER) or {}).get("nodes") or 1)
    if nnodes <= 1:
        return run_dir, argv
    node = int(os.environ.get("SLURM_NODEID") or 0)
    head = os.environ.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
    board = os.path.join(run_dir, RDZV_FILE)
    if node == 0:
        with socket.socket() as probe:
            probe.bind((head, 0))
            port = probe.getsockname()[1]
        _put(board, json.dumps({"address": head, "port": port}))
    else:
        deadline = time.monotonic() + RDZV_WAIT_S
        while (read_json(board) or {}).get("address") is None and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = read_json(board) or {}
        # node 0's word for its address, which it listens on, over this node's own env's view of it
        head, port = str(seen.get("address") or head), int(seen.get("port") or 0)
    from . import netinfo  # only here: every status imports this module, few runs span nodes

    route = netinfo.route_dev(head)
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if route.get("dev"):
            env.setdefault(name, route["dev"])
    own = route.get("src") or head
    filled = []
    for word in argv:
        if word.startswith("--rdzv-endpoint=") and RDZV_PENDING in word:
            word = f"--rdzv-endpoint={head}:{port}"
        elif word.startswith("--rdzv-conf="):
            word = word.replace("is_host=false", f"is_host={'true' if node == 0 else 'false'}")
            filled.append(word)
            word = f"--local-addr={own}"
        filled.append(word)
    here = run_dir if node == 0 else os.path.join(run_dir, NODES_DIR, str(node))
    os.makedirs(here, mode=0o700, exist_ok=True)
    meta["slurm_node"] = node
    meta["slurm_node_name"] = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # status names it
    return here, filled


def status_fields(run_dir: str, meta: RunRecord, status: dict) -> SlurmStatus:
    """What `status` adds for a run over several nodes (scheduled.Scheduler): its nodes' parts, and the
    first node's run.json past the cap as the run's `oversize` (the laptop refuses the run for it, 74)."""
    parts = node_states(run_dir, meta, status)
    if not parts:
        return {}
    out: SlurmStatus = {"slurm_nodes": parts}
    big = next((p["oversize"] for p in parts if "oversize" in p), None)
    if big and "oversize" not in status:
        out["oversize"] = big
    return out


def node_states(run_dir: str, meta: RunRecord, run: dict) -> list[SlurmNodePart] | None:
    """A run over several nodes: each node's part as its own files in the shared run dir say (node 0's
    the run dir's, node I's `nodes/I/`): {"node", "slurm_node" (Slurm's name for it), "state",
    "exit_code", "ended_at", "pid"}, and "oversize": PATH when the node's run.json is larger than
    RUN_JSON_MAX (read as nothing, as a run's own: status says so). `run` is the run's own status; None
    for a run on one node. A node whose supervisor has not started is QUEUED while the run may still
    start it, LOST once it has ended; an ended one FINISHED with code 0, STOPPED when the run was
    stopped, else FAILED."""
    nnodes = int((meta.get(SCHEDULER) or {}).get("nodes") or 1)
    if nnodes <= 1:
        return None
    live = RunState.of(run.get("state")).is_live
    out = []
    for node in range(nnodes):
        here = run_dir if node == 0 else os.path.join(run_dir, NODES_DIR, str(node))
        own: SlurmNodeRecord = meta if node == 0 else read_record(here)
        end = read_json(os.path.join(here, EXIT_CODE))
        code = end.get("exit_code") if end else None
        if end is not None and code is not None:
            state = (RunState.FINISHED if code == 0 else
                     RunState.STOPPED if os.path.exists(os.path.join(run_dir, STOPPED)) else RunState.FAILED)
        elif "pid" in own:
            state = RunState.RUNNING if live else RunState.LOST
        else:
            state = RunState.QUEUED if live else RunState.LOST
        big = node != 0 and oversize(os.path.join(here, RUN_JSON))
        out.append({"node": node, "slurm_node": own.get("slurm_node_name"), "state": state.value,
                    "exit_code": code, "ended_at": (end or {}).get("ended_at"), "pid": own.get("pid"),
                    **({"oversize": os.path.join(here, RUN_JSON)} if big else {})})
    return out


def forget_env(run_dir: str) -> None:
    """The job's env (its `env:` values may be secrets) kept only while the job may still start."""
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(run_dir, ENV))


def job_env(run_dir: str) -> dict:
    """The env `submit` kept for the supervisor on the allocation."""
    try:
        with open(os.path.join(run_dir, ENV)) as fh:
            env = json.load(fh)
    except (OSError, ValueError):
        return {}
    return env if isinstance(env, dict) else {}


def poll(slurm_dir: str) -> dict:
    """{"at", "jobs": {id: [STATE, REASON]}, "error"?}: the account's jobs as squeue saw them at most
    POLL_S seconds ago (asked now, under a lock, when the kept answer is older)."""
    os.makedirs(slurm_dir, mode=0o700, exist_ok=True)
    path = os.path.join(slurm_dir, "squeue.json")
    kept = _kept_answer(path)
    if kept and time.time() - float(kept.get("at", 0)) < POLL_S:
        return kept
    fd = os.open(os.path.join(slurm_dir, "squeue.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # one asks; the others read what it got
        kept = _kept_answer(path)
        if kept and time.time() - float(kept.get("at", 0)) < POLL_S:
            return kept
        answer = _squeue()
        _put(path, json.dumps(answer))
        return answer
    finally:
        os.close(fd)


def _kept_answer(path: str) -> dict | None:
    """squeue's kept answer: the account's own cache, as large as its list of jobs (not a run's file,
    which runjson.read_json reads capped)."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _squeue() -> dict:
    at = time.time()
    argv = ["squeue", "--noheader", "--states=all", f"--user={_user()}", "--format=%i|%T|%r"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"at": at, "jobs": {}, "error": f"squeue: {exc}"}
    if done.returncode != 0:
        return {"at": at, "jobs": {}, "error": (done.stderr or done.stdout).strip()[-300:]}
    jobs = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3:
            jobs[parts[0]] = [parts[1], parts[2]]
    return {"at": at, "jobs": jobs}


def _sacct(job_id: str) -> str | None:
    """The state accounting kept of a job squeue no longer shows (None without accounting storage)."""
    argv = ["sacct", "-X", "--noheader", "--parsable2", f"--jobs={job_id}", "--format=State"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CALL_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    words = done.stdout.split()
    return words[0] if done.returncode == 0 and words else None


def view(run_dir: str, meta: RunRecord, *, exit_code: int | None, ended: bool, stopped: bool) -> SchedulerView:
    """A Slurm run's state: what its run directory recorded with the scheduler's word on it. Once that
    state is an end, the job's env (its `env:` values: secrets, perhaps) is removed: whatever ended the run
    (sbatch's refusal, a cancel while pending, a lost launch, the job's end), no job will read it now."""
    out = _view(run_dir, meta, exit_code=exit_code, ended=ended, stopped=stopped)
    if out["state"].is_terminal:
        forget_env(run_dir)
    return out


def _view(run_dir: str, meta: RunRecord, *, exit_code: int | None, ended: bool, stopped: bool) -> SchedulerView:
    sched = meta.get(SCHEDULER) or {}
    job_id = str(sched.get("job_id") or "")
    started = "pid" in meta
    never = read_json(os.path.join(run_dir, CANNOT_START))
    if never is not None:  # the cluster can never start it: cancelled, the run FAILED (not STOPPED) for it
        return {"state": RunState.FAILED, "reason": "cannot-start", "reason_detail": str(never.get("detail") or "")}
    if not job_id:  # sbatch refused (its end written), the launch still submitting, or cut while it did
        if ended:
            return {"state": RunState.FAILED, "reason": NOT_SUBMITTED}
        if time.time() - float(sched.get("submitted_ts") or 0) > 2 * CALL_S:
            return {"state": RunState.LOST, "reason": NOT_SUBMITTED,
                    "reason_detail": "its launch ended before sbatch gave it a job id"}
        return {"state": RunState.QUEUED, "reason": "submitting"}
    final = read_json(os.path.join(run_dir, END))
    if final is not None:
        word, reason = final.get("state"), str(final.get("reason") or "")
    else:
        word, reason = _ask(run_dir, sched, job_id)
        if word == "?":  # the scheduler did not answer: what the run dir says, live until it ends
            if ended:
                return slurm_state(None, "", exit_code=exit_code, ended=True, stopped=stopped, started=started)
            return {"state": RunState.RUNNING if started else RunState.QUEUED, "reason": "scheduler-unreachable",
                    "reason_detail": reason}
        if word == "PENDING" and not (started or ended or stopped):
            if never_starts(reason):
                return _give_up(run_dir, sched, job_id, reason)
            _tell_pending(run_dir, reason)
    said = SLURM_STATES.get((word or "").split(" ")[0].rstrip("+"))
    if ended and not stopped and started and (exit_code or 0) >= 128 and said is not None \
            and said[0] == RunState.QUEUED:
        # killed by a signal, and the kept answer is older than the job's start: the scheduler's word on
        # why (a cancel, the time limit, a failed node) comes with the next poll; not FAILED meanwhile
        word = RunState.RUNNING.value  # Slurm's word for it is the same as ours
    if ended and not stopped and os.path.exists(os.path.join(run_dir, NEAR_LIMIT)):
        word = "TIMEOUT"  # it ended on Slurm's warning, before the limit itself: a timeout all the same
    elif ended and not stopped and os.path.exists(os.path.join(run_dir, PREEMPT_MARK)):
        word = "PREEMPTED"  # its supervisor saw it: before squeue, which says so once the job is gone
    out = slurm_state(word, reason, exit_code=exit_code, ended=ended, stopped=stopped, started=started)
    said = SLURM_STATES.get((word or "").split(" ")[0].rstrip("+"))
    if final is None and (word is None or (said is not None and said[0].is_terminal)):
        with contextlib.suppress(OSError):  # the scheduler's last word: never asked again for this run
            _put(os.path.join(run_dir, END), json.dumps({"state": word, "reason": reason, "at": utc_now()}))
    return out


def _ask(run_dir: str, sched: dict, job_id: str) -> tuple[str | None, str]:
    """(Slurm's state word or None when it no longer knows the job, its reason); ("?", error) when
    squeue did not answer."""
    seen = poll(_slurm_dir(run_dir))
    if seen.get("error") and not seen.get("jobs"):
        return "?", str(seen["error"])
    entry = (seen.get("jobs") or {}).get(job_id)
    if entry:
        return entry[0], entry[1] if entry[1] != "None" else ""
    if float(sched.get("submitted_ts") or 0) >= float(seen.get("at") or 0) - 1:
        return "PENDING", "submitted"  # asked before (or as) it was submitted: not known yet, not gone
    return _sacct(job_id), ""


# Slurm's pending reasons (squeue's %r; docs: "Job Reason Codes", 22.05) that no wait will clear: the
# request is more than the partition, the account or the QOS allows a job, or names what does not exist.
# A PENDING job with one of these is cancelled and its run FAILED, saying why (`_give_up`).
NEVER_STARTS = {
    "PartitionConfig": "the job asks for more than partition {partition} offers a job (nodes, CPUs, memory or "
                       "GPUs); ask for less, or set the host's partition: to one that has it",
    "PartitionNodeLimit": "the job asks for more nodes than partition {partition} allows a job; ask for fewer "
                          "(train --nodes), or set the host's partition: to one that allows them",
    "PartitionTimeLimit": "the host's time: is over partition {partition}'s time limit; set time: to that limit or "
                          "less (doctor --host shows it)",
    "BadConstraints": "no node has what the job's constraints ask (sbatch: constraint); change them",
    "InvalidAccount": "the account is not one Slurm knows for you; set the host's account:",
    "AccountNotAllowed": "partition {partition} does not take jobs of this account; set the host's account: or "
                         "partition:",
    "InvalidQOS": "the QOS is not one your account may use; set sbatch: {{qos: ...}} to one it may",
    "QOSNotAllowed": "partition {partition} does not take jobs of this QOS; set sbatch: {{qos: ...}}",
    "DependencyNeverSatisfied": "a job it depends on ended so that it never can start (sbatch: dependency)",
}
# a per-job maximum (or minimum) of the account's association or QOS: the job itself is over it for ever
# (AssocMaxNodesPerJobLimit, QOSMaxWallDurationPerJobLimit, QOSMinGRES...); Grp* and per-user limits clear
_PER_JOB_LIMIT = re.compile(r"^(Assoc|QOS)(Max\w*Per(Job|Node)\w*|Min\w+)$")
# what a pending reason that may clear means, said in the run's log while it waits
_WAITING = {
    "Resources": "the nodes it asks for are busy",
    "Priority": "jobs of higher priority are ahead of it",
    "Dependency": "it waits for the jobs it depends on",
    "BeginTime": "its start time has not come",
    "JobHeldUser": "held: scontrol release JOB starts it",
    "JobHeldAdmin": "held by the cluster's admins",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionDown": "its partition is down",
    "PartitionInactive": "its partition is inactive",
    "Reservation": "it waits for its reservation",
}


def never_starts(reason: str) -> bool:
    """Whether a pending job's reason means Slurm will never start it as asked."""
    return reason in NEVER_STARTS or bool(_PER_JOB_LIMIT.match(reason))


def _partition(sched: dict) -> tuple[str, int | None]:
    """The job's partition (its --partition, else the cluster's default) and its number of nodes (sinfo;
    None when sinfo does not say)."""
    asked = next((a.split("=", 1)[1] for a in sched.get(SBATCH) or () if str(a).startswith("--partition=")), "")
    try:
        done = subprocess.run(["sinfo", "--noheader", "--format=%P|%D"], capture_output=True, text=True,
                              timeout=CALL_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return asked or "(the default)", None
    for line in done.stdout.splitlines():
        name, _, count = line.strip().partition("|")
        if (name.rstrip("*") == asked or (not asked and name.endswith("*"))) and count.isdigit():
            return name.rstrip("*"), int(count)
    return asked or "(the default)", None


def _never_detail(sched: dict, reason: str) -> str:
    """Why Slurm cannot start the job, in the terms of the request (`--nodes 5` against the partition's
    nodes), and what to change."""
    partition, count = _partition(sched)
    nodes = int(sched.get("nodes") or 1)
    if reason in ("PartitionConfig", "PartitionNodeLimit") and count is not None and nodes > count:
        fewer = f"--nodes {count}" if count == 1 else f"--nodes {count} or fewer"
        why = (f"--nodes {nodes} asks for {nodes} nodes; partition {partition} has {count}: train with {fewer}, "
               "or set the host's partition: to a larger one")
    elif reason in NEVER_STARTS:
        why = NEVER_STARTS[reason].format(partition=partition)
    else:
        why = "the job is over a per-job limit of its account or QOS (sacctmgr show assoc / qos); ask for less"
    return f"the cluster cannot start it: {reason} ({why})"


def _give_up(run_dir: str, sched: dict, job_id: str, reason: str) -> SchedulerView:
    """A job Slurm can never start: its run's log told why (its last words, the ones a follower shows
    last), `cannot-start` written (the run is FAILED for it from now on, and its supervisor, should the
    job start after all, runs nothing), the job cancelled and the run's never-started end written. Under
    the run's lock: one of the account's processes does it, once."""
    fd = os.open(os.path.join(run_dir, ".run.json.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        mark = read_json(os.path.join(run_dir, CANNOT_START))
        if mark is None:
            detail = _never_detail(sched, reason)
            _log(run_dir, f"thrust: {detail}; its job {job_id} was cancelled")
            mark = {"reason": reason, "detail": detail, "job_id": job_id, "at": utc_now()}
            _put(os.path.join(run_dir, CANNOT_START), json.dumps(mark))
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["scancel", job_id], capture_output=True, timeout=CALL_S, check=False)
            if not os.path.exists(os.path.join(run_dir, EXIT_CODE)):
                _put(os.path.join(run_dir, EXIT_CODE), never_started_end())
    finally:
        os.close(fd)
    return {"state": RunState.FAILED, "reason": "cannot-start", "reason_detail": str(mark.get("detail") or "")}


def _tell_pending(run_dir: str, reason: str) -> None:
    """A pending reason that may clear (Resources, Priority...) is said in the run's log when it changes:
    a follower shows why the run waits. Our own pseudo-reason (`submitted`) is not Slurm's."""
    if reason in ("", "None", "submitted"):
        return
    seen = os.path.join(run_dir, PENDING_SEEN)
    fd = os.open(os.path.join(run_dir, ".run.json.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(OSError), open(seen) as fh:
            if fh.read() == reason:
                return
        meaning = _WAITING.get(reason) or ("a limit of its account or QOS shared with other jobs"
                                           if reason.startswith(("AssocGrp", "QOSGrp")) else "")
        _log(run_dir, f"thrust: waiting in Slurm's queue: {reason}{f' ({meaning})' if meaning else ''}")
        _put(seen, reason)
    except OSError:
        return
    finally:
        os.close(fd)


def _log(run_dir: str, line: str) -> None:
    """A line of the tool's own in the run's log (appended, as the supervisor will append the job's)."""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.join(run_dir, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, (line + "\n").encode(errors="replace"))
        finally:
            os.close(fd)


def cancel(run_dir: str, meta: RunRecord) -> dict:
    """`stop` of a Slurm run, pending or running: `stopped` written first (so the end the TERM brings reads
    STOPPED, and a supervisor starting meanwhile runs nothing), then scancel; the supervisor on the
    allocation records the job's end as it goes. A scancel that failed (slurmctld or munge down, no job
    id yet) takes back the mark it made: the stop did not happen, and the run's own end, later, is not
    relabelled STOPPED by it."""
    job_id = str((meta.get(SCHEDULER) or {}).get("job_id") or "")
    mark = os.path.join(run_dir, STOPPED)
    made = not os.path.exists(mark)
    if made:
        _put(mark, utc_now())
    answer = _scancel(job_id)
    if not answer.get("stopped"):
        if made:
            with contextlib.suppress(OSError):
                os.unlink(mark)
        return answer
    if "pid" not in meta and not os.path.exists(os.path.join(run_dir, EXIT_CODE)):
        # cancelled before it started: its end is known now, not at the next poll (its supervisor, should
        # it have been starting, sees `stopped` and starts nothing), and its env will never be read
        _put(os.path.join(run_dir, EXIT_CODE), never_started_end())
        forget_env(run_dir)
    return answer


def _scancel(job_id: str) -> dict:
    if not job_id:
        return {"stopped": False, "error": "no scheduler job id"}
    try:
        done = subprocess.run(["scancel", job_id], capture_output=True, text=True, timeout=CALL_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"stopped": False, "error": f"scancel: {exc}"}
    if done.returncode != 0:
        return {"stopped": False, "error": (done.stderr or done.stdout).strip()[-300:]}
    return {"stopped": True, "killed": False, "scheduler_job": job_id}


def note_preempted(run_dir: str) -> bool:
    """After the job's TERM, on the allocation: whether Slurm preempted it, written in the run dir. Slurm
    sends a preempted job the TERM a `scancel` sends (and no --signal warning), but sets the job's
    PreemptTime first: one `scontrol show job`, asked only when a TERM came and nobody stopped the run."""
    job_id = os.environ.get("SLURM_JOB_ID")
    if not job_id or os.path.exists(os.path.join(run_dir, STOPPED)):
        return False
    try:
        shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                               timeout=CALL_S, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    at = next((w.split("=", 1)[1] for w in shown.split() if w.startswith("PreemptTime=")), "None")
    if at in ("None", "Unknown", ""):
        return False
    with contextlib.suppress(OSError):
        _put(os.path.join(run_dir, PREEMPT_MARK), at)
    return True


def continue_itself(run_dir: str, meta: RunRecord, env: dict) -> dict | None:
    """On the allocation's node 0, after the job exited and before its end is written: a run warned of
    its time limit, or preempted (`note_preempted`), whose launch asked for it (run.json's `self_retry`,
    written by the laptop when the job's `retry: on:` has `timeout` or `preempted` and it can resume)
    submits its next attempt itself, so no laptop need be following it. The same tree and venv, a new
    run id and directory with `resumed_from`, the newest checkpoint linked in (as `resume` does) and
    copied where the job reads it (`resume: {checkpoint_at: P}`, `place_for_next`),
    `self_retry.attempt` counted against `max`. The new run is recorded in this run's `continued_by`
    before its end is: whoever sees the end sees where it went on (a follower follows it instead of
    submitting one of its own). None when it does not continue."""
    plan = meta.get(SELF_RETRY)
    if not isinstance(plan, dict) or os.path.exists(os.path.join(run_dir, STOPPED)):
        return None  # not asked for, or stopped: nothing to continue
    on = plan.get("on") or ()
    if not any(event in on and os.path.exists(os.path.join(run_dir, mark))
               for event, mark in ((TIMEOUT, NEAR_LIMIT), (PREEMPTED, PREEMPT_MARK))):
        return None  # it ended on its own (or for a reason its retry does not answer)
    attempt, most = int(plan.get("attempt") or 0), int(plan.get("max") or 0)
    if attempt >= most:
        return _not_continued(run_dir, f"its retry: max ({most}) is reached")
    cwd = str(meta.get("cwd") or run_dir)
    # a tree of the run's own holds only its files; a shared checkout only those written while it ran
    own_tree = isinstance(meta.get("tree"), str)
    since = None if own_tree or not meta.get("started_ts") else float(meta["started_ts"])
    found = list_files(cwd, run_dir, [str(plan.get("checkpoints") or "")], since).get("files") or []
    if not found:
        return _not_continued(run_dir, f"no checkpoint matches {plan.get('checkpoints')!r}")
    newest = max(found, key=lambda f: (f["mtime"], f["path"]))
    unplaced = place_for_next(plan, meta, cwd, newest)
    if unplaced:
        return _not_continued(run_dir, unplaced)
    old_id = os.path.basename(run_dir)
    new_id = new_run_id(str(meta.get("job") or "run"))
    new_dir = os.path.join(os.path.dirname(run_dir), new_id)
    os.mkdir(new_dir, 0o700)  # the account's alone, as every run dir (makedirs' mode is the leaf's only)
    os.mkdir(os.path.join(new_dir, RESUME_DIR), 0o700)
    target = os.path.join(new_dir, RESUME_DIR, os.path.basename(newest["abs"]))
    # linked (else copied): the old run's tree may be reclaimed (keep:) before the new run reads it
    try:
        os.link(newest["abs"], target)
    except OSError:
        shutil.copy2(newest["abs"], target)

    def moved(word: str) -> str:  # the laptop's template names this run's dir and id: the new run's instead
        return word.replace(CHECKPOINT_FIELD, target).replace(run_dir, new_dir).replace(old_id, new_id)

    if os.path.exists(os.path.join(run_dir, PATCH)):  # the uncommitted changes it ran with: a resume rebuilds them
        shutil.copy2(os.path.join(run_dir, PATCH), os.path.join(new_dir, PATCH))
    marker = secrets.token_hex(8)
    new_env = {k: moved(v) if isinstance(v, str) else v for k, v in env.items()}
    new_env["THRUST_RUN_MARKER"] = marker
    new_meta = run_record({k: v for k, v in meta.items() if k not in _STARTED}, run_id=new_id, marker=marker,
                          resumed_from=old_id, argv=[moved(w) for w in plan["argv"]],
                          env={k: moved(v) if isinstance(v, str) else v for k, v in (meta.get("env") or {}).items()},
                          self_retry={**plan, "attempt": attempt + 1})
    answer = submit(new_dir, cwd, list(plan.get(SBATCH) or []), new_env, new_meta)
    if not answer.get("queued"):
        return _not_continued(run_dir, f"sbatch refused its next attempt {new_id}: {answer.get('detail')}")
    went_on = {"run_id": new_id, "host": plan.get("host"), "scheduler_job": answer["scheduler_job"]}
    update_meta(run_dir, {CONTINUED_BY: [*(meta.get(CONTINUED_BY) or []), went_on]})
    return went_on


def place_for_next(plan: dict, meta: RunRecord, cwd: str, newest: dict) -> str | None:
    """The newest checkpoint put where the job reads it (`resume: {checkpoint_at: P}`, the plan's
    CHECKPOINT_AT) before its next attempt is submitted, as `resume` puts it (placing.place: a copy,
    hashed against the listing's sha256, inside the run's tree, renamed into place): the next attempt
    runs in the same tree, but its checkpoints glob need not be P. Why it could not, else None."""
    at = plan.get(CHECKPOINT_AT)
    if not isinstance(at, str) or not at:
        return None
    if os.path.realpath(os.path.join(cwd, at)) == os.path.realpath(newest["abs"]):
        return None  # the job's own newest checkpoint is where it reads it already
    tree = meta.get("tree")
    root = tree if isinstance(tree, str) and (cwd == tree or cwd.startswith(f"{tree}/")) else cwd
    try:
        answer = placing.place(newest["abs"], root, cwd, at, newest.get("sha256"))
    except OSError as exc:
        return f"its checkpoint {newest['abs']} could not be placed at {at}: {type(exc).__name__}: {exc}"
    return f"its checkpoint was not placed at {at}: {answer['error']}" if "error" in answer else None


def _not_continued(run_dir: str, why: str) -> None:
    """Said in run.json (status shows it): the laptop's follower, if any, may still retry it."""
    update_meta(run_dir, {CONTINUE_ERROR: why})
