"""Pulls while a run is followed: its newest checkpoint and changed artifacts, every `sync_every`
seconds (docs/architecture.md, "Checkpoints and resume").

A run that outlives its host needs its checkpoint somewhere else before the host goes: whatever
follows a run (`train`, `logs -f`, `wait`, `watch`) runs a Puller beside the follow. Each pull is the
same verified, incremental fetch as `fetch RUN` (fetch/checkpoints.py, fetch/artifacts.py): a pull cut
by a lost link or Ctrl-C leaves no partial file under a final name. A pull that fails is said once and
tried again next turn: the follow is what decides whether the host is gone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrust_remote.core.config import JobConfig
from thrust_remote.core.errors import ThrustError
from thrust_remote.fetch import artifacts, checkpoints
from thrust_remote.host.session import HostSession

log = logging.getLogger(__name__)

SYNC_EVERY_S = 300.0  # the default: a checkpoint at most five minutes old when a host goes


def sync_every(job: JobConfig | None, given: float | None) -> float:
    """Seconds between pulls: `--sync-every`, else the job's `sync_every:`, else SYNC_EVERY_S; 0 is off,
    and so is a job with neither checkpoints nor artifacts (nothing to pull)."""
    if job is None:
        return 0.0
    return interval(has_files(job), job.sync_every, given)


def interval(pulls: bool, configured: float | None, given: float | None) -> float:
    """sync_every of a job whose outputs are known already: `pulls` (it names checkpoints or artifacts),
    its `sync_every:` (`configured`) and `--sync-every` (`given`)."""
    if not pulls:
        return 0.0
    if given is not None:
        return max(0.0, given)
    return configured if configured is not None else SYNC_EVERY_S


def has_files(job: JobConfig) -> bool:
    """Whether a job names something to pull: checkpoints (the trainer's are known) or artifacts."""
    return checkpoints.checkpoint_glob(job) is not None or bool(artifacts.artifact_globs(job))


@dataclass
class Pulled:
    """One pull, as the view shows it."""

    at: float  # time.time() when it ended
    checkpoint: str | None  # the newest checkpoint here now
    files: int  # files that came (the checkpoint and artifacts)
    bytes: int
    seconds: float
    fresh: bool = False  # the checkpoint itself came in this pull (not only artifacts)
    checkpoints: bool = True  # the job names checkpoints (else only its artifacts are pulled)

    def text(self) -> str:
        moved = f"{self.files} file(s), {self.bytes:,} bytes" if self.files else "nothing new"
        if not self.checkpoints:  # "no checkpoint yet" would read as if nothing came
            return f"pulled {moved} of its artifacts ({self.seconds:.1f} s; the job names no checkpoints:)"
        what = f"checkpoint {self.checkpoint}" if self.checkpoint else "no checkpoint yet"
        return f"pulled {what} ({moved}, {self.seconds:.1f} s)"

    def as_json(self) -> dict[str, Any]:
        return {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)), "checkpoint": self.checkpoint,
                "files": self.files, "bytes": self.bytes, "seconds": round(self.seconds, 3)}


def pull_once(session: HostSession, job: JobConfig, run_dir: str, run_id: str, root: Path) -> Pulled:
    """The newest checkpoint and the changed artifacts, once; warnings are left to `fetch RUN`."""
    started = time.monotonic()
    files = size = 0
    newest, fresh = None, False
    glob = checkpoints.checkpoint_glob(job)
    if glob is not None:
        got = checkpoints.pull(session, run_dir, run_id, root, glob)
        newest, files, size, fresh = got.newest, len(got.fetched), got.bytes, bool(got.fetched)
    globs = artifacts.artifact_globs(job)
    if globs:
        # a checkpoint the globs match too is linked from the one just pulled, not fetched twice
        more = artifacts.fetch_artifacts(session, run_dir, run_id, root, globs,
                                         others=checkpoints.kept_twins(root, run_id))
        files, size = files + len(more.fetched) + len(more.linked), size + more.bytes
    return Pulled(time.time(), newest, files, size, time.monotonic() - started, fresh, glob is not None)


class Puller:
    """A thread that pulls every `every` seconds while a run is followed (the first after `every`: a
    run just started has nothing yet); `on_pulled` hears each pull, `on_warn` the first failure of a
    series. Leaving the block stops it; a pull in flight ends first when the follow ended by itself,
    and is cut when it ended by Ctrl-C or a lost link (nothing partial is kept under a final name)."""

    def __init__(self, session: HostSession, job: JobConfig, run_dir: str, run_id: str, root: Path, every: float,
                 on_pulled: Callable[[Pulled], None], on_warn: Callable[[str], None]) -> None:
        self.session, self.job, self.run_dir, self.run_id, self.root = session, job, run_dir, run_id, root
        self.every, self.on_pulled, self.on_warn = every, on_pulled, on_warn
        self.stopped = threading.Event()
        self.last: Pulled | None = None
        self.failing = False
        self.thread = threading.Thread(target=self._loop, name="pull", daemon=True)

    def __enter__(self) -> Puller:
        if self.every > 0:
            self.thread.start()
        return self

    def __exit__(self, exc_type: object = None, *exc: object) -> None:
        self.stopped.set()
        if self.thread.is_alive():
            self.thread.join(timeout=120 if exc_type is None else 1)

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            try:
                self.last = pull_once(self.session, self.job, self.run_dir, self.run_id, self.root)
            except (ThrustError, OSError) as exc:
                log.debug("pull failed: %s", exc)
                if not self.failing:
                    self.on_warn(f"pulling run {self.run_id}'s checkpoint failed ({exc}): trying again in "
                                 f"{self.every:g} s")
                self.failing = True
                continue
            self.failing = False
            self.on_pulled(self.last)
