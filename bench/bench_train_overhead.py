"""Overhead of `thrust-remote train` outside training, on a loopback sshd: sync + preflight + setup
(skipped: second run) + launch, and the fetch of a finished run's model; with the agent link (one
`agent serve` per connection, the default) and without it (THRUST_AGENT_LINK=0: a command per step),
interleaved round by round. Target: <= 0.5 s together (issue 22; it was <= 3 s).

    .venv/bin/python bench/bench_train_overhead.py [--repeat 5]

Run as root, it measures again as an account without rc files (bench_resubmit's second login of the
same uid), which the issue's target is for. Prints a table of medians per stage for each. The "laptop"
is a clone of this repo; the "host" a directory reached only through SSH, as in the tests. Each round
is one `lifecycle.train` (the function the CLI calls), following the run's log to its end with a silent
reporter; training time is not counted. "connect" is the connection alone (key exchange, auth).
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

from bench_resubmit import as_each_account  # noqa: E402
from conftest import _start_sshd  # noqa: E402

from thrust_remote.core.config import load_config  # noqa: E402
from thrust_remote.host.session import LINK_SWITCH, HostSession  # noqa: E402
from thrust_remote.host.ssh import SSHRunner  # noqa: E402
from thrust_remote.run import lifecycle, vocab  # noqa: E402


def measure(server, project: Path, workdir: Path, repeat: int) -> dict[str, dict[str, list[float]]]:
    """`repeat` rounds (plus one not counted: sync and setup) of link vs no link, interleaved."""
    server.thrust_yaml(project / "thrust.yaml", workdir=str(workdir))
    config = load_config(project / "thrust.yaml", environ={})
    host = config.host("sandbox")
    job = config.job("cartpole")
    request = vocab.TrainRequest(job=job, host=host, sets=["total-steps=3000", "target-return=0"])
    modes = {"link": None, "no link": "0"}  # THRUST_AGENT_LINK: one agent per connection, or a command each
    rows: dict[str, dict[str, list[float]]] = {mode: {} for mode in modes}
    for i in range(repeat + 1):  # the first round pays the one-time sync/setup: not counted
        for mode, switch in modes.items():  # interleaved: load from elsewhere hits both alike
            os.environ.pop(LINK_SWITCH, None)
            if switch is not None:
                os.environ[LINK_SWITCH] = switch
            runner = SSHRunner.from_host(host)
            t0 = time.monotonic()
            runner.transport()  # the connection (key exchange, auth) and nothing on the host: train's first step
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
    return rows


def report(title: str, rows: dict[str, dict[str, list[float]]]) -> None:
    print(title)
    print(f"{'stage':<10} " + " ".join(f"{m + ' s':>12} {'min':>6}" for m in rows))
    for k in rows["link"]:
        print(f"{k:<10} " + " ".join(f"{statistics.median(rows[m][k]):>12.3f} {min(rows[m][k]):>6.3f}"
                                      for m in rows))
    total = statistics.median(rows["link"]["total"])
    print(f"target <= 0.5 s outside training (issue 22): {'met' if total <= 0.5 else 'NOT met'} ({total:.2f} s)")


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
        as_each_account(server, root, lambda srv, workdir, who: report(
            f"train overhead on loopback sshd as {who} (medians of {args.repeat}, interleaved; setup skipped; "
            "host python = venv)", measure(srv, project, workdir, args.repeat)))
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
