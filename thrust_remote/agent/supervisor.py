"""A run directory's state: what its supervisor recorded there, and whether that supervisor (or its job)
is still alive (docs/architecture.md, "The run directory on the host"); a queued run's place in the
host's queue; and a launch's outcome.

    agent launch-outcome --run-dir D --lock L

A run is RUNNING only when its supervisor's recorded pid is alive *and* its start time matches *and* it
holds the run's log as its stdout (or has the marker on its command line), or the job's pid and start
time match and the run's marker is in its environment (a recycled pid is not our run); otherwise FINISHED/FAILED/STOPPED
from `exit_code`, or LOST when nothing recorded an end. A cluster's run is what its run directory says
with the scheduler's word on it (its kind's module, looked up by scheduled.py). run.json is read through
runjson.py as a RunRecord, capped: one larger than RUN_JSON_MAX reads as nothing, and the status says so
(`oversize`).

`launch-outcome` settles a launch whose answer never came (its `agent serve` stopped answering): under
the launch lock, a run dir with a run.json was launched (its status is the answer); one without gets
`withdrawn`, so the launch, should it arrive late, is refused and never runs unrecorded.

Whoever starts, stops or lists runs (launcher.py, a scheduler's step, runs.py, trees.py, logs.py,
poll.py) reads their state here; this module imports none of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time

from . import runqueue, scheduled
from .checkout import free_bytes
from .files import lock_within, unreadable, write_atomic

# under the names the liveness checks below have always used (tests reach two of them here)
from .procs import cmdline as _proc_cmdline
from .procs import environ_has as _proc_environ_has
from .procs import lock_holder as _lock_holder
from .procs import start_time as _proc_start_time
from .protocol import (
    CONTINUE_ERROR,
    CONTINUED_BY,
    EXIT_CODE,
    GPUS_USED,
    LOG,
    PEER_FAILED,
    QUEUE,
    RESUMED_FROM,
    RUN_JSON,
    SCHEDULER,
    STOPPED,
    USER_STOP,
    WITHDRAWN,
    RunRecord,
    RunState,
    utc_now,
)
from .runjson import oversize, read_json, read_record

LOCK_WAIT_S = 45.0  # a launch holds the lock for well under a second; within the laptop's 60 s request


def _supervisor_alive(meta: RunRecord, run_dir: str) -> bool:
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


def exit_text(run_dir: str) -> str | None:
    with contextlib.suppress(OSError), open(os.path.join(run_dir, EXIT_CODE)) as fh:
        return fh.read().strip()
    return None


def run_state(run_dir: str, meta: RunRecord | None = None, *, read_again: bool = True) -> dict:
    """The status object of one run directory (docs/architecture.md, "JSON shapes"); `meta`: its
    run.json when the caller has read it already."""
    big = not meta and oversize(os.path.join(run_dir, RUN_JSON))  # a capped read gives None: {} to callers
    meta = meta or read_record(run_dir)
    recorded = exit_text(run_dir)
    stopped = os.path.exists(os.path.join(run_dir, STOPPED))
    marker = meta.get("marker")
    exit_code, ended_at, ended_ts, never_started = parse_end(recorded)
    by = scheduled.of(meta)
    sched = by.view(run_dir, meta, exit_code=exit_code, ended=exit_code is not None or never_started,
                    stopped=stopped) if by else None
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
            and exit_text(run_dir) != recorded:
        # the supervisor writes the exit code, then exits: one that ended between the read above and
        # the look at its process left its code meanwhile (a finished node of a run over two hosts was
        # read as LOST, and the run FAILED, while its peer finished)
        return run_state(run_dir, meta, read_again=False)
    reason = _stop_reason(run_dir) if state == RunState.STOPPED else None
    if sched is not None and sched.get("reason") and not (reason and reason[0] != USER_STOP):
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
        **({"oversize": os.path.join(run_dir, RUN_JSON)} if big else {}),
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
        # a cluster's run that resubmitted itself (its time limit, a preemption), or why not
        **({CONTINUED_BY: meta[CONTINUED_BY]} if isinstance(meta.get(CONTINUED_BY), list) else {}),
        **({CONTINUE_ERROR: meta[CONTINUE_ERROR]} if meta.get(CONTINUE_ERROR) else {}),
        **_hours(run_dir, meta, state, ended_ts),
        **({"node": meta["node"], "nodes": [n.get("host") for n in meta.get("nodes") or []],
            "peer_failed": read_json(os.path.join(run_dir, PEER_FAILED))} if "node" in meta else {}),
    }


def parse_end(text: str | None) -> tuple[int | None, str | None, float | None, bool]:
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


def queue_view(runs_dir: str, ended: set[str] | None = None) -> list[tuple[dict, runqueue.Entry]]:
    """Each run dir's status object and what the queue needs of it. `ended`: run dirs known to have
    ended, skipped and added to (a waiter looks every POLL_S s: an ended run holds and wants nothing,
    and reading hundreds of them each time costed a waiter ~6% of a core)."""
    out = []
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
        path = os.path.join(runs_dir, name)
        if ended is not None and name in ended:
            continue
        if os.path.isdir(path) and not withdrawn(path):
            meta = read_record(path)
            st = run_state(path, meta)
            if ended is not None and st["ended_at"] is not None:  # a recorded end: final (a dir
                ended.add(name)  # without run.json yet reads LOST but may be a launch under way)
            spec = meta.get(QUEUE) if isinstance(meta.get(QUEUE), dict) else None
            out.append((st, runqueue.Entry(st["run_id"], st["state"], st["gpus"], spec)))
    return out


def placed(st: dict, view: list[tuple[dict, runqueue.Entry]]) -> dict:
    """A QUEUED run's status object with its place in the queue (the host's: a run waiting in a cluster's
    scheduler has that scheduler's reason instead)."""
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
        return (USER_STOP, "")
    return (str(note.get("reason") or USER_STOP), str(note.get("detail") or "")) if isinstance(note, dict) else None


def _hours(run_dir: str, meta: RunRecord, state: str, ended_ts: float | None) -> dict:
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


def withdrawn(run_dir: str) -> bool:
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
            write_atomic(os.path.join(run_dir, WITHDRAWN), json.dumps({"withdrawn_at": utc_now()}).encode())
            print(json.dumps({"launched": False, "run_dir": run_dir}))
            return 0
    finally:
        os.close(lock_fd)
    meta = read_record(run_dir)
    st = run_state(run_dir, meta)
    answer = {"launched": True, "run_dir": run_dir, "marker": meta.get("marker"), "state": st["state"]}
    if st["state"] == RunState.QUEUED:
        answer.update(queued=True, position=placed(st, queue_view(os.path.dirname(run_dir))).get("position", 0))
    elif meta.get("pid") is not None:
        answer["pid"] = meta["pid"]
    print(json.dumps(answer))
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("launch-outcome")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--lock", required=True, help="the host's launch lock file (flock)")
    return cmd_launch_outcome(parser.parse_args(argv))
