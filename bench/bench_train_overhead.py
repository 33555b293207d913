"""Overhead of `thrust-remote train` outside training, on a loopback sshd: sync + preflight + setup
(skipped: second run) + launch, and the fetch of a finished run's model. Target: <= 3 s together.

    .venv/bin/python bench/bench_train_overhead.py [--repeat 5]

Prints a table of medians per stage. The "laptop" is a clone of this repo; the "host" a directory
reached only through SSH, as in the tests. Each round is one `lifecycle.train` (the function the CLI
calls), following the run's log to its end with a silent reporter; training time is not counted.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from conftest import _start_sshd  # noqa: E402

from thrust_remote.core.config import load_config  # noqa: E402
from thrust_remote.host.session import HostSession  # noqa: E402
from thrust_remote.host.ssh import SSHRunner  # noqa: E402
from thrust_remote.run import lifecycle, pipeline  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-train-"))
    server = _start_sshd(root / "sshd")
    try:
        project = root / "project"
        subprocess.run(["git", "clone", "-q", str(REPO), str(project)], check=True)
        subprocess.run(["git", "-C", str(project), "remote", "remove", "origin"], check=True)
        server.thrust_yaml(project / "thrust.yaml", workdir=str(root / "host" / "thrust"))
        config = load_config(project / "thrust.yaml", environ={})
        host = config.host("sandbox")
        job = config.job("cartpole")
        request = pipeline.TrainRequest(job=job, host=host, sets=["total-steps=3000", "target-return=0"])
        rows: dict[str, list[float]] = {}
        for i in range(args.repeat + 1):  # the first round pays the one-time sync/setup: not counted
            runner = SSHRunner.from_host(host)
            t0 = time.monotonic()
            runner.run(["true"])
            connect = time.monotonic() - t0
            outcome = lifecycle.train(config, request, [HostSession.open(runner, host, config)])
            runner.close()
            if outcome.exit_code != 0:
                raise SystemExit(f"the run ended {outcome.status}")
            if i == 0:
                continue
            timings = {"connect": connect, **outcome.timings}
            timings["total"] = sum(timings.values())
            for k, v in timings.items():
                rows.setdefault(k, []).append(v)
        print(f"train overhead on loopback sshd (medians of {args.repeat}; setup skipped; host python = venv)")
        print(f"{'stage':<10} {'median s':>9} {'min s':>7}")
        for k, vals in rows.items():
            print(f"{k:<10} {statistics.median(vals):>9.3f} {min(vals):>7.3f}")
        total = statistics.median(rows["total"])
        print(f"target <= 3 s outside training: {'met' if total <= 3 else 'NOT met'} ({total:.2f} s)")
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
