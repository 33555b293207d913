"""The idle-GPU stop: a run whose GPUs sit idle too long is stopped by its own supervisor on the host
(docs/architecture.md, "The idle-GPU stop"; a job's `idle_stop: {below: PERCENT, minutes: M}`).

Every `every` seconds (30 by default) nvidia-smi is asked for each GPU's utilization; when every GPU
the run could use (run.json's `gpus_used`, else all listed) has been below `below` percent for
`minutes` minutes in a row, the STOPPED file is written with the reason `idle` and the job's group is
stopped. A sample that cannot be taken (no nvidia-smi, an error, none of the run's GPUs listed) says
nothing: missing data never stops a run, and it restarts the count.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

QUERY = ["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"]


def utilization(gpus: Sequence[int]) -> list[float] | None:
    """The utilization (%) of `gpus` (every GPU listed when empty), or None when it cannot be read."""
    try:
        out = subprocess.run(QUERY, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    seen: dict[int, float] = {}
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            seen[int(parts[0])] = float(parts[1])
        except (ValueError, IndexError):
            continue
    wanted = [seen[g] for g in gpus if g in seen] if gpus else list(seen.values())
    return wanted or None


def watch(spec: dict, gpus: Sequence[int], done: threading.Event, on_idle: Callable[[str], None],
          clock: Callable[[], float] = time.monotonic) -> threading.Thread:
    """Start the watch; `on_idle(detail)` is called once when the run has been idle long enough."""
    below, minutes = float(spec["below"]), float(spec["minutes"])
    every = float(spec.get("every") or 30.0)

    def loop() -> None:
        idle_since: float | None = None
        while not done.wait(every):
            now, used = clock(), utilization(gpus)
            if used is None or max(used) >= below:
                idle_since = None
                continue
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= minutes * 60:
                which = ",".join(str(g) for g in gpus) if gpus else "all"
                on_idle(f"GPUs {which} below {below:g}% for {minutes:g} min (last: "
                        f"{', '.join(f'{u:g}%' for u in used)})")
                return

    thread = threading.Thread(target=loop, name="idlewatch", daemon=True)
    thread.start()
    return thread


def stopped_note(reason: str, detail: str, at: str) -> str:
    """The STOPPED file's text: a JSON object (a stop on request writes only its time)."""
    return json.dumps({"at": at, "reason": reason, "detail": detail})
