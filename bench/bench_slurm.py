"""A Slurm cluster as a host: submit to RUNNING, against a hand-written sbatch, and what following costs
the login node.

    .venv/bin/python bench/bench_slurm.py [--repeat 3] [--window 60]

Runs as root on this machine (the tests' setup: tests/slurm_cluster.py's one-node cluster on loopback,
the login node a private sshd with SLURM_CONF, a new git project). Two measurements:

1. `thrust-remote train hello --detach` (a `command:` job that prints a line) from the command's start
   to the job's first line in its run's log, against `sbatch --parsable --wrap CMD` of the same command
   typed on the login node (over `ssh`, as a user would: one ssh + sbatch) to the first line of its
   output file. thrust-remote's is sync, preflight, the venv check and the launch before the sbatch.
2. Scheduler calls while following five runs: five gated runs submitted, five `logs --follow` and one
   `wait` of all five running at once for `--window` seconds; every squeue the account's agents make
   rewrites `.thrust/slurm/squeue.json` with a new `at`, which is sampled every 0.1 s: the calls seen,
   the shortest gap between two, and the rate (60 s / the mean gap).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import conftest  # noqa: E402 - the tests' sshd, made here the same way
import slurm_cluster  # noqa: E402
from helpers import new_project, remote_tempdir  # noqa: E402

EXE = str(Path(sys.executable).parent / "thrust-remote")
GATED = "command: [sh, -c, 'while [ ! -e \"$THRUST_RUN_DIR/go\" ]; do sleep 0.2; done']"


def _first_line(path: Path, timeout: float = 60) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return time.monotonic()
        time.sleep(0.01)
    raise TimeoutError(path)


def submit_to_running(proj: Path, workdir: Path, login: conftest.SSHServer, repeat: int) -> dict:
    ours, theirs = [], []
    env = {**os.environ, "COLUMNS": "200"}
    for _ in range(repeat):
        t0 = time.monotonic()
        done = subprocess.run([EXE, "train", "hello", "--detach"], cwd=proj, capture_output=True, text=True, env=env)
        run_id = done.stderr.split("launching run ")[1].split()[0]
        ours.append(_first_line(workdir / ".thrust" / "runs" / run_id / "log") - t0)
        out = remote_tempdir(login) / "out.txt"
        t0 = time.monotonic()
        subprocess.run(["ssh", "-p", str(login.port), "-i", str(login.client_key), "-o",
                        f"UserKnownHostsFile={login.known_hosts}", "-o", "BatchMode=yes",
                        f"{login.user}@{login.ip}", "sbatch", "--parsable", f"--output={out}",
                        "--wrap", "'echo hello from slurm'"], check=True, capture_output=True)
        theirs.append(_first_line(out) - t0)
    return {"thrust_remote_s": ours, "hand_sbatch_s": theirs,
            "median": {"thrust-remote": statistics.median(ours), "sbatch": statistics.median(theirs)}}


def calls_while_following(proj: Path, workdir: Path, window: float) -> dict:
    env = {**os.environ, "COLUMNS": "200"}
    runs = []
    for _ in range(5):
        done = subprocess.run([EXE, "train", "gated", "--detach"], cwd=proj, capture_output=True, text=True, env=env)
        runs.append(done.stderr.split("launching run ")[1].split()[0])
    followers = [subprocess.Popen([EXE, "logs", r, "--follow"], cwd=proj, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, env=env) for r in runs]
    followers.append(subprocess.Popen([EXE, "wait", *runs], cwd=proj, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=env))
    kept = workdir / ".thrust" / "slurm" / "squeue.json"
    seen: set[float] = set()
    end = time.monotonic() + window
    while time.monotonic() < end:
        with contextlib.suppress(OSError, ValueError, KeyError):  # not written yet, or mid-rename
            seen.add(json.loads(kept.read_text())["at"])
        time.sleep(0.1)
    for r in runs:
        (workdir / ".thrust" / "runs" / r / "go").touch()
    for p in followers:
        p.wait(timeout=120)
    ats = sorted(seen)
    gaps = [b - a for a, b in zip(ats, ats[1:], strict=False)]
    return {"window_s": window, "squeue_calls": len(seen), "followers": len(followers),
            "min_gap_s": round(min(gaps), 2) if gaps else None,
            "per_minute": round(60 / statistics.mean(gaps), 2) if gaps else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=float, default=60.0)
    args = parser.parse_args()
    conftest._layer_of_running_test[:] = ["e2e"]  # the sshd guard is the test layers'
    root = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    cluster = slurm_cluster.start(root / "cluster")
    login = conftest._start_sshd(root / "login", extra_config=f"SetEnv SLURM_CONF={cluster.conf}\n")
    try:
        workdir = remote_tempdir(login) / "hpc"
        proj = new_project(root / "project", login, workdir,
                           jobs=f"jobs:\n  hello:\n    command: [echo, hello from slurm]\n  gated:\n    {GATED}\n")
        text = (proj / "thrust.yaml").read_text()
        (proj / "thrust.yaml").write_text(text.replace("    connect_timeout: 5\n",
                                                       "    connect_timeout: 5\n    scheduler: slurm\n"))
        subprocess.run([EXE, "train", "hello", "--detach"], cwd=proj, capture_output=True, check=True)  # warm
        print(json.dumps({"submit_to_running": submit_to_running(proj, workdir, login, args.repeat),
                          "following_five": calls_while_following(proj, workdir, args.window)}, indent=1))
    finally:
        login.stop()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
