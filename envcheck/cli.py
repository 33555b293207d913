"""`python -m envcheck --json [--job-json JSON|-] [--workdir DIR] [--host NAME] [--gpus 0,1]
[--cache-dir DIR [--fresh]]`.

`--job-json -` reads the job from stdin: its `env:` values may be secrets, and a command line is
readable by every user of the host (thrust-remote always sends it so)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="envcheck", description="Report this host's GPU training facts.")
    parser.add_argument("--json", action="store_true", help="print the JSON report (the only format)")
    parser.add_argument("--job-json", default=None, help="the job's config as a JSON object (-: from stdin)")
    parser.add_argument("--workdir", default=".", help="where the code lives (crate paths are relative to it)")
    parser.add_argument("--host", default=None, help="the host's name in thrust.yaml (used in fixes)")
    parser.add_argument("--gpus", default=None, help="configured GPU indices, comma-separated")
    parser.add_argument("--torch-timeout", type=float, default=30.0, help="seconds for the torch probe")
    parser.add_argument("--cache-dir", default=None,
                        help="keep a passing torch probe here and reuse it while nothing it depends on changed")
    parser.add_argument("--fresh", action="store_true", help="probe torch again even when a kept probe is valid")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.job_json == "-" else args.job_json
        job = json.loads(text) if text else None
        if job is not None and not isinstance(job, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        parser.error(f"--job-json: {exc}")
    gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else None

    # import torch is the critical path: start it before loading the rest of envcheck
    from . import torchprobe

    probe = torchprobe.start(args.torch_timeout, cache_dir=args.cache_dir, fresh=args.fresh)
    from . import report

    doc = report(workdir=args.workdir, job=job, host=args.host, gpus=gpus, torch_timeout=args.torch_timeout,
                 torch_probe=probe)
    sys.stdout.write(json.dumps(doc, indent=None if args.json else 2) + "\n")
    return 0
