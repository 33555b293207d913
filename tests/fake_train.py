"""A stand-in for a training run, for the tests whose subject is what happens around a run (following,
reattaching, a lost link, stop, the run index, optimize's scheduling), not the training itself.

It behaves as the built-in trainer does where thrust-remote looks: `THRUST_METRICS` lines with step,
total_steps, sps and return_mean (the progress view, `--json`, optimize's objective), a `THRUST_DONE`
line, `metrics.jsonl` in the run dir, and with `$THRUST_EXPORT` a small real ONNX policy with its
manifest (tests/tiny_onnx.py: onnx.checker and onnxruntime accept it, so fetch verifies and places it
as it does the trainer's). It needs numpy and onnx (a job venv's), not torch: a run costs a python
start-up, not torch's import, a training and an export (~6 s for `train cartpole` with FAST settings).

The trainer's own behaviour (learning, checkpoints, resume, export) keeps its real tests.

    python fake_train.py [--total-steps N] [--seconds S] [--log-interval S] [--return R] [--exit-code C]
                         [--crash-at-step N] [--wait-for FILE] [--env snake|cartpole]
Unknown flags (a test's `--set target-return=0`) are accepted and ignored, as a user's script might.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_onnx import tiny_policy  # noqa: E402 - beside this file, wherever it was copied


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fake_train.py")
    p.add_argument("--total-steps", type=int, default=6000)
    p.add_argument("--seconds", type=float, default=0.5, help="how long it runs")
    p.add_argument("--log-interval", type=float, default=0.1, help="seconds between THRUST_METRICS lines")
    p.add_argument("--return", dest="ret", type=float, default=100.0, help="the return it reports")
    p.add_argument("--exit-code", type=int, default=0)
    p.add_argument("--crash-at-step", type=int, help="exit 1 at this step, with no model")
    p.add_argument("--wait-for", help="keep running (past --seconds) until this file exists")
    p.add_argument("--env", default="cartpole", choices=("cartpole", "snake"))
    return p.parse_known_args(argv)[0]


def _say(tag: str, row: dict) -> None:
    print(f"{tag} {json.dumps(row)}", flush=True)


def main(argv: list[str]) -> int:
    a = _args(argv)
    run_dir = Path(os.environ.get("THRUST_RUN_DIR", "."))
    metrics = run_dir / "metrics.jsonl"
    start = time.monotonic()
    print(f"fake training for {a.seconds} s", flush=True)  # no "steps": tests wait for the progress line's
    step = 0
    while True:
        elapsed = time.monotonic() - start
        due = a.total_steps if a.seconds <= 0 else int(a.total_steps * elapsed / a.seconds)
        step = min(a.total_steps, max(step + 1, due))
        row = {"step": step, "total_steps": a.total_steps, "sps": round(step / max(elapsed, 1e-3)),
               "return_mean": round(a.ret * step / a.total_steps, 3)}
        _say("THRUST_METRICS", row)
        with metrics.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        if a.crash_at_step is not None and step >= a.crash_at_step:
            print(f"crashing at step {step}", file=sys.stderr, flush=True)
            return 1
        waiting = a.wait_for is not None and not Path(a.wait_for).exists()
        if step >= a.total_steps and not waiting:
            break
        time.sleep(a.log_interval)
    export = os.environ.get("THRUST_EXPORT")
    if export:
        tiny_policy(Path(export), seed=0, env=a.env, steps=step, final_return=a.ret)
    _say("THRUST_DONE", {"steps": step, "return_mean": a.ret, "seconds": round(time.monotonic() - start, 3)})
    return a.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
