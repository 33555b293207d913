"""`agent supervise`: the batch step of a run submitted to a cluster's scheduler, on its allocation.

    agent supervise --run-dir D

The script the launch submitted runs it; the run's run.json names its scheduler (`scheduler.kind`), whose
step module (scheduled.py's `Kind.step`) supervises the job there. A run dir that names no scheduler this
agent knows was never submitted by it: nothing is started, exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .runjson import read_record
from .scheduled import KINDS, kind_of


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("supervise").add_argument("--run-dir", required=True)
    args, _ = parser.parse_known_args(argv)
    kind = kind_of(read_record(os.path.abspath(args.run_dir)))
    if kind is None:
        sys.stderr.write(f"agent supervise: {args.run_dir}'s run.json names no scheduler this agent knows\n")
        return 2
    step = importlib.import_module(f".{KINDS[kind].step}", __package__)
    return int(step.main(argv) or 0)
