"""Slurm's job states as run states: the one mapping of the scheduler's words (squeue's %T, sacct's State)
and what a run directory recorded to a run's state and why (docs/architecture.md, "Slurm clusters").

Read by agent/slurm.py (status, list, a follow) and by the docs; pure, so its table is tested in this
process (tests/test_slurm_units.py). Imports nothing of the agent but the protocol.
"""

from __future__ import annotations

from .protocol import CANCELLED, OUT_OF_MEMORY, PREEMPTED, TIMEOUT, USER_STOP, RunState, SchedulerView

SLURM = "slurm"  # run.json's `scheduler` kind of a run submitted with sbatch; `.thrust/slurm` its cache dir

# Slurm's job states, each to a run state and, for an end that is not the job's own, the reason status
# shows. Mapped here once: the agent, status and the docs read this table. Where Slurm's word is our
# state's own (RUNNING, FAILED, STOPPED) it is spelled by RunState: the protocol spells the state words.
SLURM_STATES: dict[str, tuple[RunState, str]] = {
    "PENDING": (RunState.QUEUED, ""),
    "CONFIGURING": (RunState.QUEUED, "configuring"),  # nodes allocated, booting
    "REQUEUED": (RunState.QUEUED, "requeued"),
    "REQUEUE_FED": (RunState.QUEUED, "requeued"),
    "REQUEUE_HOLD": (RunState.QUEUED, "held"),
    "RESV_DEL_HOLD": (RunState.QUEUED, "held"),
    "RESIZING": (RunState.RUNNING, ""),
    RunState.RUNNING.value: (RunState.RUNNING, ""),
    "COMPLETING": (RunState.RUNNING, ""),  # the job's processes are ending
    "STAGE_OUT": (RunState.RUNNING, ""),
    "SIGNALING": (RunState.RUNNING, ""),
    "SUSPENDED": (RunState.RUNNING, "suspended"),
    RunState.STOPPED.value: (RunState.RUNNING, "suspended"),  # Slurm's STOPPED: suspended, not ended
    "COMPLETED": (RunState.FINISHED, ""),
    RunState.FAILED.value: (RunState.FAILED, "failed"),
    "OUT_OF_MEMORY": (RunState.FAILED, OUT_OF_MEMORY),
    "BOOT_FAIL": (RunState.FAILED, "boot-fail"),
    "DEADLINE": (RunState.FAILED, "deadline"),
    "TIMEOUT": (RunState.FAILED, TIMEOUT),  # its time limit: resumable from its last checkpoint
    "CANCELLED": (RunState.STOPPED, CANCELLED),
    "REVOKED": (RunState.STOPPED, CANCELLED),
    "NODE_FAIL": (RunState.LOST, "node-fail"),
    "PREEMPTED": (RunState.LOST, PREEMPTED),
}
# the scheduler's ends that are not the job's own: they decide the state even when the job recorded an
# exit code (a job killed at its time limit records 143; it ran out of time, it did not fail by itself)
SLURM_DECIDES = frozenset({"OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "TIMEOUT", "CANCELLED", "REVOKED",
                           "NODE_FAIL", "PREEMPTED"})


def _recorded(exit_code: int | None, stopped: bool) -> RunState:
    if stopped:
        return RunState.STOPPED
    return RunState.FINISHED if exit_code == 0 else RunState.FAILED


def slurm_state(word: str | None, reason: str, *, exit_code: int | None, ended: bool, stopped: bool,
                started: bool) -> SchedulerView:
    """A Slurm run's state from the scheduler's word (None: the scheduler no longer knows the job) and
    what its run directory recorded: `exit_code` / `ended` (the supervisor wrote its end), `stopped`
    (`stop` asked), `started` (the supervisor started the job). docs/architecture.md, "Slurm clusters"."""
    word = (word or "").split(" ")[0].rstrip("+").upper() or None  # sacct: "CANCELLED by 0"
    state, why = SLURM_STATES.get(word, (RunState.LOST, "")) if word else (RunState.LOST, "")
    if word in SLURM_DECIDES:
        if state == RunState.STOPPED and stopped:
            return {"state": RunState.STOPPED, "reason": USER_STOP}
        detail = {TIMEOUT: "it reached its time limit", PREEMPTED: "the scheduler preempted it",
                  "node-fail": "a node of its allocation failed", OUT_OF_MEMORY: "it ran out of memory",
                  CANCELLED: "cancelled in Slurm (scancel), not by thrust-remote stop"}.get(why, word.lower())
        return {"state": state, "reason": why, "reason_detail": detail}
    if ended and not stopped and (exit_code or 0) >= 128 and state == RunState.RUNNING:
        # killed by a signal while the scheduler still has the job: its word on why (a failed node, the
        # time limit, a cancel) is the run's end, and comes with the next poll; not FAILED meanwhile
        return {"state": RunState.RUNNING, "reason": "ending",
                "reason_detail": f"its job was killed (exit code {exit_code}); waiting for the scheduler's word"}
    if ended:  # the job's own end, written by its supervisor: what it says holds
        return {"state": _recorded(exit_code, stopped), **({"reason": USER_STOP} if stopped else {})}
    if word is None:
        return {"state": RunState.LOST, "reason": "gone",
                "reason_detail": "the scheduler no longer knows the job and nothing recorded its end"}
    if state == RunState.QUEUED and started:  # the answer is older than the job's start, which the run dir saw
        return {"state": RunState.RUNNING}
    if state == RunState.QUEUED:
        return {"state": state, "reason": why or reason or "pending"}
    if state == RunState.RUNNING:
        return {"state": state, **({"reason": why} if why else {})}
    if state == RunState.FINISHED:  # the batch script ended well, but the supervisor recorded no end
        return {"state": RunState.LOST, "reason": "no-end",
                "reason_detail": "the job ended without its supervisor recording an end"}
    when = "ended" if started else "started"
    return {"state": state, "reason": why, "reason_detail": f"{word.lower()} before the job {when}"}
