"""`thrust-remote optimize` scheduling on a loopback sshd: overhead per trial and slot utilisation.

    .venv/bin/python bench/bench_optimize.py [--trials 12] [--parallel 2] [--steps 65536] [--local]

Runs the real CLI (`optimize cartpole --trials N --parallel K --pruner none --json`) against a private
sshd (tests/conftest.py) whose "host" is a directory reached only through SSH; the study's SQLite lives
there and is synced after every change. CartPole trials without early stopping, so each lasts the same
order of time. Measures:
- launch → first metric: from the moment the driver starts launching a trial to the moment it has read
  the trial's first metrics line; "trainer's own" is the first line's `wall_s` (the trainer's time from
  its own start: torch import, env and policy build, the first report interval); the difference is
  the scheduling overhead (launch command, supervisor, the poll that reads the line).
- slot utilisation = busy / (slots × wall), wall from the first launch to the last end. "driver view":
  busy from launch to the end seen; "host view": busy while the trainer process existed (run.json
  written after the fork → exit_code written at its end, file mtimes on the host). Target ≥ 90 %.
- the idle gap on a slot between one trial's end (seen) and the next launch; DB pushes (count, time).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

SEARCH = """\
search:
  cartpole:
    learning-rate: {low: 3.0e-4, high: 1.0e-2, log: true}
    num-envs: {choices: [8, 16]}
    num-steps: {choices: [16, 32]}
"""


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_study(args: argparse.Namespace, root: Path) -> tuple[dict, Path, float, float, object]:
    """The real CLI on a fresh clone: (its JSON summary, the host's workdir, t0, command wall, server)."""
    server = None
    project = root / "project"
    subprocess.run(["git", "clone", "-q", str(REPO), str(project)], check=True)
    subprocess.run(["git", "-C", str(project), "remote", "remove", "origin"], check=True)
    if args.local:
        (project / "thrust.yaml").write_text(SEARCH)
        workdir = project
    else:
        from conftest import _start_sshd

        server = _start_sshd(root / "sshd")
        workdir = root / "host" / "thrust"
        server.thrust_yaml(project / "thrust.yaml", workdir=str(workdir), rest=SEARCH)
    exe = str(Path(sys.executable).parent / "thrust-remote")
    argv = [exe, "optimize", "cartpole", "--trials", str(args.trials), "--parallel", str(args.parallel),
            "--study", "bench", "--pruner", "none", "--seed", "1", "--set", f"total-steps={args.steps}",
            "--set", "target-return=0", "--json"]
    t0 = time.time()
    try:
        result = subprocess.run(argv, cwd=project, capture_output=True, text=True,
                                env={**os.environ, "NO_COLOR": "1"})
    except BaseException:
        stop_server(server)
        raise
    command_s = time.time() - t0
    if result.returncode != 0:
        stop_server(server)
        sys.exit(f"optimize failed ({result.returncode}):\n{result.stderr[-2000:]}")
    return json.loads(result.stdout), workdir, t0, command_s, server


def stop_server(server: object) -> None:
    if server is not None:
        os.killpg(server.wrapper.pid, signal.SIGKILL)  # ends sshd and every run started through it
        server.wrapper.wait(timeout=10)


def ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


def report_first_metric(trials: list[dict], workdir: Path) -> None:
    first_seen, own, overhead = [], [], []
    for t in trials:
        run_dir = workdir / ".thrust" / "runs" / t["run_id"]
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        trainer_first = json.loads(lines[0])["wall_s"]
        seen = t["first_metric_at"] - t["launched_at"]
        first_seen.append(seen)
        own.append(trainer_first)
        overhead.append(seen - trainer_first)
    print(
        f"  launch -> first metric seen: median {statistics.median(first_seen):.2f} s, "
        f"p90 {pct(first_seen, 0.9):.2f} s"
    )
    print(f"    trainer's own time to its first report: median {statistics.median(own):.2f} s")
    print(
        f"    scheduling overhead (difference): median {statistics.median(overhead):.3f} s, "
        f"p90 {pct(overhead, 0.9):.3f} s"
    )


def report_gaps(trials: list[dict], workdir: Path, busy_host: float) -> None:
    gaps, seen_late, launch_cost, host_idle = [], [], [], []
    for slot in {t["slot"] for t in trials}:
        mine = sorted((t for t in trials if t["slot"] == slot), key=lambda t: t["launched_at"])
        for a, b in zip(mine, mine[1:], strict=False):
            a_dir = workdir / ".thrust" / "runs" / a["run_id"]
            b_dir = workdir / ".thrust" / "runs" / b["run_id"]
            a_exit = (a_dir / "exit_code").stat().st_mtime
            b_start = (b_dir / "run.json").stat().st_mtime
            seen_late.append(a["ended_at"] - a_exit)  # trainer gone -> driver knows
            gaps.append(b["launched_at"] - a["ended_at"])  # driver knows -> starts the next launch
            launch_cost.append(b_start - b["launched_at"])  # ask, save study, launch command, fork
            host_idle.append(b_start - a_exit)
    if not gaps:
        return
    print(f"  idle on a slot between two trials (host): {ms(host_idle)}, of which")
    print(f"    trainer exited -> driver saw it: {ms(seen_late)}")
    print(f"    driver saw it -> next launch begins: {ms(gaps)}")
    print(f"    launch begins -> trainer process started: {ms(launch_cost)}")
    timing = [t["launch_timing"] for t in trials if t.get("launch_timing")]
    if timing:
        print(f"      saving the study (attributes + push): {ms([x['save_s'] for x in timing])}")
        print(f"      the launch command (supervisor, fork): {ms([x['launch_s'] for x in timing])}")
    alive = busy_host / len(trials)
    print(f"  mean trial (trainer alive) {alive:.1f} s: utilisation ~ alive / (alive + idle)")


def report(args: argparse.Namespace, out: dict, workdir: Path, t0: float, command_s: float) -> None:
    trials = [t for t in out["trials"] if t["launched_at"] and t["ended_at"]]
    busy_driver, busy_host = 0.0, 0.0
    for t in trials:
        run_dir = workdir / ".thrust" / "runs" / t["run_id"]
        busy_driver += t["ended_at"] - t["launched_at"]
        busy_host += (run_dir / "exit_code").stat().st_mtime - (run_dir / "run.json").stat().st_mtime
    start = min(t["launched_at"] for t in trials)
    wall = max(t["ended_at"] for t in trials) - start
    slots = len(out["slots"])
    where = "local host" if args.local else "loopback sshd"
    print(f"optimize cartpole: {len(trials)} trials, {slots} slots, total-steps {args.steps}, {where}")
    print(f"  command wall {command_s:.1f} s (prepare + study {start - t0:.1f} s, trials {wall:.1f} s)")
    report_first_metric(trials, workdir)
    report_gaps(trials, workdir, busy_host)
    print(f"  slot utilisation, driver view: {busy_driver / (slots * wall):.1%}")
    print(f"  slot utilisation, host view (trainer process alive): {busy_host / (slots * wall):.1%}")
    sync = out.get("sync") or {}
    if sync:
        print(
            f"  study DB pushes: {sync['pushes']} in {sync['push_s']:.2f} s "
            f"({sync['push_s'] / max(1, sync['pushes']) * 1000:.0f} ms each)"
        )
    print(f"  target >= 90% utilisation: {'met' if busy_host / (slots * wall) >= 0.9 else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--steps", type=int, default=65536, help="total-steps per trial (65536: ~15 s on 2 cores)")
    parser.add_argument("--local", action="store_true", help="the local host instead of the loopback sshd")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-optimize-"))
    try:
        out, workdir, t0, command_s, server = run_study(args, root)
        try:
            report(args, out, workdir, t0, command_s)
        finally:
            stop_server(server)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
