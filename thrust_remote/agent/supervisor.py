"""The agent's run supervisor: detached runs on the host (docs/architecture.md, "The run directory on the host").

    agent launch --run-dir D --cwd W --lock L [--gpus LIST] [--marker M] [--stdin] [--meta JSON --env JSON]
                 [--queue --order TS [--gpu-count N --gpu-pool LIST] [--cpu-slots N]] -- ARGV...
    agent status --run-dir D
    agent list --runs-dir R
    agent stop --run-dir D [--grace S] [--peer-failed JSON]
    agent launch-outcome --run-dir D --lock L

A node of a run over several hosts (run.json has `node` and `watch_peers`) also runs peerwatch.py's
watch in its supervisor, and `stop --peer-failed` ends it FAILED for the node named, not STOPPED.

`launch` double-forks: the supervisor becomes a session leader with every stream redirected (so the
SSH channel closes at once and the run survives the link), starts the job in a process group of its
own (so `stop` can signal the job's whole tree and still leave the supervisor to record the end),
waits for it, and writes `exit_code` atomically. `launch` prints one JSON line and returns at once.
With `--queue` a launch that cannot start now leaves its supervisor waiting its turn (runqueue.py):
the run is QUEUED until then.

`launch-outcome` settles a launch whose answer never came (its `agent serve` stopped answering): under
the launch lock, a run dir with a run.json was launched (its status is the answer); one without gets
`withdrawn`, so the launch, should it arrive late, is refused and never runs unrecorded.

A run is RUNNING only when its supervisor's recorded pid is alive *and* its start time matches *and* it
holds the run's log as its stdout (or has the marker on its command line), or the job's pid and start
time match and the run's marker is in its environment (a recycled pid is not our run); otherwise FINISHED/FAILED/STOPPED
from `exit_code`, or LOST when nothing recorded an end.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

from . import idlewatch, peerwatch, runqueue, slurm
from .checkout import free_bytes
from .files import lock_within, unreadable, write_atomic
from .protocol import (
    END_RESERVE,
    END_RESERVE_BYTES,
    EXIT_CODE,
    GPUS_USED,
    LOG,
    PEER_FAILED,
    QUEUE,
    RESUMED_FROM,
    RUN_JSON,
    RUN_JSON_MAX,
    SCHEDULER,
    SELF_RETRY,
    STOPPED,
    WITHDRAWN,
    AgentExit,
    RunState,
    never_started_end,
    utc_now,
)


def _write_atomic(path: str, data: str) -> None:
    write_atomic(path, data.encode())


def read_json(path: str) -> dict | None:
    """A run's JSON file; None when absent, not JSON, or larger than RUN_JSON_MAX (never read whole)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(RUN_JSON_MAX + 1)
        return None if len(data) > RUN_JSON_MAX else json.loads(data)
    except (OSError, ValueError, RecursionError):
        return None


def _oversize(path: str) -> bool:
    try:
        return os.stat(path).st_size > RUN_JSON_MAX
    except OSError:
        return False


def _proc_start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): a pid's identity together with the pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]


def _proc_cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _proc_environ_has(pid: int, needle: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle.encode() in fh.read().split(b"\0")
    except OSError:
        return False


def _supervisor_alive(meta: dict, run_dir: str) -> bool:
    """The run's supervisor still there: its pid with its start time, and holding this run's log as its
    stdout (it made it so first thing: a recycled pid, or another live process put in run.json, does not).
    Or, as before, the run's marker on its command line (`agent serve` execs a launch, so the supervisor's
    command line is the launch's: either proof is enough)."""
    pid, start = meta.get("supervisor_pid"), meta.get("supervisor_start")
    if not pid or not start or _proc_start_time(pid) != start:
        return False
    try:
        holds_log = os.path.realpath(f"/proc/{pid}/fd/1") == os.path.realpath(os.path.join(run_dir, LOG))
    except OSError:
        holds_log = False
    return holds_log or _alive(pid, start, meta.get("marker"))


def _alive(pid: int | None, start: str | None, marker: str | None, *, in_env: bool = False) -> bool:
    if not pid or not start or not marker:
        return False
    if _proc_start_time(pid) != start:
        return False
    if in_env:
        return _proc_environ_has(pid, f"THRUST_RUN_MARKER={marker}")
    return marker in _proc_cmdline(pid)


def _exit_text(run_dir: str) -> str | None:
    with contextlib.suppress(OSError), open(os.path.join(run_dir, EXIT_CODE)) as fh:
        return fh.read().strip()
    return None


def run_state(run_dir: str, meta: dict | None = None, *, read_again: bool = True) -> dict:
    """The status object of one run directory (docs/architecture.md, "JSON shapes"); `meta`: its
    run.json when the caller has read it already."""
    oversize = not meta and _oversize(os.path.join(run_dir, RUN_JSON))  # a capped read gives None: {} to callers
    meta = meta or read_json(os.path.join(run_dir, RUN_JSON)) or {}
    exit_text = _exit_text(run_dir)
    stopped = os.path.exists(os.path.join(run_dir, STOPPED))
    marker = meta.get("marker")
    exit_code, ended_at, ended_ts, never_started = _end(exit_text)
    sched = slurm.view(run_dir, meta, exit_code=exit_code, ended=exit_code is not None or never_started,
                       stopped=stopped) if meta.get(SCHEDULER) else None
    if sched is not None:  # a cluster's run: the scheduler knows what this login node cannot see
        state = sched["state"]
    elif exit_code is not None:
        state = RunState.STOPPED if stopped else (RunState.FINISHED if exit_code == 0 else RunState.FAILED)
    elif never_started:  # ended while queued: stopped, or failed for another node (stop --peer-failed)
        state = RunState.STOPPED if stopped else RunState.FAILED
    elif meta.get(QUEUE) and "pid" not in meta:  # launched with --queue, not started yet
        alive = _supervisor_alive(meta, run_dir)
        state = RunState.QUEUED if alive else (RunState.STOPPED if stopped else RunState.LOST)
    elif _supervisor_alive(meta, run_dir):
        state = RunState.RUNNING
    elif _alive(meta.get("pid"), meta.get("pid_start"), marker, in_env=True):
        state = RunState.RUNNING  # the supervisor is gone but the job is still ours and alive
    elif not meta:
        state = RunState.LOST
    else:
        state = RunState.STOPPED if stopped else RunState.LOST
    if read_again and sched is None and state in (RunState.LOST, RunState.STOPPED) and exit_code is None \
            and _exit_text(run_dir) != exit_text:
        # the supervisor writes the exit code, then exits: one that ended between the read above and
        # the look at its process left its code meanwhile (a finished node of a run over two hosts was
        # read as LOST, and the run FAILED, while its peer finished)
        return run_state(run_dir, meta, read_again=False)
    reason = _stop_reason(run_dir) if state == RunState.STOPPED else None
    if sched is not None and sched.get("reason") and not (reason and reason[0] != "user"):
        reason = (sched["reason"], sched.get("reason_detail", ""))
    # no run.json, or LOST: perhaps files this account cannot read; then say so (only then: a waiter reads
    # every run dir each poll)
    denied = unreadable(run_dir, (RUN_JSON, EXIT_CODE)) if state == RunState.LOST or not meta else None
    free = free_bytes(run_dir) if state in (RunState.FAILED, RunState.LOST) else None  # a full disk?
    return {
        "run_id": meta.get("run_id") or os.path.basename(os.path.normpath(run_dir)),
        "state": state,
        **({"reason": reason[0], "reason_detail": reason[1]} if reason else {}),
        **({"unreadable": denied} if denied else {}),
        **({"oversize": os.path.join(run_dir, RUN_JSON)} if oversize else {}),
        **({"disk_free": free} if free is not None else {}),
        "exit_code": exit_code,
        "pid": meta.get("pid"),
        "started_at": meta.get("started_at"),
        "ended_at": ended_at,
        "host": meta.get("host"),
        "job": meta.get("job"),
        "commit": meta.get("commit"),
        "cwd": meta.get("cwd"),  # where the job ran (a cargo job: its crate, where its artifact is)
        "gpus": meta.get("gpus") or [],
        "ended_ts": ended_ts,
        **({"queued_at": meta[QUEUE].get("queued_at")} if isinstance(meta.get(QUEUE), dict) else {}),
        **({"scheduler_job": meta[SCHEDULER].get("job_id")} if isinstance(meta.get(SCHEDULER), dict) else {}),
        **({RESUMED_FROM: meta[RESUMED_FROM]} if isinstance(meta.get(RESUMED_FROM), str) else {}),
        # a cluster's run that resubmitted itself (slurm.continue_itself: time limit, preemption), or why not
        **({slurm.CONTINUED_BY: meta[slurm.CONTINUED_BY]} if isinstance(meta.get(slurm.CONTINUED_BY), list) else {}),
        **({slurm.CONTINUE_ERROR: meta[slurm.CONTINUE_ERROR]} if meta.get(slurm.CONTINUE_ERROR) else {}),
        **_hours(run_dir, meta, state, ended_ts),
        **({"node": meta["node"], "nodes": [n.get("host") for n in meta.get("nodes") or []],
            "peer_failed": read_json(os.path.join(run_dir, PEER_FAILED))} if "node" in meta else {}),
    }


def _end(text: str | None) -> tuple[int | None, str | None, float | None, bool]:
    """`exit_code`'s (code, ended_at, ended_ts, never started): a run that ended while queued has no code."""
    try:
        end = json.loads(text) if text else None
    except ValueError:
        end = None
    if not isinstance(end, dict):
        return None, None, None, False
    code = end.get("exit_code")
    try:
        code = None if code is None else int(code)
    except (TypeError, ValueError):
        return None, None, None, False
    return code, end.get("ended_at"), end.get("ended_ts"), code is None and bool(end.get("never_started"))


def _queue_view(runs_dir: str, ended: set[str] | None = None) -> list[tuple[dict, runqueue.Entry]]:
    """Each run dir's status object and what the queue needs of it. `ended`: run dirs known to have
    ended, skipped and added to (a waiter looks every POLL_S s: an ended run holds and wants nothing,
    and reading hundreds of them each time costed a waiter ~6% of a core)."""
    out = []
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
        path = os.path.join(runs_dir, name)
        if ended is not None and name in ended:
            continue
        if os.path.isdir(path) and not _withdrawn(path):
            meta = read_json(os.path.join(path, RUN_JSON)) or {}
            st = run_state(path, meta)
            if ended is not None and st["ended_at"] is not None:  # a recorded end: final (a dir
                ended.add(name)  # without run.json yet reads LOST but may be a launch under way)
            spec = meta.get(QUEUE) if isinstance(meta.get(QUEUE), dict) else None
            out.append((st, runqueue.Entry(st["run_id"], st["state"], st["gpus"], spec)))
    return out


def _placed(st: dict, view: list[tuple[dict, runqueue.Entry]]) -> dict:
    """A QUEUED run's status object with its place in the queue (the host's: a run waiting in a cluster's
    scheduler has Slurm's reason instead)."""
    if st["state"] != RunState.QUEUED or st.get("scheduler_job"):
        return st
    spec = next((e.spec for _, e in view if e.run_id == st["run_id"]), None) or {}
    return {**st, "position": runqueue.position(spec, st["run_id"], [e for _, e in view])}


def _stop_reason(run_dir: str) -> tuple[str, str] | None:
    """Why a STOPPED run stopped: `user` (stop on request, the file holds its time) or the reason the
    file's JSON names (`idle`: the idle-GPU stop)."""
    try:
        with open(os.path.join(run_dir, STOPPED)) as fh:
            text = fh.read()
    except OSError:
        return None
    try:
        note = json.loads(text)
    except ValueError:
        return ("user", "")
    return (str(note.get("reason") or "user"), str(note.get("detail") or "")) if isinstance(note, dict) else None


def _hours(run_dir: str, meta: dict, state: str, ended_ts: float | None) -> dict:
    """wall_hours and gpu_hours by this host's clock: to the end, or to now while it runs; a LOST run
    has no end record, so its log's last write is the last sign it was alive."""
    start = meta.get("started_ts")
    end = ended_ts
    if end is None and state == RunState.RUNNING:
        end = time.time()
    elif end is None:
        try:
            end = os.stat(os.path.join(run_dir, LOG)).st_mtime
        except OSError:
            end = None
    if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
        return {"wall_hours": None, "gpu_hours": None}
    wall = max(0.0, float(end) - float(start)) / 3600
    used = meta.get(GPUS_USED, meta.get("gpus")) or []
    return {"wall_hours": round(wall, 6), "gpu_hours": round(wall * len(used), 6)}


def _collision(run_dir: str, gpus: list[int]) -> dict | None:
    """What a launch into run_dir claiming `gpus` would collide with: the same run dir still
    RUNNING, or a RUNNING run of the same runs directory holding one of those GPUs (its run.json
    `gpus`). None when nothing does. Called under the launch lock."""
    if os.path.exists(os.path.join(run_dir, RUN_JSON)) and run_state(run_dir)["state"].is_live:
        return {"error": "exists", "run_id": os.path.basename(run_dir)}
    if _withdrawn(run_dir):  # the laptop gave this launch up and was told it never started: it never will
        return {"error": "withdrawn", "run_id": os.path.basename(run_dir)}
    if not gpus:
        return None
    runs_dir = os.path.dirname(run_dir)
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
        other = os.path.join(runs_dir, name)
        held = (read_json(os.path.join(other, RUN_JSON)) or {}).get("gpus") or []
        shared = sorted({int(g) for g in held if isinstance(g, int)} & set(gpus))
        if shared and other != run_dir and run_state(other)["state"] == RunState.RUNNING:
            return {"error": "gpus-taken", "run_id": name, "gpus": shared}
    return None


def cmd_launch(args: argparse.Namespace, argv: list[str]) -> int:
    run_dir = os.path.abspath(args.run_dir)
    lock_path = args.lock
    os.makedirs(os.path.dirname(lock_path), mode=0o700, exist_ok=True)
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    # Held while we check and until the new run's run.json exists: two launches claiming the same
    # GPUs cannot both win. Runs of the same job and commit may run side by side (each its own run
    # dir); only what would collide is refused (docs/architecture.md, "Concurrent runs").
    if not lock_within(lock_fd, LOCK_WAIT_S):
        print(json.dumps({"error": "lock-busy", "lock": lock_path, "holder": _lock_holder(lock_fd),
                          "seconds": LOCK_WAIT_S}))
        return AgentExit.REFUSED
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    spec = _queue_spec(args, run_dir, gpus) if args.queue else None
    clash = _collision(run_dir, [] if spec else gpus) or (_never_fits(spec) if spec else None)
    if clash:
        print(json.dumps(clash))
        return AgentExit.REFUSED
    wait, position, taken = None, 0, gpus
    if spec is not None:  # start now when its turn is now, else leave the supervisor waiting for it
        view = [e for _, e in _queue_view(os.path.dirname(run_dir))]
        start_with = runqueue.may_start(spec, os.path.basename(run_dir), view)
        if start_with is None:
            wait, position = spec, runqueue.position(spec, os.path.basename(run_dir), view)
        else:
            taken = start_with
    os.makedirs(run_dir, mode=0o700, exist_ok=True)  # the run's files are the user's alone
    # meta and env arrive on stdin, not argv: a command line is world-readable (ps), env values are not
    payload = json.loads(sys.stdin.read() or "{}") if args.stdin else {}
    meta = payload.get("meta", json.loads(args.meta))
    # The caller puts the marker on our command line; the forked supervisor inherits that command line.
    marker = args.marker or secrets.token_hex(8)
    env = dict(os.environ)
    env.update(payload.get("env", json.loads(args.env)))
    env["THRUST_RUN_MARKER"] = marker
    _activate(env)
    env["PYTHONUNBUFFERED"] = "1"
    meta.update(run_id=os.path.basename(run_dir), argv=argv, cwd=args.cwd, marker=marker)
    if args.slurm:  # a cluster's login node: the scheduler starts the supervisor on the allocation
        answer = slurm.submit(run_dir, args.cwd, list(payload.get("sbatch") or []),
                              {**payload.get("env", {}), "THRUST_RUN_MARKER": marker}, meta)
        os.close(lock_fd)
        print(json.dumps(answer))
        return 0 if answer.get("queued") else AgentExit.REFUSED
    if wait is None:
        _starting(meta, env, spec, taken)
    read_end, write_end = os.pipe()
    first = os.fork()
    if first == 0:  # child: become a session leader, fork the supervisor, exit
        os.close(read_end)
        os.close(lock_fd)  # the lock belongs to this launch, not to the run's lifetime
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        _supervise(run_dir, args.cwd, argv, env, meta, write_end, marker, wait, position)
        os._exit(0)
    os.close(write_end)
    os.waitpid(first, 0)
    report = b""
    while chunk := os.read(read_end, 65536):
        report += chunk
    os.close(lock_fd)
    sys.stdout.write(report.decode() + "\n")
    return 0 if b'"pid"' in report or b'"queued"' in report else 1


def _withdrawn(run_dir: str) -> bool:
    """A run dir whose launch was given up before it started (`launch-outcome`) and never launched since."""
    return os.path.exists(os.path.join(run_dir, WITHDRAWN)) and not os.path.exists(os.path.join(run_dir, RUN_JSON))


def cmd_launch_outcome(args: argparse.Namespace) -> int:
    """Whether the launch into --run-dir happened; when it did not, it never will (`withdrawn`). Under the
    launch lock: a launch under way finishes (its run.json written) or has not begun."""
    run_dir = os.path.abspath(args.run_dir)
    os.makedirs(os.path.dirname(args.lock), mode=0o700, exist_ok=True)
    lock_fd = os.open(args.lock, os.O_RDWR | os.O_CREAT, 0o600)
    if not lock_within(lock_fd, LOCK_WAIT_S):  # the stalled launch itself may hold it: say who, never hang
        print(json.dumps({"launched": None, "error": "lock-busy", "lock": args.lock,
                          "holder": _lock_holder(lock_fd), "seconds": LOCK_WAIT_S}))
        os.close(lock_fd)
        return 0
    try:
        if not os.path.exists(os.path.join(run_dir, RUN_JSON)):
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
            _write_atomic(os.path.join(run_dir, WITHDRAWN), json.dumps({"withdrawn_at": utc_now()}))
            print(json.dumps({"launched": False, "run_dir": run_dir}))
            return 0
    finally:
        os.close(lock_fd)
    meta = read_json(os.path.join(run_dir, RUN_JSON)) or {}
    st = run_state(run_dir, meta)
    answer = {"launched": True, "run_dir": run_dir, "marker": meta.get("marker"), "state": st["state"]}
    if st["state"] == RunState.QUEUED:
        answer.update(queued=True, position=_placed(st, _queue_view(os.path.dirname(run_dir))).get("position", 0))
    elif meta.get("pid") is not None:
        answer["pid"] = meta["pid"]
    print(json.dumps(answer))
    return 0


def _queue_spec(args: argparse.Namespace, run_dir: str, gpus: list[int]) -> dict:
    """run.json's `queue`: what the run waits for and its place in the order (runqueue.py)."""
    pool = [int(g) for g in args.gpu_pool.split(",") if g.strip()] if args.gpu_pool else []
    return {"order": [float(args.order) if args.order else time.time(), os.path.basename(run_dir)],
            "gpus": gpus, "count": int(args.gpu_count or 0), "pool": pool, "cpu_slots": int(args.cpu_slots),
            "queued_at": utc_now(), "lock": os.path.abspath(args.lock)}


def _never_fits(spec: dict) -> dict | None:
    why = runqueue.never_fits(spec)
    return {"error": "never-fits", "why": why} if why else None


def _starting(meta: dict, env: dict, spec: dict | None, gpus: list[int]) -> None:
    """What a run records as it starts; a queued `--gpus N` learns its GPUs only now."""
    if spec is not None and spec.get("count"):
        env["CUDA_VISIBLE_DEVICES"] = env["GPU_LIST"] = ",".join(str(g) for g in gpus)
        meta.update(gpus=list(gpus), **{GPUS_USED: list(gpus)})
    meta.update(started_at=utc_now(), started_ts=time.time())  # sub-second, for overlap checks and benchmarks


def _lock(path: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


LOCK_WAIT_S = 45.0  # a launch holds the lock for well under a second; within the laptop's 60 s request


def _lock_holder(fd: int) -> str | None:
    """Who holds the lock on `fd`'s file, from /proc/locks (`PID (COMMAND)`), where the kernel says."""
    st = os.fstat(fd)
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        with open("/proc/locks") as fh:
            rows = [line.split() for line in fh]
    except OSError:
        return None
    for row in rows:
        if len(row) >= 6 and row[1] == "FLOCK" and row[5] == want and row[4].isdigit():
            name = _proc_name(int(row[4]))
            return f"{row[4]} ({name})" if name else row[4]
    return None


def _proc_name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return None


def _wait_turn(run_dir: str, spec: dict) -> tuple[int, list[int]] | None:
    """Wait until the queue lets this run start: (the launch lock's fd, held until the run is recorded
    RUNNING, and the GPUs to take), or None once it was stopped while waiting. Looked at without the
    lock first: a waiter takes it only when its turn seems to have come."""
    runs_dir, run_id = os.path.dirname(run_dir), os.path.basename(run_dir)
    ended: set[str] = set()
    while True:
        if _ended_waiting(run_dir):
            return None
        if runqueue.may_start(spec, run_id, [e for _, e in _queue_view(runs_dir, ended)]) is not None:
            fd = _lock(spec["lock"])
            gpus = None if _ended_waiting(run_dir) else runqueue.may_start(
                spec, run_id, [e for _, e in _queue_view(runs_dir, ended)])
            if gpus is not None:
                return fd, gpus
            os.close(fd)
            if _ended_waiting(run_dir):
                return None
        time.sleep(runqueue.POLL_S)


def _ended_waiting(run_dir: str) -> bool:
    """A queued run was stopped (`stop`), or failed for another node (`stop --peer-failed`)."""
    return any(os.path.exists(os.path.join(run_dir, name)) for name in (STOPPED, PEER_FAILED))


def _activate(env: dict) -> None:
    """The job's venv first on PATH, as its `bin/activate` would do: a command job's `python`, `pip`
    or `torchrun` is then the venv's, with the requirements it was given (docs/architecture.md,
    "The job's venv"). PATH is the host's own here, which the laptop cannot know."""
    python = env.get("THRUST_PYTHON") or ""
    venv = os.path.dirname(os.path.dirname(python))
    if python and os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", os.defpath)


def _supervise(run_dir: str, cwd: str, argv: list[str], env: dict, meta: dict, report_fd: int, marker: str,
               wait: dict | None = None, position: int = 0) -> None:
    """Start the job (after its turn in the queue when `wait` is its queue spec), record it, watch it,
    record its end."""
    # Every stream away from the SSH channel, or the session would wait for us.
    devnull = os.open(os.devnull, os.O_RDWR)
    log_fd = os.open(os.path.join(run_dir, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    lock_fd = None
    meta.update(supervisor_pid=os.getpid(), supervisor_start=_proc_start_time(os.getpid()))
    if wait is not None:
        _write_atomic(os.path.join(run_dir, RUN_JSON), json.dumps({**meta, QUEUE: wait}, indent=1))
        os.write(report_fd, json.dumps({"queued": True, "position": position, "run_dir": run_dir,
                                        "marker": marker}).encode())
        os.close(report_fd)
        report_fd = -1
        turn = _wait_turn(run_dir, wait)
        if turn is None:
            _write_atomic(os.path.join(run_dir, EXIT_CODE), never_started_end())
            return
        lock_fd, gpus = turn
        meta[QUEUE] = wait  # kept: when it was queued, what it waited for
        _starting(meta, env, wait, gpus)
    _reserve_end(run_dir)
    proc = _start(run_dir, cwd, argv, env, devnull, log_fd, report_fd)
    if lock_fd is not None and proc is None:
        os.close(lock_fd)
    if proc is None:
        return
    meta.update(pid=proc.pid, pid_start=_proc_start_time(proc.pid))
    _write_atomic(os.path.join(run_dir, RUN_JSON), json.dumps(meta, indent=1))
    if lock_fd is not None:
        os.close(lock_fd)  # recorded RUNNING with its GPUs: the next waiter sees them taken
    if report_fd >= 0:
        os.write(report_fd, json.dumps({"pid": proc.pid, "run_dir": run_dir, "marker": marker}).encode())
        os.close(report_fd)
    _watch(run_dir, meta, proc)


def _start(run_dir: str, cwd: str, argv: list[str], env: dict, devnull: int, log_fd: int,
           report_fd: int) -> subprocess.Popen | None:
    try:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=devnull, stdout=log_fd, stderr=log_fd, start_new_session=True
        )
    except OSError as exc:
        os.write(log_fd, f"thrust: cannot start {argv[0]}: {exc}\n".encode())
        _write_atomic(os.path.join(run_dir, EXIT_CODE), json.dumps({"exit_code": 127, "ended_at": utc_now()}))
        if report_fd >= 0:
            os.write(report_fd, json.dumps({"error": str(exc)}).encode())
            os.close(report_fd)
        return None


def _watch(run_dir: str, meta: dict, proc: subprocess.Popen,
           before_end: Callable[[], None] | None = None) -> None:
    # The supervisor ignores the signals meant for the job's group; `stop` signals that group only.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done = threading.Event()
    if meta.get("watch_peers"):  # a node of a run over several hosts (peerwatch.py)
        peerwatch.watch(run_dir, meta["watch_peers"], float(meta.get("peer_timeout") or 15), done,
                        lambda: _kill_group(proc.pid, 5.0))
    if meta.get("idle_stop"):  # the job's idle-GPU stop (idlewatch.py)

        def idle(detail: str) -> None:
            _write_atomic(os.path.join(run_dir, STOPPED), idlewatch.stopped_note(idlewatch.IDLE, detail, utc_now()))
            _kill_group(proc.pid, 10.0)

        idlewatch.watch(meta["idle_stop"], meta.get(GPUS_USED) or [], done, idle)
    code = proc.wait()
    done.set()
    if code < 0:
        code = 128 - code
    if before_end is not None:
        before_end()
    _record_end(run_dir, json.dumps({"exit_code": code, "ended_at": utc_now(), "ended_ts": time.time()}))


def _reserve_end(run_dir: str) -> None:
    """END_RESERVE: blocks of the run's own for its end, taken while the disk has room."""
    with contextlib.suppress(OSError):
        _write_atomic(os.path.join(run_dir, END_RESERVE), " " * END_RESERVE_BYTES)


def _record_end(run_dir: str, text: str) -> None:
    """`exit_code`, whole; when the disk is full (the job may have filled it), written over END_RESERVE's
    bytes in place and renamed: a rename and an overwrite take no new block."""
    reserve = os.path.join(run_dir, END_RESERVE)
    try:
        _write_atomic(os.path.join(run_dir, EXIT_CODE), text)
    except OSError:
        if len(text) > END_RESERVE_BYTES or not os.path.exists(reserve):
            raise
        with open(reserve, "r+b") as fh:
            fh.write(text.encode().ljust(END_RESERVE_BYTES))  # trailing spaces: json.loads reads past them
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(reserve, os.path.join(run_dir, EXIT_CODE))
        return
    with contextlib.suppress(OSError):
        os.unlink(reserve)


def cmd_status(args: argparse.Namespace) -> int:
    meta = read_json(os.path.join(args.run_dir, RUN_JSON)) or {}
    st = run_state(args.run_dir, meta)
    if st["state"] == RunState.QUEUED:
        st = _placed(st, _queue_view(os.path.dirname(os.path.abspath(args.run_dir))))
    parts = slurm.node_states(args.run_dir, meta, st) if meta.get(SCHEDULER) else None
    if parts:  # a Slurm run over several nodes: not `nodes` (hosts the laptop would open), its own key
        st = {**st, "slurm_nodes": parts}
    print(json.dumps(_with_tree(args.run_dir, meta, st)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    view = _queue_view(args.runs_dir)
    out = [_placed(st, view) for st, _ in view]
    if args.trees:  # `runs`: each run's tree and its size (a running run's is counted each time)
        out = [_with_tree(os.path.join(args.runs_dir, st["run_id"]), None, st) for st in out]
    out.sort(key=lambda r: r.get("started_at") or r.get("queued_at") or "")
    print(json.dumps(out))
    return 0


def _with_tree(run_dir: str, meta: dict | None, st: dict) -> dict:
    """The status object with the run's tree: its path, whether it is kept, its size (agent/trees.py)."""
    from .trees import tree_info

    if meta is None:
        meta = read_json(os.path.join(run_dir, RUN_JSON)) or {}
    return {**st, **tree_info(run_dir, meta, RunState(st["state"]).is_terminal)}


def cmd_stop(args: argparse.Namespace) -> int:
    meta = read_json(os.path.join(args.run_dir, RUN_JSON)) or {}
    state = run_state(args.run_dir)
    if meta.get(SCHEDULER):
        return _stop_scheduled(args, meta, state["state"])
    if state["state"] == RunState.QUEUED and _stop_queued(args, meta):
        return 0
    meta = read_json(os.path.join(args.run_dir, RUN_JSON)) or {}  # a queued run may have started meanwhile
    state = run_state(args.run_dir, meta)
    if state["state"] != RunState.RUNNING:
        print(json.dumps({"stopped": False, "state": state["state"]}))
        return 0
    if args.peer_failed:  # another node failed: this one ends FAILED for it, not STOPPED by the user
        peerwatch.record(args.run_dir, json.loads(args.peer_failed))
    else:
        with open(os.path.join(args.run_dir, STOPPED), "w") as fh:
            fh.write(utc_now())
    killed = _kill_group(meta["pid"], args.grace)  # the job leads its own process group (start_new_session)
    # wait for the supervisor to record the end (it is not in the job's group)
    for _ in range(100):
        if os.path.exists(os.path.join(args.run_dir, EXIT_CODE)):
            break
        if not _supervisor_alive(meta, args.run_dir):
            _write_atomic(
                os.path.join(args.run_dir, EXIT_CODE),
                json.dumps({"exit_code": 128 + (9 if killed else 15), "ended_at": utc_now(), "ended_ts": time.time()}),
            )
            break
        time.sleep(0.05)
    print(json.dumps({"stopped": True, "killed": killed, "state": run_state(args.run_dir)["state"]}))
    return 0


def _stop_scheduled(args: argparse.Namespace, meta: dict, state: RunState) -> int:
    """`stop` of a cluster's run: scancel (a pending job too); a running job's end is its supervisor's
    to record (it passes the scheduler's TERM to the job), waited for up to the grace."""
    if not state.is_live:
        print(json.dumps({"stopped": False, "state": state}))
        return 0
    answer = slurm.cancel(args.run_dir, meta)
    deadline = time.monotonic() + args.grace + 5
    while answer.get("stopped") and time.monotonic() < deadline:
        if os.path.exists(os.path.join(args.run_dir, EXIT_CODE)):
            break
        time.sleep(0.1)
    print(json.dumps({**answer, "state": run_state(args.run_dir)["state"]}))
    return 0 if answer.get("stopped") else 1


def cmd_supervise(args: argparse.Namespace) -> int:
    """The batch script's one command, on a cluster's allocation: start the job as `launch` would, watch
    it, record its end, and exit with its code (so the scheduler's COMPLETED / FAILED agree with it)."""
    run_dir = os.path.abspath(args.run_dir)
    try:
        return _supervise_job(run_dir)
    finally:
        if int(os.environ.get("SLURM_NODEID") or 0) == 0:  # node 0's job ends last: the env's secrets go
            slurm.forget_env(run_dir)  # however it ended (its job's end, a job that could not start...)


def _supervise_job(run_dir: str) -> int:
    meta = read_json(os.path.join(run_dir, RUN_JSON)) or {}
    # stopped, or given up (the cluster cannot start it), as it was starting: nothing runs
    if any(os.path.exists(os.path.join(run_dir, name)) for name in (STOPPED, slurm.CANNOT_START)):
        if not os.path.exists(os.path.join(run_dir, EXIT_CODE)):
            _write_atomic(os.path.join(run_dir, EXIT_CODE), never_started_end())
        return 0
    own_env = slurm.job_env(run_dir)  # kept: a status that sees the run ended removes the file meanwhile
    env = dict(os.environ)  # the allocation's own (SLURM_*), then the run's
    env.update(own_env)
    _activate(env)
    env["PYTHONUNBUFFERED"] = "1"
    _starting(meta, env, None, [])
    # over several nodes: this node's own directory (node 0: the run dir) and torchrun's rendezvous
    here, argv = slurm.place_node(run_dir, meta, env, list(meta.get("argv") or []))
    devnull = os.open(os.devnull, os.O_RDWR)
    log_fd = os.open(os.path.join(here, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    meta.update(supervisor_pid=os.getpid(), supervisor_start=_proc_start_time(os.getpid()), argv=argv)
    _reserve_end(here)
    # Over several nodes Slurm's warning reaches every process of srun's step, the job's too, whose
    # default for USR1 is to die (exit 138): the job starts with it ignored (SIG_IGN outlives exec), so
    # the warning is the supervisor's to turn into the job's TERM. A job with a USR1 handler of its own
    # still gets it. The supervisor's own handler is set just below.
    signal.signal(slurm.LIMIT_SIGNAL, signal.SIG_IGN)
    proc = _start(here, meta.get("cwd") or run_dir, argv, env, devnull, log_fd, -1)
    if proc is None:
        return 127
    meta.update(pid=proc.pid, pid_start=_proc_start_time(proc.pid))
    if here == run_dir:  # the login node may be writing the job id meanwhile: merged, never overwritten
        started = ("started_at", "started_ts", "supervisor_pid", "supervisor_start", "argv", "pid", "pid_start",
                   "slurm_node", "slurm_node_name")
        meta = slurm.update_meta(run_dir, {k: meta[k] for k in started if k in meta},
                                 job_id=os.environ.get("SLURM_JOB_ID"))
    else:
        _write_atomic(os.path.join(here, RUN_JSON), json.dumps(meta, indent=1))
    # The scheduler's TERM (scancel, the time limit, a preemption) goes to the job's group; the supervisor
    # lives on to record the end (Slurm's KILL follows after its KillWait).
    termed: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: (termed.append(True), _signal_group(proc.pid, signal.SIGTERM)))
    # sbatch --signal=B:USR1@S: the time limit is S seconds away. The job gets a TERM now, while there is
    # time to write a checkpoint, and the run's end reads as a timeout (resumable: retry on: [timeout]).
    signal.signal(slurm.LIMIT_SIGNAL, lambda *_: (slurm.near_limit(run_dir), _signal_group(proc.pid, signal.SIGTERM)))
    _watch(here, meta, proc, (lambda: _continue(run_dir, meta, own_env, bool(termed))) if here == run_dir else None)
    end, _, _, _ = _end(_read_text(os.path.join(here, EXIT_CODE)))
    return min(int(end or 0), 255)


def _continue(run_dir: str, meta: dict, env: dict, termed: bool) -> None:
    """A run at its time limit, or preempted, submits its next attempt (slurm.continue_itself);
    whatever goes wrong there is said in run.json and the run's end is still recorded (an end never goes
    unwritten). Whether a TERM was a preemption is asked only of a run that would continue on one."""
    try:
        if termed and "preempted" in ((meta.get(SELF_RETRY) or {}).get("on") or ()):
            slurm.note_preempted(run_dir)
        slurm.continue_itself(run_dir, meta, env)
    except Exception as exc:  # noqa: BLE001 - the end must be written whatever failed
        with contextlib.suppress(OSError):
            slurm.update_meta(run_dir, {slurm.CONTINUE_ERROR: f"{type(exc).__name__}: {exc}"})


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)


def _read_text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def _stop_queued(args: argparse.Namespace, meta: dict) -> bool:
    """Stop a run while it waits in the queue: its end written under the launch lock, so it cannot start
    meanwhile. False when it started before we held the lock (then it is stopped as a running run)."""
    fd = _lock(meta[QUEUE]["lock"])
    try:
        if run_state(args.run_dir)["state"] != RunState.QUEUED:
            return False
        if args.peer_failed:
            peerwatch.record(args.run_dir, json.loads(args.peer_failed))
        else:
            _write_atomic(os.path.join(args.run_dir, STOPPED), utc_now())
    finally:
        os.close(fd)
    for _ in range(100):  # its supervisor sees the file within runqueue.POLL_S and records the end
        if os.path.exists(os.path.join(args.run_dir, EXIT_CODE)):
            break
        if not _supervisor_alive(meta, args.run_dir):
            _write_atomic(os.path.join(args.run_dir, EXIT_CODE), never_started_end())
            break
        time.sleep(0.05)
    print(json.dumps({"stopped": True, "killed": False, "state": run_state(args.run_dir)["state"]}))
    return True


def _kill_group(pgid: int, grace: float) -> bool:
    """TERM the group, KILL it after `grace` seconds; True when it had to be killed. The KILL also
    reaches the job's descendants in other process groups: torchrun starts each worker in a session of
    its own, and a worker that outlived its killed launcher would hold its GPU and its peers' collectives."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return False
        time.sleep(0.1)
    tree = _descendants(pgid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return True


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, fields in _procs():
        children.setdefault(int(fields[1]), []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _procs() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name: state, ppid, pgrp...) of each process."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        yield int(entry), stat[stat.rindex(")") + 2 :].split()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # zombies still count for killpg; look for a live member
    return any(fields[0] != "Z" and int(fields[2]) == pgid for _, fields in _procs())


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    job_argv: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, job_argv = argv[:i], argv[i + 1 :]
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("launch")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--cwd", required=True)
    p.add_argument("--lock", required=True, help="the host's launch lock file (flock)")
    p.add_argument("--gpus", default="", help="GPU indices this run claims: refused if a RUNNING run holds one")
    p.add_argument("--meta", default="{}")
    p.add_argument("--env", default="{}")
    p.add_argument("--marker", default="")
    p.add_argument("--stdin", action="store_true", help="read {meta, env} as JSON from stdin")
    p.add_argument("--queue", action="store_true", help="wait for the GPUs (or a CPU slot) instead of refusing")
    p.add_argument("--order", default="", help="the queue's order: the submit time (the same on every node)")
    p.add_argument("--gpu-count", type=int, default=0, help="--queue: take this many GPUs of --gpu-pool")
    p.add_argument("--gpu-pool", default="", help="--queue: the host's GPUs --gpu-count chooses among")
    p.add_argument("--cpu-slots", type=int, default=1, help="--queue without GPUs: RUNNING runs at once")
    p.add_argument("--slurm", action="store_true", help="sbatch the supervisor (stdin's `sbatch`: its options)")
    p = sub.add_parser("supervise")
    p.add_argument("--run-dir", required=True)
    p = sub.add_parser("launch-outcome")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--lock", required=True, help="the host's launch lock file (flock)")
    p = sub.add_parser("status")
    p.add_argument("--run-dir", required=True)
    p = sub.add_parser("list")
    p.add_argument("--runs-dir", required=True)
    p.add_argument("--trees", action="store_true", help="each run's tree and its size too")
    p = sub.add_parser("stop")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--grace", type=float, default=10.0)
    p.add_argument("--peer-failed", default="", help="JSON {node, host, why}: stopped because that node failed")
    args = parser.parse_args(argv)
    if args.cmd == "launch":
        if not job_argv:
            parser.error("launch needs the job's argv after --")
        return cmd_launch(args, job_argv)
    return {"status": cmd_status, "list": cmd_list, "stop": cmd_stop,
            "launch-outcome": cmd_launch_outcome, "supervise": cmd_supervise}[args.cmd](args)

