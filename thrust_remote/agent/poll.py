"""`agent poll --runs JSON --stop-file F [--wait S]`: one command per poll for every running trial.

--runs is [[run_dir, offset], ...] or [[run_dir, offset, "log"], ...]: "log" reads the run's log instead
of metrics.jsonl and keeps only its `THRUST_METRICS {json}` lines, tag stripped (a job of your own
reports that way; docs/architecture.md, "JSON shapes"), the offset being the log's; "raw" reads the log
and keeps every whole line (a job whose `metrics: {pattern:}` the laptop reads from its own lines).
The command waits on the host up to S seconds and returns early when a run ends (its exit_code
appears or its directory vanishes), a run polled from offset 0 writes its first metrics (metrics.jsonl
only), or the stop file F appears: a freed slot is seen in ~50 ms instead of half a poll
period, without polling more often. Then, per run, the state first (runs.run_state) and the new
whole lines of metrics.jsonl second, so a run seen ended has had all its lines read.

Answer: {"stop": bool, "runs": {run_dir: {"state", "exit_code", "data", "offset", "more", "slot",
"log_tail"}}}; a missing run directory is {"state": "MISSING", "data": "", "offset", "more": false}.
`more` says a 1 MiB read did not reach the end (a line longer than that is skipped: no metrics line is);
`log_tail` (FAILED only) is the log's last 2000 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import BinaryIO

from .protocol import EXIT_CODE, LOG, METRICS, RunState
from .runjson import read_record
from .supervisor import run_state

TAG = b"THRUST_METRICS "
CHUNK = 1 << 20
SKIP_MAX = 64 << 20  # of one over-long line, skipped per poll (the rest by the next)
TAIL = 2000


def _has_metrics(run_dir: str) -> bool:
    try:
        return os.path.getsize(os.path.join(run_dir, METRICS)) > 0
    except OSError:
        return False


def _something_happened(runs: list[tuple[str, int, str]], stop_file: str) -> bool:
    if os.path.exists(stop_file):
        return True
    return any(not os.path.isdir(d) or os.path.exists(os.path.join(d, EXIT_CODE))
               or (o == 0 and src == "metrics" and _has_metrics(d)) for d, o, src in runs)


def _log_tail(run_dir: str) -> str:
    try:
        with open(os.path.join(run_dir, LOG), "rb") as fh:
            fh.seek(max(0, os.path.getsize(fh.name) - TAIL))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _tagged(data: bytes) -> bytes:
    """The JSON of each `THRUST_METRICS {json}` line of a log, one a line."""
    return b"".join(line[len(TAG):] + b"\n" for line in data.splitlines() if line.startswith(TAG))


def _whole_lines(fh: BinaryIO, offset: int) -> tuple[bytes, int, bool]:
    """(the whole lines of one read from `offset`, the offset past them, whether there may be more). A
    line longer than a read is no metrics line: skipped to its end (SKIP_MAX at most per poll), or the
    poll would read the same CHUNK again forever and the run's metrics never move on."""
    data = fh.read(CHUNK)
    cut = data.rfind(b"\n") + 1
    if cut or len(data) < CHUNK:
        return data[:cut], offset + cut, len(data) == CHUNK
    skipped = len(data)
    while skipped < SKIP_MAX and (more := fh.read(CHUNK)):
        at = more.find(b"\n")
        if at >= 0:
            return b"", offset + skipped + at + 1, True
        skipped += len(more)
    return b"", offset + skipped, True


def _one(run_dir: str, offset: int, source: str = "metrics") -> dict:
    if not os.path.isdir(run_dir):
        return {"state": "MISSING", "data": "", "offset": offset, "more": False}
    st = run_state(run_dir)  # before the read: a run seen ended has had all its lines read
    try:
        with open(os.path.join(run_dir, METRICS if source == "metrics" else LOG), "rb") as fh:
            fh.seek(offset)
            data, end, more = _whole_lines(fh, offset)
    except FileNotFoundError:
        data, end, more = b"", offset, False
    lines = _tagged(data) if source == "log" else data
    meta = read_record(run_dir)
    return {"state": st["state"], "exit_code": st["exit_code"], "data": lines.decode("utf-8", "replace"),
            "offset": end, "more": more, "slot": meta.get("slot"),
            "log_tail": _log_tail(run_dir) if st["state"] == RunState.FAILED else ""}


def poll(runs: list[tuple[str, int, str]], stop_file: str, wait: float) -> dict:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and not _something_happened(runs, stop_file):
        time.sleep(0.05)
    out: dict = {"runs": {}, "stop": os.path.exists(stop_file)}
    for run_dir, offset, source in runs:
        out["runs"][run_dir] = _one(run_dir, int(offset), source)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent poll")
    parser.add_argument("--runs", required=True, help="JSON: [[run_dir, offset], ...]")
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--wait", type=float, default=0.0)
    args = parser.parse_args(argv)
    runs = [(str(r[0]), int(r[1]), str(r[2]) if len(r) > 2 else "metrics") for r in json.loads(args.runs)]
    print(json.dumps(poll(runs, args.stop_file, args.wait)))
    return 0
