"""Snake learning, not one lucky run: the demo preset trained over several seeds, each model scored greedily.

    .venv/bin/python bench/bench_snake.py                          # seeds 1,2,3; 100 episodes each
    .venv/bin/python bench/bench_snake.py --seeds 1,2,3 --parallel 2 --train-args "--compile"

Each seed is `python -m trainer.train --env snake --seed S` with the preset (what `make demo` and
`thrust-remote train snake` run) and `--export`, then `python -m trainer.eval MODEL --episodes 100`
plays the exported ONNX model greedily through onnxruntime (the same model the page plays). Prints a
row per seed (mean and its standard error, median, full boards, training wall time, steps/s) and the
worst and mean of the seeds' means; `--json` adds one JSON object. Runs are separate processes;
`--parallel` runs that many at once (each trainer uses one torch thread on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def last_tagged(text: str, tag: str) -> dict[str, Any]:
    lines = [line for line in text.splitlines() if line.startswith(tag + " ")]
    return json.loads(lines[-1][len(tag) + 1 :]) if lines else {}


def one_seed(seed: int, episodes: int, extra: list[str], root: Path) -> dict[str, Any]:
    run = root / f"seed{seed}"
    model = run / "model.onnx"
    cmd = [sys.executable, "-m", "trainer.train", "--env", "snake", "--seed", str(seed), "--run-dir", str(run),
           "--export", str(model), "--log-interval", "30", *extra]
    t0 = time.perf_counter()
    train = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if train.returncode != 0:
        raise SystemExit(f"seed {seed}: training failed ({train.returncode}):\n{train.stderr[-2000:]}")
    (run / "train.out").write_text(train.stdout)  # the choice's lines (--candidates, --snapshots) are only here
    done = last_tagged(train.stdout, "THRUST_DONE")
    ev = subprocess.run([sys.executable, "-m", "trainer.eval", str(model), "--episodes", str(episodes), "--json"],
                        cwd=REPO, capture_output=True, text=True, check=True)
    score = json.loads(ev.stdout.strip().splitlines()[-1])
    return {
        "seed": seed,
        "mean": score["mean"],
        "sem": score["sem"],
        "median": score["median"],
        "max": score["max"],
        "full_boards": score["full_board_fraction"],
        "episodes": score["episodes"],
        "steps": done.get("step"),
        "train_wall_s": wall,
        "sps": done["step"] / wall if done.get("step") else None,
        "kept": {"candidate": done.get("candidate"), **(done.get("held_out") or {})},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--episodes", type=int, default=100, help="greedy episodes per model")
    p.add_argument("--parallel", type=int, default=1, help="seeds trained at once")
    p.add_argument("--train-args", default="", help="extra flags for trainer.train (quoted, shell words)")
    p.add_argument("--keep", type=Path, default=None, metavar="DIR",
                   help="keep the runs (metrics.jsonl, model) in DIR/seedS; default: a temporary directory")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = shlex.split(args.train_args)
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(args.parallel) as pool:
        root = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-snake-")))
        rows = list(pool.map(lambda s: one_seed(s, args.episodes, extra, root), seeds))
    print(f"{'seed':>4} {'mean':>7} {'± se':>5} {'median':>7} {'max':>5} {'full':>6} {'steps':>11} {'train s':>8} "
          f"{'steps/s':>9}")
    for r in rows:
        print(f"{r['seed']:>4} {r['mean']:>7.1f} {r['sem']:>5.1f} {r['median']:>7.0f} {r['max']:>5.0f} "
              f"{r['full_boards']:>6.0%} {r['steps']:>11,} {r['train_wall_s']:>8.0f} {r['sps']:>9,.0f}")
    means = [r["mean"] for r in rows]
    print(f"worst seed's mean {min(means):.1f}, mean of means {statistics.mean(means):.1f} "
          f"({len(rows)} seeds x {args.episodes} greedy episodes)")
    if args.json:
        print(json.dumps({"rows": rows, "worst_mean": min(means), "train_args": extra}))


if __name__ == "__main__":
    main()
