"""The age stop: a run older than its job's `max_duration:` is stopped by its own supervisor on the host
(docs/architecture.md, "Stops the run asks for"), wherever that supervisor runs: a detached process on
an SSH box or `local`, a node of a run over several hosts, a cluster scheduler's step.

The age counts from the job's start (a queued run's wait is not its age). At that age the STOPPED file
is written with the reason `max-duration` and the job's group gets TERM, then KILL after
MAX_DURATION_GRACE_S (protocol.py): a job that checkpoints on TERM has that long to write it. The
reason is never `timeout`, which is a cluster's time limit (the laptop's retry and a cluster's
self-continuation read that as "continue me").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .protocol import MAX_DURATION, MAX_DURATION_GRACE_S

__all__ = ["MAX_DURATION", "MAX_DURATION_GRACE_S", "describe", "watch"]


def describe(seconds: float) -> str:
    """`8h`, `1h30m`, `90s`: a duration as max_duration: takes it, for the stop's detail (a bound of
    fractional seconds as given: `1.5s`)."""
    if seconds != int(seconds):
        return f"{seconds:g}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    text = "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (secs, "s")) if n)
    return text or f"{seconds:g}s"


def watch(seconds: float, done: threading.Event, on_age: Callable[[str], None],
          clock: Callable[[], float] = time.monotonic) -> threading.Thread:
    """Start the watch; `on_age(detail)` is called once when the job has run `seconds`, unless `done`
    (the job ended) is set first. The wait is one Event.wait on a monotonic deadline: nothing polls."""
    deadline = clock() + seconds

    def loop() -> None:
        while not done.is_set():
            left = deadline - clock()
            if left <= 0:
                on_age(f"it reached its max_duration of {describe(seconds)}")
                return
            done.wait(left)

    thread = threading.Thread(target=loop, name="agewatch", daemon=True)
    thread.start()
    return thread
