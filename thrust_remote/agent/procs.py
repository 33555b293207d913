"""Processes as /proc shows them: a pid's identity (its start time, command line, environment), and a
job's process group ended (TERM, then KILL to the group and every descendant).

A pid alone is not a process: pids are recycled, so a run's supervisor and job are recorded with their
start time (field 22 of /proc/PID/stat) and recognised by both. Signals go only to a group or a pid
this run started and recorded (docs/architecture.md, "The run directory on the host").
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot): a pid's identity together with the pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[19]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def environ_has(pid: int, needle: str) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return needle.encode() in fh.read().split(b"\0")
    except OSError:
        return False


def name(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return None


def lock_holder(fd: int) -> str | None:
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
            who = name(int(row[4]))
            return f"{row[4]} ({who})" if who else row[4]
    return None


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(OSError):
        os.killpg(pgid, sig)


def kill_group(pgid: int, grace: float) -> bool:
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
