"""`agent launch`: a run started on this host, now or when its turn in the host's queue comes, or
submitted to a cluster's scheduler (docs/architecture.md, "The run directory on the host").

    agent launch --run-dir D --cwd W --lock L [--gpus LIST] [--marker M] [--stdin] [--meta JSON --env JSON]
                 [--queue --order TS [--gpu-count N --gpu-pool LIST] [--cpu-slots N]] [--KIND] -- ARGV...

`launch` double-forks: the supervisor becomes a session leader with every stream redirected (so the
SSH channel closes at once and the run survives the link), starts the job (job.py), waits for it, and
writes `exit_code` atomically. `launch` prints one JSON line and returns at once. Under the launch lock
it refuses what would collide: the same run dir still live, a GPU a RUNNING run holds, a withdrawn
launch. With `--queue` a launch that cannot start now leaves its supervisor waiting its turn
(runqueue.py): the run is QUEUED until then. With `--KIND` (a cluster's login node: a kind of
scheduled.py's) the supervisor is that scheduler's to start on the allocation instead, and the kind's
module submits it (scheduled.py). run.json is written whole from a protocol.run_record.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time

from . import job, runqueue, scheduled
from .files import lock_within, locked
from .procs import lock_holder
from .procs import start_time as proc_start_time
from .protocol import (
    EXIT_CODE,
    LOG,
    PEER_FAILED,
    RUN_JSON,
    STOPPED,
    AgentExit,
    RunRecord,
    RunState,
    never_started_end,
    run_record,
    utc_now,
)
from .runjson import read_record, write_record
from .supervisor import LOCK_WAIT_S, queue_view, run_state, withdrawn


def _collision(run_dir: str, gpus: list[int]) -> dict | None:
    """What a launch into run_dir claiming `gpus` would collide with: the same run dir still
    RUNNING, or a RUNNING run of the same runs directory holding one of those GPUs (its run.json
    `gpus`). None when nothing does. Called under the launch lock."""
    if os.path.exists(os.path.join(run_dir, RUN_JSON)) and run_state(run_dir)["state"].is_live:
        return {"error": "exists", "run_id": os.path.basename(run_dir)}
    if withdrawn(run_dir):  # the laptop gave this launch up and was told it never started: it never will
        return {"error": "withdrawn", "run_id": os.path.basename(run_dir)}
    if not gpus:
        return None
    runs_dir = os.path.dirname(run_dir)
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
        other = os.path.join(runs_dir, name)
        held = read_record(other).get("gpus") or []
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
        print(json.dumps({"error": "lock-busy", "lock": lock_path, "holder": lock_holder(lock_fd),
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
        view = [e for _, e in queue_view(os.path.dirname(run_dir))]
        start_with = runqueue.may_start(spec, os.path.basename(run_dir), view)
        if start_with is None:
            wait, position = spec, runqueue.position(spec, os.path.basename(run_dir), view)
        else:
            taken = start_with
    os.makedirs(run_dir, mode=0o700, exist_ok=True)  # the run's files are the user's alone
    # meta and env arrive on stdin, not argv: a command line is world-readable (ps), env values are not
    payload = json.loads(sys.stdin.read() or "{}") if args.stdin else {}
    laptop: dict = payload.get("meta", json.loads(args.meta))
    # The caller puts the marker on our command line; the forked supervisor inherits that command line.
    marker = args.marker or secrets.token_hex(8)
    env = dict(os.environ)
    env.update(payload.get("env", json.loads(args.env)))
    env["THRUST_RUN_MARKER"] = marker
    job.activate(env)
    env["PYTHONUNBUFFERED"] = "1"
    meta = run_record(laptop, run_id=os.path.basename(run_dir), argv=argv, cwd=args.cwd, marker=marker)
    kind = scheduled.launch_kind(vars(args))
    if kind:  # a cluster's login node: the scheduler starts the supervisor on the allocation
        answer = scheduled.scheduler(kind).launch(run_dir, args.cwd, payload,
                                                  {**payload.get("env", {}), "THRUST_RUN_MARKER": marker}, meta)
        os.close(lock_fd)
        print(json.dumps(answer))
        return 0 if answer.get("queued") else AgentExit.REFUSED
    if wait is None:
        job.starting(meta, env, spec, taken)
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


def _queue_spec(args: argparse.Namespace, run_dir: str, gpus: list[int]) -> dict:
    """run.json's `queue`: what the run waits for and its place in the order (runqueue.py)."""
    pool = [int(g) for g in args.gpu_pool.split(",") if g.strip()] if args.gpu_pool else []
    return {"order": [float(args.order) if args.order else time.time(), os.path.basename(run_dir)],
            "gpus": gpus, "count": int(args.gpu_count or 0), "pool": pool, "cpu_slots": int(args.cpu_slots),
            "queued_at": utc_now(), "lock": os.path.abspath(args.lock)}


def _never_fits(spec: dict) -> dict | None:
    why = runqueue.never_fits(spec)
    return {"error": "never-fits", "why": why} if why else None


def _wait_turn(run_dir: str, spec: dict) -> tuple[int, list[int]] | None:
    """Wait until the queue lets this run start: (the launch lock's fd, held until the run is recorded
    RUNNING, and the GPUs to take), or None once it was stopped while waiting. Looked at without the
    lock first: a waiter takes it only when its turn seems to have come."""
    runs_dir, run_id = os.path.dirname(run_dir), os.path.basename(run_dir)
    ended: set[str] = set()
    while True:
        if _ended_waiting(run_dir):
            return None
        if runqueue.may_start(spec, run_id, [e for _, e in queue_view(runs_dir, ended)]) is not None:
            fd = locked(spec["lock"])
            gpus = None if _ended_waiting(run_dir) else runqueue.may_start(
                spec, run_id, [e for _, e in queue_view(runs_dir, ended)])
            if gpus is not None:
                return fd, gpus
            os.close(fd)
            if _ended_waiting(run_dir):
                return None
        time.sleep(runqueue.POLL_S)


def _ended_waiting(run_dir: str) -> bool:
    """A queued run was stopped (`stop`), or failed for another node (`stop --peer-failed`)."""
    return any(os.path.exists(os.path.join(run_dir, name)) for name in (STOPPED, PEER_FAILED))


def _supervise(run_dir: str, cwd: str, argv: list[str], env: dict, meta: RunRecord, report_fd: int, marker: str,
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
    meta = run_record(meta, supervisor_pid=os.getpid(), supervisor_start=proc_start_time(os.getpid()))
    if wait is not None:
        write_record(run_dir, run_record(meta, queue=wait))
        os.write(report_fd, json.dumps({"queued": True, "position": position, "run_dir": run_dir,
                                        "marker": marker}).encode())
        os.close(report_fd)
        report_fd = -1
        turn = _wait_turn(run_dir, wait)
        if turn is None:
            job.write_text(os.path.join(run_dir, EXIT_CODE), never_started_end())
            return
        lock_fd, gpus = turn
        meta = run_record(meta, queue=wait)  # kept: when it was queued, what it waited for
        job.starting(meta, env, wait, gpus)
    job.reserve_end(run_dir)
    proc = job.start(run_dir, cwd, argv, env, devnull, log_fd, report_fd)
    if lock_fd is not None and proc is None:
        os.close(lock_fd)
    if proc is None:
        return
    meta = run_record(meta, pid=proc.pid, pid_start=proc_start_time(proc.pid))
    write_record(run_dir, meta)
    if lock_fd is not None:
        os.close(lock_fd)  # recorded RUNNING with its GPUs: the next waiter sees them taken
    if report_fd >= 0:
        os.write(report_fd, json.dumps({"pid": proc.pid, "run_dir": run_dir, "marker": marker}).encode())
        os.close(report_fd)
    job.watch(run_dir, meta, proc)


def main(argv: list[str]) -> int:
    argv = list(argv)
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
    for kind in scheduled.KINDS:  # --KIND: submitted to that scheduler, its options on stdin under its own key
        p.add_argument(f"--{kind}", action="store_true", help=f"submit the supervisor to the cluster's {kind}")
    args = parser.parse_args(argv)
    if not job_argv:
        parser.error("launch needs the job's argv after --")
    return cmd_launch(args, job_argv)
