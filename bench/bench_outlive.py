"""Runs that outlive their host: what pulls cost a run, how long a lost host takes to be replaced, and
what a checkpoint pull moves, each against a named peer run side by side.

    .venv/bin/python bench/bench_outlive.py [--repeat 3] [--steps 300000]

Two loopback sshd "hosts" (tests/conftest.py's), a new project (not this repository) whose job is the
built-in trainer on CartPole with a checkpoint every 2 s (the trainer's default is 120 s: this is 60x
more pulling than a real run sees).

1. Training steps/s of `train cp --sync-every 10` vs `--sync-every 0` (and a harsher `--sync-every 2`),
   interleaved, `--repeat` rounds: the trainer's own steps / train_wall_s from `train --json`.
2. Host loss to the resumed run's first step: `train cp --host a` with the job's `retry: {max: 1, hosts:
   [b], grace: 0}` (the default grace, 60 s of asking the silent host again, comes on top), `--sync-every 2`,
   followed; host a's sshd and everything it started killed once a checkpoint
   was pulled; the clock runs from the kill to the first metrics line of the run resumed on b. The
   peer: `train cp --host b --detach` of the same job, warm, from its start to its first metrics line
   (what starting a run there costs at best).
3. A checkpoint pull: bytes moved per pull (a new checkpoint; an unchanged one), and the time of
   `fetch RUN` bringing a new checkpoint vs `scp` of the same file.
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
EXE = str(Path(sys.executable).parent / "thrust-remote")
sys.path.insert(0, str(REPO / "tests"))

from conftest import SSHServer, _start_sshd  # noqa: E402

ARGS = "{env: cartpole, num-envs: 8, target-return: 0, checkpoint-interval: 2, log-interval: 0.5}"


def _entry(server: SSHServer, name: str, workdir: Path) -> str:
    hc = server.host_config(name)
    return (f"  {name}:\n    address: {hc.address}\n    workdir: {workdir}\n    python: {hc.python}\n"
            f"    identity: {hc.identity}\n    known_hosts: {hc.known_hosts}\n    connect_timeout: 5\n")


def _project(path: Path, a: SSHServer, b: SSHServer, a_work: Path, b_work: Path) -> Path:
    project = path / "project"
    project.mkdir(parents=True)
    (project / "thrust.yaml").write_text(
        "default_host: a\nhosts:\n" + _entry(a, "a", a_work) + _entry(b, "b", b_work)
        + f"jobs:\n  cp:\n    args: {ARGS}\n    retry: {{max: 1, hosts: [b], grace: 0}}\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=project, check=True)
    return project


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "THRUST_CONFIG")}
    return env | {"NO_COLOR": "1", "COLUMNS": "200"}


def _cli(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, *args], cwd=project, env=_env(), capture_output=True, text=True, check=False)


def steps_per_s(project: Path, repeat: int, steps: int) -> tuple[dict[str, list[float]], list[float]]:
    """Each setting's steps/s, in an order reversed every other round (this VM's speed drifts by tens
    of percent over minutes: a fixed order would charge the drift to one setting); and the wall time of
    each run's last pull."""
    rows: dict[str, list[float]] = {"--sync-every 0 (off)": [], "--sync-every 10": [], "--sync-every 2": []}
    pulls: list[float] = []
    _cli(project, "train", "cp", "--host", "b", "--set", "total-steps=20000")  # set up: not counted
    for i in range(repeat):
        for name in (list(rows) if i % 2 == 0 else list(reversed(rows))):
            every = name.split()[1]
            out = _cli(project, "train", "cp", "--host", "b", "--sync-every", every, "--json", "--set",
                       f"total-steps={steps}")
            if out.returncode != 0:
                raise SystemExit(f"train failed: {out.stderr[-2000:]}")
            got = json.loads(out.stdout)
            rows[name].append(got["steps"] / got["train_wall_s"])
            if got.get("last_pull"):
                pulls.append(got["last_pull"]["seconds"])
    return rows, pulls


def _first_metrics(runs: Path, skip: set[str], deadline: float, log: Path | None = None) -> tuple[str, float]:
    """The first run dir under `runs` not in `skip` with a metrics line: (its id, when it was seen)."""
    while time.monotonic() < deadline:
        for run in runs.glob("*/metrics.jsonl") if runs.is_dir() else ():
            if run.parent.name not in skip and run.stat().st_size > 0:
                return run.parent.name, time.monotonic()
        time.sleep(0.01)
    said = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise SystemExit(f"no resumed run's first metrics line within the deadline\n{said}")


def host_loss(root: Path, repeat: int) -> tuple[list[float], list[float]]:
    lost, fresh = [], []
    b = _start_sshd(root / "b")
    runs_b = root / "b-work" / ".thrust" / "runs"
    try:
        for i in range(repeat):
            a = _start_sshd(root / f"a{i}")
            project = _project(root / f"round{i}", a, b, root / f"a{i}-work", root / "b-work")
            _cli(project, "train", "cp", "--host", "b", "--set", "total-steps=2000")  # b set up: warm
            seen = {p.name for p in runs_b.iterdir()} if runs_b.is_dir() else set()
            t0 = time.monotonic()
            started = _cli(project, "train", "cp", "--host", "b", "--detach", "--set", "total-steps=100000")
            if started.returncode != 0:
                raise SystemExit(started.stderr)
            run, at = _first_metrics(runs_b, seen, time.monotonic() + 120)
            fresh.append(at - t0)
            seen.add(run)
            _cli(project, "stop", run, "--host", "b")
            record = project / ".thrust" / "fetched"
            before = {p.parent.name for p in record.glob("*/checkpoints.json")}  # the warm-up's, on b
            follow = subprocess.Popen([EXE, "train", "cp", "--host", "a", "--sync-every", "2", "--set",
                                       "total-steps=400000"], cwd=project, env=_env(), stdout=subprocess.DEVNULL,
                                      stderr=open(root / f"follow{i}.log", "w"))  # noqa: SIM115
            deadline = time.monotonic() + 240
            while not ({p.parent.name for p in record.glob("*/checkpoints.json")} - before) and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            t0 = time.monotonic()
            a.stop()
            run, at = _first_metrics(runs_b, seen, time.monotonic() + 240, root / f"follow{i}.log")
            lost.append(at - t0)
            _cli(project, "stop", run, "--host", "b")
            follow.wait(120)
    finally:
        os.killpg(b.wrapper.pid, signal.SIGKILL)
    return lost, fresh


def pull_cost(root: Path, repeat: int) -> dict[str, list[float]]:
    a = _start_sshd(root / "pull-a")
    b = _start_sshd(root / "pull-b")
    out: dict[str, list[float]] = {"fetch RUN (new checkpoint)": [], "scp of the same file": [],
                                   "bytes per new checkpoint": [], "bytes when unchanged": []}
    try:
        project = _project(root / "pull", a, b, root / "a-work", root / "pull-b-work")
        run = json.loads(_cli(project, "train", "cp", "--detach", "--json", "--set", "total-steps=50000000").stdout
                         )["run_id"]
        ckpts = root / "a-work" / ".thrust" / "runs" / run / "checkpoints"
        ssh = ["-i", str(a.client_key), "-o", f"UserKnownHostsFile={a.known_hosts}", "-o", "StrictHostKeyChecking=yes",
               "-P", str(a.port)]
        last = None
        for _ in range(repeat):
            while True:  # a checkpoint newer than the last one pulled
                names = sorted(p.name for p in ckpts.glob("ckpt-*.pt")) if ckpts.is_dir() else []
                if names and names[-1] != last:
                    break
                time.sleep(0.05)
            t0 = time.monotonic()
            got = json.loads(_cli(project, "fetch", run, "--json").stdout)["checkpoint"]
            out["fetch RUN (new checkpoint)"].append(time.monotonic() - t0)
            out["bytes per new checkpoint"].append(float(got["bytes"]))
            last = got["newest"]
            again = json.loads(_cli(project, "fetch", run, "--json").stdout)["checkpoint"]
            if again["newest"] == last:
                out["bytes when unchanged"].append(float(again["bytes"]))
            dest = root / "scp-copy.pt"
            t0 = time.monotonic()
            subprocess.run(["scp", "-q", *ssh, f"{a.user}@{a.ip}:{ckpts / last}", str(dest)], check=True)
            out["scp of the same file"].append(time.monotonic() - t0)
        _cli(project, "stop", run)
    finally:
        for server in (a, b):
            os.killpg(server.wrapper.pid, signal.SIGKILL)
    return out


def part_1(root: Path, args: argparse.Namespace) -> None:
    a, b = _start_sshd(root / "sps-a"), _start_sshd(root / "sps-b")
    try:
        rows, pulls = steps_per_s(_project(root / "sps", a, b, root / "sps-a-work", root / "sps-b-work"),
                                  args.repeat, args.steps)
    finally:
        for server in (a, b):
            os.killpg(server.wrapper.pid, signal.SIGKILL)
    off = statistics.median(rows["--sync-every 0 (off)"])
    print(f"1. training steps/s, cartpole {args.steps:,} steps on loopback host b, a checkpoint every 2 s, "
          f"medians of {args.repeat} rounds (order reversed every other round)")
    for name, vals in rows.items():
        print(f"  {name:<22} {statistics.median(vals):9,.0f} steps/s  (min {min(vals):,.0f}, max {max(vals):,.0f})"
              f"  {statistics.median(vals) / off:5.3f}x off")
    if pulls:
        print(f"  one pull while training (wall): median {statistics.median(pulls) * 1000:.0f} ms, max "
              f"{max(pulls) * 1000:.0f} ms, over {len(pulls)} runs")


def part_2(root: Path, args: argparse.Namespace) -> None:
    lost, fresh = host_loss(root, args.repeat)
    print(f"2. host a killed -> the run resumed on b logs its first metrics (medians of {args.repeat})")
    print(f"  retry (host loss to first step)   {statistics.median(lost):6.2f} s  (min {min(lost):.2f})")
    print(f"  peer: train --detach on b, warm   {statistics.median(fresh):6.2f} s  (min {min(fresh):.2f})  "
          f"ratio {statistics.median(lost) / statistics.median(fresh):.2f}x")


def part_3(root: Path, args: argparse.Namespace) -> None:
    cost = pull_cost(root, args.repeat)
    print(f"3. one checkpoint pull (medians of {args.repeat})")
    for name, vals in cost.items():
        unit = "bytes" if name.startswith("bytes") else "s"
        print(f"  {name:<30} {statistics.median(vals):12,.3f} {unit}" if unit == "s" else
              f"  {name:<30} {statistics.median(vals):12,.0f} {unit}")
    scp = statistics.median(cost["scp of the same file"])
    print(f"  fetch / scp: {statistics.median(cost['fetch RUN (new checkpoint)']) / scp:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--parts", default="123", help="which of the three to measure, e.g. 23")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-outlive-"))
    try:
        if "1" in args.parts:
            part_1(root, args)
        if "2" in args.parts:
            part_2(root, args)
        if "3" in args.parts:
            part_3(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
