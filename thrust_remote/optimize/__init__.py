"""`thrust-remote optimize JOB --trials N`: an Optuna study whose trials are detached runs on a host.

Optuna runs here, in the CLI process (ask/tell); every trial is a detached run on the host (the same
supervisor as `train`), one per slot, with the slot's GPUs as CUDA_VISIBLE_DEVICES. One remote
command per poll reads every running trial's state and the new bytes of its metrics.jsonl (by
byte offset); the trainer's `return_mean`, bucketed into fixed step rungs, is what the pruner sees.

Storage (docs/optimize.md): by default the study is a SQLite file on the host,
`<workdir>/.thrust/studies/<study>.db`. For the local host Optuna opens that file directly. For a
remote host the file is fetched (verified) into `<project>/.thrust/study-cache/<host>/` at start, and
put back (snapshot, verified, atomic rename) after every change of a trial's state, so the host's
copy is the authoritative one and a rerun from any laptop continues it. `--storage URL` (e.g.
postgresql://, or journal:FILE for Optuna's journal storage) is used as it is: no copies, several
drivers may share it.

Several hosts (`--host a --host b`, or a group): one driver schedules trials over the union of every
host's slots; each host is prepared (sync, preflight, setup) in its own thread. The study is a SQLite
file on the driver, `<project>/.thrust/studies/<study>.db` (trials report through the driver, which
reads their metrics over SSH), or `--storage`; every host holds the driver's lease. A host that cannot
be reached, at the start or later, leaves the pool: its running trials are told FAIL (interrupted)
and their parameters run again elsewhere; the study goes on while one host remains.

Resume: a rerun of the same command finds the trials RUNNING in the study. Each one's run id was
stored *before* it was launched, so its run is found: still running → adopted (followed again); ended
→ told from its metrics; never started, lost or stopped → marked FAIL and its parameters enqueued
again. Only COMPLETE and PRUNED trials count towards N.

The modules (docs/architecture.md, "Packages and what each may import"): space (what is searched),
slots (where trials run), fleet (the study's hosts, polled at once; the lost ones), store (lease +
study DB), monitor (polls, metrics, rungs), resume (the trials an earlier driver left RUNNING),
scheduler (the only caller of `tell`), summary (the end), driver (builds them all, in order), hostops
(every remote action, and every call into runs.* and run.*). Only hostops reaches the host or run/.
"""

from __future__ import annotations

from thrust_remote.optimize.driver import Optimizer, request_stop
from thrust_remote.optimize.model import (
    DEFAULT_LOG_INTERVAL,
    METRICS,
    PRUNERS,
    PUSH_EVERY_S,
    RUNGS,
    Control,
    NullObserver,
    Observer,
    OptimizeRequest,
    TrialView,
    is_trial_run,
)
from thrust_remote.optimize.slots import Slot, SlotPool, plan_slots
from thrust_remote.optimize.space import DEFAULT_SEARCH, NOT_SEARCHABLE, TRAINER_FLAGS, distributions, search_space
from thrust_remote.optimize.store import LEASE_S, HostsStore, StudyStore, default_study_name
from thrust_remote.optimize.summary import Summary, param_importances, write_best_params
from thrust_remote.run.gpus import host_gpus

__all__ = [
    "DEFAULT_LOG_INTERVAL", "DEFAULT_SEARCH", "LEASE_S", "METRICS", "NOT_SEARCHABLE", "PRUNERS",
    "PUSH_EVERY_S", "RUNGS", "TRAINER_FLAGS", "Control", "HostsStore", "NullObserver", "Observer", "OptimizeRequest",
    "Optimizer", "Slot", "SlotPool", "StudyStore", "Summary", "TrialView", "default_study_name", "distributions",
    "host_gpus", "is_trial_run", "param_importances", "plan_slots", "request_stop", "search_space", "write_best_params",
]
