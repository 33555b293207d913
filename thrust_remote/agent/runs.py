"""What the laptop asks of runs already launched: `status` of one, `list` of a runs directory, `stop`.

    agent status --run-dir D
    agent list --runs-dir R [--trees]
    agent stop --run-dir D [--grace S] [--peer-failed JSON]

A status object is supervisor.run_state's (docs/architecture.md, "JSON shapes"), with a queued run's
place, what a cluster's run's scheduler module adds (its nodes) and the run's tree (treesize.py).
`stop` TERMs the job's process group, KILLs it after the grace, and leaves the supervisor to record the
end; a queued run's end is written under the launch lock, a cluster's run is cancelled in its scheduler
(scheduled.py: its kind's `cancel`). A node of a run over several hosts stopped `--peer-failed` ends
FAILED for the node named, not STOPPED.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from . import peerwatch, scheduled
from .files import locked, write_atomic
from .procs import kill_group
from .protocol import EXIT_CODE, QUEUE, STOPPED, RunRecord, RunState, never_started_end, utc_now
from .runjson import read_record
from .supervisor import _supervisor_alive, placed, queue_view, run_state
from .treesize import tree_info


def cmd_status(args: argparse.Namespace) -> int:
    meta = read_record(args.run_dir)
    st = run_state(args.run_dir, meta)
    if st["state"] == RunState.QUEUED:
        st = placed(st, queue_view(os.path.dirname(os.path.abspath(args.run_dir))))
    by = scheduled.of(meta)
    if by is not None:  # a cluster's run: what its scheduler's module adds (its nodes' parts)
        st = {**st, **by.status_fields(args.run_dir, meta, st)}
    print(json.dumps(_with_tree(args.run_dir, meta, st)))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    view = queue_view(args.runs_dir)
    out = [placed(st, view) for st, _ in view]
    if args.trees:  # `runs`: each run's tree and its size (a running run's is counted each time)
        out = [_with_tree(os.path.join(args.runs_dir, st["run_id"]), None, st) for st in out]
    out.sort(key=lambda r: r.get("started_at") or r.get("queued_at") or "")
    print(json.dumps(out))
    return 0


def _with_tree(run_dir: str, meta: RunRecord | None, st: dict) -> dict:
    """The status object with the run's tree: its path, whether it is kept, its size (treesize.py)."""
    if meta is None:
        meta = read_record(run_dir)
    return {**st, **tree_info(run_dir, meta, RunState(st["state"]).is_terminal)}


def cmd_stop(args: argparse.Namespace) -> int:
    meta = read_record(args.run_dir)
    state = run_state(args.run_dir)
    by = scheduled.of(meta)
    if by is not None:
        return _stop_scheduled(args, meta, state["state"], by)
    if state["state"] == RunState.QUEUED and _stop_queued(args, meta):
        return 0
    meta = read_record(args.run_dir)  # a queued run may have started meanwhile
    state = run_state(args.run_dir, meta)
    if state["state"] != RunState.RUNNING:
        print(json.dumps({"stopped": False, "state": state["state"]}))
        return 0
    if args.peer_failed:  # another node failed: this one ends FAILED for it, not STOPPED by the user
        peerwatch.record(args.run_dir, json.loads(args.peer_failed))
    else:
        with open(os.path.join(args.run_dir, STOPPED), "w") as fh:
            fh.write(utc_now())
    killed = kill_group(meta["pid"], args.grace)  # the job leads its own process group (start_new_session)
    # wait for the supervisor to record the end (it is not in the job's group)
    for _ in range(100):
        if os.path.exists(os.path.join(args.run_dir, EXIT_CODE)):
            break
        if not _supervisor_alive(meta, args.run_dir):
            write_text(
                os.path.join(args.run_dir, EXIT_CODE),
                json.dumps({"exit_code": 128 + (9 if killed else 15), "ended_at": utc_now(), "ended_ts": time.time()}),
            )
            break
        time.sleep(0.05)
    print(json.dumps({"stopped": True, "killed": killed, "state": run_state(args.run_dir)["state"]}))
    return 0


def _stop_scheduled(args: argparse.Namespace, meta: RunRecord, state: RunState, by: scheduled.Scheduler) -> int:
    """`stop` of a cluster's run: cancelled in its scheduler (a pending job too); a running job's end is
    its supervisor's to record (it passes the scheduler's TERM to the job), waited for up to the grace."""
    if not state.is_live:
        print(json.dumps({"stopped": False, "state": state}))
        return 0
    answer = by.cancel(args.run_dir, meta)
    deadline = time.monotonic() + args.grace + 5
    while answer.get("stopped") and time.monotonic() < deadline:
        if os.path.exists(os.path.join(args.run_dir, EXIT_CODE)):
            break
        time.sleep(0.1)
    print(json.dumps({**answer, "state": run_state(args.run_dir)["state"]}))
    return 0 if answer.get("stopped") else 1


def _stop_queued(args: argparse.Namespace, meta: RunRecord) -> bool:
    """Stop a run while it waits in the queue: its end written under the launch lock, so it cannot start
    meanwhile. False when it started before we held the lock (then it is stopped as a running run)."""
    fd = locked(meta[QUEUE]["lock"])
    try:
        if run_state(args.run_dir)["state"] != RunState.QUEUED:
            return False
        if args.peer_failed:
            peerwatch.record(args.run_dir, json.loads(args.peer_failed))
        else:
            write_text(os.path.join(args.run_dir, STOPPED), utc_now())
    finally:
        os.close(fd)
    for _ in range(100):  # its supervisor sees the file within runqueue.POLL_S and records the end
        if os.path.exists(os.path.join(args.run_dir, EXIT_CODE)):
            break
        if not _supervisor_alive(meta, args.run_dir):
            write_text(os.path.join(args.run_dir, EXIT_CODE), never_started_end())
            break
        time.sleep(0.05)
    print(json.dumps({"stopped": True, "killed": False, "state": run_state(args.run_dir)["state"]}))
    return True


def write_text(path: str, data: str) -> None:
    write_atomic(path, data.encode())


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
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
    return {"status": cmd_status, "list": cmd_list, "stop": cmd_stop}[args.cmd](args)
