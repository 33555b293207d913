"""`agent logs`: a run's log from a byte offset, and with --follow until the run has ended.

    agent logs --run-dir D --offset N [--follow]

Kept apart from supervisor.py: a follow runs for the whole of a run, and only reads.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

from .protocol import LOG, LOG_START, AgentExit
from .supervisor import run_state


def cmd_logs(args: argparse.Namespace) -> int:
    """Copy the log from a byte offset; with --follow, until the run has ended and all is sent."""
    path = os.path.join(args.run_dir, LOG)
    out = sys.stdout.buffer
    out.write(LOG_START)  # what came before it is not the log (a start-up file's words)
    out.flush()
    offset = args.offset
    deadline_idle = time.monotonic()
    # a follower whose laptop went away (its SSH session ended) is orphaned: a silent log (a queued
    # run, a quiet job) would never show it by a failed write, so the parent is watched instead
    parent = os.getppid()
    while True:
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                while chunk := fh.read(1 << 16):
                    out.write(chunk)
                    offset += len(chunk)
                out.flush()
        except FileNotFoundError:
            if not args.follow:
                return AgentExit.MISSING
        if not args.follow:
            return 0
        if not run_state(args.run_dir)["state"].is_live:
            # one last read: the job may have written its final lines after our read above
            with contextlib.suppress(FileNotFoundError), open(path, "rb") as fh:
                fh.seek(offset)
                out.write(fh.read())
                out.flush()
            return 0
        time.sleep(0.2)
        if time.monotonic() - deadline_idle > 3600 * 24 * 30 or os.getppid() != parent or parent == 1:
            return 0  # parent 1 from the start: the session was gone before we looked


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent logs")
    parser.add_argument("cmd", choices=["logs"])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--follow", action="store_true")
    return cmd_logs(parser.parse_args(argv))
