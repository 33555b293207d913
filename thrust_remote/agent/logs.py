"""`agent logs`: a run's log from a byte offset, and with --follow until the run has ended.

    agent logs --run-dir D --offset N [--follow]

Kept apart from supervisor.py: a follow runs for the whole of a run, and only reads. It ends when the
run has ended and all is sent, or within IDLE_S of its laptop going away (`_laptop_gone`), whether the
log is busy or silent.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import time
from typing import BinaryIO

from .protocol import LOG, LOG_START, AgentExit
from .supervisor import run_state

READ = 1 << 20  # a fast job's log is sent in large writes: the laptop's side is what keeps pace
BUSY_S, IDLE_S = 0.05, 0.2  # the wait for more after a read that found some, and after one that found none
MAX_S = 3600 * 24 * 30


def _reader_gone(fd: int) -> bool:
    """Whether nobody reads our stdout any more: the pipe (or socket) sshd gave the command has lost its
    other end, because its session ended when the laptop's connection did. Asked without writing, so a
    silent log (a queued run, a quiet job) shows it as well as a busy one. A file (a request of `agent
    serve`, whose end its parent's shows) never says so."""
    if not hasattr(select, "poll"):
        return False
    try:
        poller = select.poll()
        poller.register(fd, 0)  # no event asked for: errors and hang-ups are always told
        return any(ev & (select.POLLERR | select.POLLHUP | select.POLLNVAL) for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def _laptop_gone(parent: int, fd: int) -> bool:
    """The laptop that asked for this follow is gone. Two signs, for the two ways a follow runs: the
    reader of our stdout gone (a command of its own over SSH, whose parent is a `sh -c` that waits for
    it and outlives the session), or our parent gone (a request of `agent serve`, which ends with its
    link; parent 1 from the start: the session was gone before we looked)."""
    return parent == 1 or os.getppid() != parent or _reader_gone(fd)


def _copy(path: str, offset: int, out: BinaryIO) -> int:
    """Send what the log holds past `offset`; the new offset. FileNotFoundError when there is no log."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(READ):
            out.write(chunk)
            offset += len(chunk)
    out.flush()
    return offset


def cmd_logs(args: argparse.Namespace) -> int:
    """Copy the log from a byte offset; with --follow, until the run has ended and all is sent, or until
    the laptop that follows is gone (within IDLE_S of sshd ending its session)."""
    path = os.path.join(args.run_dir, LOG)
    out = sys.stdout.buffer
    started = time.monotonic()
    parent = os.getppid()
    try:
        out.write(LOG_START)  # what came before it is not the log (a start-up file's words)
        out.flush()
        offset = args.offset
        while True:
            before = offset
            try:
                offset = _copy(path, offset, out)
            except FileNotFoundError:
                if not args.follow:
                    return AgentExit.MISSING
            if not args.follow:
                return 0
            if offset == before and not run_state(args.run_dir)["state"].is_live:
                # one last read: the job may have written its final lines after our read above
                with contextlib.suppress(FileNotFoundError):
                    _copy(path, offset, out)
                return 0
            if _laptop_gone(parent, out.fileno()) or time.monotonic() - started > MAX_S:
                return 0
            time.sleep(BUSY_S if offset != before else IDLE_S)
    except BrokenPipeError:
        # the laptop went away mid-write: nobody to tell; stdout pointed elsewhere so the exit's flush is quiet
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent logs")
    parser.add_argument("cmd", choices=["logs"])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--follow", action="store_true")
    return cmd_logs(parser.parse_args(argv))
