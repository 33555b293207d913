"""`agent supervise`: the batch step of a run on a Slurm cluster, run on its allocation by the script
`launch --slurm` submitted (slurm.py) — on every node of it over several (srun).

The same supervisor as a host's launch (job.py): the job started, watched, its end recorded in the run
directory on the shared filesystem, and this step exits with the job's code, so the scheduler's
COMPLETED / FAILED agree with it. Slurm's TERM (scancel, the time limit, a preemption) goes to the
job's group; its time-limit warning (USR1) becomes the job's TERM, and a run whose retry asks for it
submits its next attempt before its end is written (slurm.continue_itself).

    agent supervise --run-dir D
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal

from . import job, slurm
from .procs import signal_group
from .procs import start_time as proc_start_time
from .protocol import (
    CONTINUE_ERROR,
    EXIT_CODE,
    LOG,
    PREEMPTED,
    SELF_RETRY,
    STOPPED,
    never_started_end,
    run_record,
)
from .runjson import read_record, write_record
from .supervisor import exit_text, parse_end


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
    meta: slurm.SlurmNodeRecord = read_record(run_dir)
    # stopped, or given up (the cluster cannot start it), as it was starting: nothing runs
    if any(os.path.exists(os.path.join(run_dir, name)) for name in (STOPPED, slurm.CANNOT_START)):
        if not os.path.exists(os.path.join(run_dir, EXIT_CODE)):
            job.write_text(os.path.join(run_dir, EXIT_CODE), never_started_end())
        return 0
    own_env = slurm.job_env(run_dir)  # kept: a status that sees the run ended removes the file meanwhile
    env = dict(os.environ)  # the allocation's own (SLURM_*), then the run's
    env.update(own_env)
    job.activate(env)
    env["PYTHONUNBUFFERED"] = "1"
    job.starting(meta, env, None, [])
    # over several nodes: this node's own directory (node 0: the run dir) and torchrun's rendezvous
    here, argv = slurm.place_node(run_dir, meta, env, list(meta.get("argv") or []))
    devnull = os.open(os.devnull, os.O_RDWR)
    log_fd = os.open(os.path.join(here, LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    meta.update(supervisor_pid=os.getpid(), supervisor_start=proc_start_time(os.getpid()), argv=argv)
    job.reserve_end(here)
    # Over several nodes Slurm's warning reaches every process of srun's step, the job's too, whose
    # default for USR1 is to die (exit 138): the job starts with it ignored (SIG_IGN outlives exec), so
    # the warning is the supervisor's to turn into the job's TERM. A job with a USR1 handler of its own
    # still gets it. The supervisor's own handler is set just below.
    signal.signal(slurm.LIMIT_SIGNAL, signal.SIG_IGN)
    proc = job.start(here, meta.get("cwd") or run_dir, argv, env, devnull, log_fd, -1)
    if proc is None:
        return 127
    meta.update(pid=proc.pid, pid_start=proc_start_time(proc.pid))
    if here == run_dir:  # the login node may be writing the job id meanwhile: merged, never overwritten
        started = ("started_at", "started_ts", "supervisor_pid", "supervisor_start", "argv", "pid", "pid_start",
                   "slurm_node", "slurm_node_name")
        meta = slurm.update_meta(run_dir, {k: meta[k] for k in started if k in meta},
                                 job_id=os.environ.get("SLURM_JOB_ID"))
    else:
        write_record(here, run_record(meta))
    # The scheduler's TERM (scancel, the time limit, a preemption) goes to the job's group; the supervisor
    # lives on to record the end (Slurm's KILL follows after its KillWait).
    termed: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: (termed.append(True), signal_group(proc.pid, signal.SIGTERM)))
    # sbatch --signal=B:USR1@S: the time limit is S seconds away. The job gets a TERM now, while there is
    # time to write a checkpoint, and the run's end reads as a timeout (resumable: retry on: [timeout]).
    signal.signal(slurm.LIMIT_SIGNAL, lambda *_: (slurm.near_limit(run_dir), signal_group(proc.pid, signal.SIGTERM)))
    job.watch(here, meta, proc, (lambda: _continue(run_dir, meta, own_env, bool(termed))) if here == run_dir else None)
    end, _, _, _ = parse_end(exit_text(here))
    return min(int(end or 0), 255)


def _continue(run_dir: str, meta: slurm.SlurmNodeRecord, env: dict, termed: bool) -> None:
    """A run at its time limit, or preempted, submits its next attempt (slurm.continue_itself);
    whatever goes wrong there is said in run.json and the run's end is still recorded (an end never goes
    unwritten). Whether a TERM was a preemption is asked only of a run that would continue on one."""
    try:
        if termed and PREEMPTED in ((meta.get(SELF_RETRY) or {}).get("on") or ()):
            slurm.note_preempted(run_dir)
        slurm.continue_itself(run_dir, meta, env)
    except Exception as exc:  # noqa: BLE001 - the end must be written whatever failed
        with contextlib.suppress(OSError):
            slurm.update_meta(run_dir, {CONTINUE_ERROR: f"{type(exc).__name__}: {exc}"})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("supervise")
    p.add_argument("--run-dir", required=True)
    return cmd_supervise(parser.parse_args(argv))
