"""Overhead of `thrust-remote train` outside training, on a loopback sshd: sync + preflight + setup
(skipped: second run) + launch, and the fetch of a finished run's model; with the agent link (one
`agent serve` per connection, the default) and without it (THRUST_AGENT_LINK=0: a command per step),
interleaved round by round. Target: <= 0.5 s together (issue 22; it was <= 3 s).

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
from thrust_remote.host.session import LINK_SWITCH, HostSession  # noqa: E402
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
        modes = {"link": None, "no link": "0"}  # THRUST_AGENT_LINK: one agent per connection, or a command each
        rows: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
        for i in range(args.repeat + 1):  # the first round pays the one-time sync/setup: not counted
            for mode, switch in modes.items():  # interleaved: load from elsewhere hits both alike
                os.environ.pop(LINK_SWITCH, None)
                if switch is not None:
                    os.environ[LINK_SWITCH] = switch
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
                    rows[mode].setdefault(k, []).append(v)
        os.environ.pop(LINK_SWITCH, None)
        print(f"train overhead on loopback sshd (medians of {args.repeat}, interleaved; setup skipped; "
              "host python = venv)")
        print(f"{'stage':<10} " + " ".join(f"{m + ' s':>12} {'min':>6}" for m in modes))
        for k in rows["link"]:
            print(f"{k:<10} " + " ".join(f"{statistics.median(rows[m][k]):>12.3f} {min(rows[m][k]):>6.3f}"
                                          for m in modes))
        total = statistics.median(rows["link"]["total"])
        print(f"target <= 0.5 s outside training (issue 22): {'met' if total <= 0.5 else 'NOT met'} ({total:.2f} s)")
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
