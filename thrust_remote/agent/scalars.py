"""`agent scalars --runs JSON [--tag TAG]`: a job's TensorBoard scalars, read on the host (optimize's
objective with --tag; without it, the follow view's progress: the latest point of every tag).

Unlike the other subcommands this one runs with the job's venv python and its site-packages (no -S):
it reads event files with TensorBoard's own reader (tensorboard.backend.event_processing), imported
only here, so every other subcommand stays stdlib-only (docs/architecture.md, "The host agent").

--runs is [[run_dir, events_dir, since_step], ...]: the event files under `events_dir` (recursively)
that were created since the run started (the creation time in their name, `events.out.tfevents.<unix
time>.<host>...`, not before run.json's `started_ts`), so the earlier runs' files in the same checkout
do not count. Answer, one JSON line: {"runs": {run_dir: {"tags": [every scalar tag seen], "points":
[[step, value], ...] of TAG with step > since_step, by step}}}; without --tag, "latest": {tag: [step,
value]} (each tag's point of the highest step) in place of "points". Without tensorboard importable:
{"error": "missing", "detail": ...} and exit 3.
"""

from __future__ import annotations

import argparse
import json
import math
import os

from .protocol import AgentExit
from .runjson import read_record

PREFIX = "events.out.tfevents."


def _created(name: str) -> float | None:
    """The writer's creation time in an event file's name; None when the name has none."""
    part = name[len(PREFIX):].split(".", 1)[0]
    try:
        return float(part)
    except ValueError:
        return None


def event_files(events_dir: str, since: float) -> list[str]:
    """The event files under `events_dir` made at or after `since` (whole seconds, as names have them)."""
    out = []
    for root, _dirs, files in os.walk(events_dir):
        for name in files:
            if not name.startswith(PREFIX):
                continue
            path = os.path.join(root, name)
            created = _created(name)
            if created is None:
                created = os.path.getmtime(path)
            if created >= math.floor(since):
                out.append(path)
    return sorted(out)


def read_run(run_dir: str, events_dir: str, since_step: int, tag: str | None) -> dict:
    from tensorboard.backend.event_processing import event_accumulator as ea

    meta = read_record(run_dir)
    started = float(meta.get("started_ts") or 0.0)
    tags: set[str] = set()
    series: dict[str, dict[int, float]] = {}
    for path in event_files(events_dir, started):
        acc = ea.EventAccumulator(path, size_guidance={ea.SCALARS: 0})  # 0: keep every point
        acc.Reload()
        found = acc.Tags().get("scalars", [])
        tags.update(found)
        for name in found if tag is None else [tag] if tag in found else []:
            points = series.setdefault(name, {})
            for ev in acc.Scalars(name):
                if ev.step > since_step and math.isfinite(ev.value):
                    points[int(ev.step)] = float(ev.value)
    if tag is None:
        latest = {name: [max(points), points[max(points)]] for name, points in sorted(series.items()) if points}
        return {"tags": sorted(tags), "latest": latest}
    points = series.get(tag, {})
    return {"tags": sorted(tags), "points": [[s, points[s]] for s in sorted(points)]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent scalars")
    parser.add_argument("--runs", required=True, help="JSON: [[run_dir, events_dir, since_step], ...]")
    parser.add_argument("--tag", help="one tag's points; without it, every tag's latest point")
    args = parser.parse_args(argv)
    try:
        import tensorboard.backend.event_processing.event_accumulator  # noqa: F401
    except ImportError as exc:
        print(json.dumps({"error": "missing", "detail": str(exc)}))
        return AgentExit.REFUSED
    out = {run_dir: read_run(run_dir, events_dir, int(since), args.tag)
           for run_dir, events_dir, since in json.loads(args.runs)}
    print(json.dumps({"runs": out}))
    return 0
