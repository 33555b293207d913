"""GPU-hours and wall-hours over the runs a host lists (`runs --summary [--since 7d]`).

Each status already carries its `wall_hours` and `gpu_hours` (the host agent computes them by its own
clock: docs/architecture.md, "JSON shapes"); here they are only filtered by start and added up per
host and job.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from thrust_remote.core.errors import UsageError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> float:
    """`7d`, `24h`, `30m`, `90s`, `2w` as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not match:
        raise UsageError(f"--since {text!r}: expected a number and a unit, like 7d, 24h or 30m")
    return float(match.group(1)) * _UNITS[match.group(2)]


def started_ts(row: Mapping[str, Any]) -> float | None:
    """A status's `started_at` (UTC, `2026-11-25T08:23:05Z`) as a timestamp, or None."""
    try:
        return float(calendar.timegm(time.strptime(str(row.get("started_at")), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def summarize(rows: Iterable[Mapping[str, Any]], *, since_s: float | None = None,
              now: float | None = None) -> list[dict[str, Any]]:
    """Per (host, job), runs started within `since_s` seconds (all when None; a run that never started is
    none of them): how many, and their wall and GPU hours summed, sorted by host then job."""
    cutoff = None if since_s is None else (time.time() if now is None else now) - since_s
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if "error" in row or not row.get("started_at"):
            continue  # a host that did not answer; a run that never started (stopped while queued)
        start = started_ts(row)
        if cutoff is not None and (start is None or start < cutoff):
            continue
        key = (str(row.get("host") or ""), str(row.get("job") or ""))
        total = totals.setdefault(key, {"host": key[0], "job": key[1], "runs": 0, "wall_hours": 0.0,
                                        "gpu_hours": 0.0})
        total["runs"] += 1
        total["wall_hours"] += float(row.get("wall_hours") or 0.0)
        total["gpu_hours"] += float(row.get("gpu_hours") or 0.0)
    out = [totals[k] for k in sorted(totals)]
    for total in out:
        total["wall_hours"], total["gpu_hours"] = round(total["wall_hours"], 4), round(total["gpu_hours"], 4)
    return out
