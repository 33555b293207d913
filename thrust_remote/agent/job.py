"""A run's job started, watched and its end recorded: the part a host's launch (launcher.py) and a
cluster scheduler's step on its allocation (scheduled.py's `Kind.step`) share, whoever started the
supervisor it runs in.

The job starts in a process group of its own (so `stop` can signal its whole tree and still leave the
supervisor to record the end), with its venv first on PATH. While it runs, the watches a run asked for
go beside it: the other nodes of a run over several hosts (peerwatch.py), its idle GPUs (idlewatch.py)
and its age (agewatch.py). Its end is written atomically to `exit_code`, into blocks set aside at the
start when the job filled the disk (docs/architecture.md, "The run directory on the host").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from . import agewatch, idlewatch, peerwatch
from .files import write_atomic
from .netinfo import free_port
from .procs import kill_group
from .protocol import (
    END_RESERVE,
    END_RESERVE_BYTES,
    EXIT_CODE,
    FREE_PORT,
    GPUS_USED,
    IDLE,
    MAX_DURATION,
    MAX_DURATION_GRACE_S,
    STOPPED,
    RunRecord,
    utc_now,
)


def write_text(path: str, data: str) -> None:
    write_atomic(path, data.encode())


def activate(env: dict) -> None:
    """The job's venv first on PATH, as its `bin/activate` would do: a command job's `python`, `pip`
    or `torchrun` is then the venv's, with the requirements it was given (docs/architecture.md,
    "The job's venv"). PATH is the host's own here, which the laptop cannot know."""
    python = env.get("THRUST_PYTHON") or ""
    venv = os.path.dirname(os.path.dirname(python))
    if python and os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        env["VIRTUAL_ENV"] = venv
        env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", os.defpath)


def starting(meta: RunRecord, env: dict, spec: dict | None, gpus: list[int]) -> None:
    """What a run records as it starts; a queued `--gpus N` learns its GPUs only now."""
    if spec is not None and spec.get("count"):
        env["CUDA_VISIBLE_DEVICES"] = env["GPU_LIST"] = ",".join(str(g) for g in gpus)
        meta.update(gpus=list(gpus), **{GPUS_USED: list(gpus)})
    meta.update(started_at=utc_now(), started_ts=time.time())  # sub-second, for overlap checks and benchmarks


def start(run_dir: str, cwd: str, argv: list[str], env: dict, devnull: int, log_fd: int,
          report_fd: int) -> subprocess.Popen | None:
    """The job in a session of its own, its streams the run's log; None when it cannot start (its end,
    127, recorded and the launch's report told)."""
    if FREE_PORT in argv:  # a job that starts its own workers: their port, free here now (protocol.FREE_PORT)
        port = free_port("0.0.0.0").get("port")
        argv = [str(port) if word == FREE_PORT and port else word for word in argv]
    try:
        return subprocess.Popen(
            argv, cwd=cwd, env=env, stdin=devnull, stdout=log_fd, stderr=log_fd, start_new_session=True
        )
    except OSError as exc:
        os.write(log_fd, f"thrust: cannot start {argv[0]}: {exc}\n".encode())
        write_text(os.path.join(run_dir, EXIT_CODE), json.dumps({"exit_code": 127, "ended_at": utc_now()}))
        if report_fd >= 0:
            os.write(report_fd, json.dumps({"error": str(exc)}).encode())
            os.close(report_fd)
        return None


def watch(run_dir: str, meta: RunRecord, proc: subprocess.Popen,
          before_end: Callable[[], None] | None = None) -> None:
    """Wait for the job with the watches its run asked for, then record its end (`before_end` first)."""
    # The supervisor ignores the signals meant for the job's group; `stop` signals that group only.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    done = threading.Event()
    if meta.get("watch_peers"):  # a node of a run over several hosts (peerwatch.py)
        peerwatch.watch(run_dir, meta["watch_peers"], float(meta.get("peer_timeout") or 15), done,
                        lambda: kill_group(proc.pid, 5.0))

    def stop_for(reason: str, grace: float) -> Callable[[str], None]:
        def stop(detail: str) -> None:  # a stop the run asked for: STOPPED [reason], as `stop` would end it
            write_text(os.path.join(run_dir, STOPPED), idlewatch.stopped_note(reason, detail, utc_now()))
            kill_group(proc.pid, grace)
        return stop

    if meta.get("idle_stop"):  # the job's idle-GPU stop (idlewatch.py)
        idlewatch.watch(meta["idle_stop"], meta.get(GPUS_USED) or [], done, stop_for(IDLE, 10.0))
    if meta.get("max_duration"):  # the job's max_duration: (agewatch.py), counted from the job's start
        agewatch.watch(float(meta["max_duration"]), done, stop_for(MAX_DURATION, MAX_DURATION_GRACE_S))
    code = proc.wait()
    done.set()
    if code < 0:
        code = 128 - code
    if before_end is not None:
        before_end()
    record_end(run_dir, json.dumps({"exit_code": code, "ended_at": utc_now(), "ended_ts": time.time()}))


def reserve_end(run_dir: str) -> None:
    """END_RESERVE: blocks of the run's own for its end, taken while the disk has room."""
    with contextlib.suppress(OSError):
        write_text(os.path.join(run_dir, END_RESERVE), " " * END_RESERVE_BYTES)


def record_end(run_dir: str, text: str) -> None:
    """`exit_code`, whole; when the disk is full (the job may have filled it), written over END_RESERVE's
    bytes in place and renamed: a rename and an overwrite take no new block."""
    reserve = os.path.join(run_dir, END_RESERVE)
    try:
        write_text(os.path.join(run_dir, EXIT_CODE), text)
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
