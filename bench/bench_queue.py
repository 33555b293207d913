"""The host-side queue: how soon a queued run starts once its slot frees, and what waiting costs.

    .venv/bin/python bench/bench_queue.py [--repeat 10]

Host-side only (the queue needs no laptop): the agent's `launch` run here, as on a host. Each round a
holder run waits on a file; a second run is launched with `--queue` behind it; the file is touched and
the delay is from the holder's recorded end (its `exit_code`'s `ended_ts`) to the queued job's first
instruction (it prints `time.time()`). Side by side, the peer a user would write by hand on one box:
`flock LOCK CMD` (the kernel wakes the waiter when the holder's lock goes), the same job, the same end.
Then the CPU a waiting supervisor uses (utime + stime from /proc over a window) with 0 and 200 ended
runs in the workdir (it reads every run dir each look), and the idle-GPU stop's sampling cost per
sample on the supervisor's side (a stand-in nvidia-smi that prints a line: a real one costs its own
~20-50 ms of CPU per call on top, not measurable here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AGENT = [sys.executable, "-m", "thrust_remote.agent"]
TICK = os.sysconf("SC_CLK_TCK")
STAMP = [sys.executable, "-c", "import time; print(time.time(), flush=True)"]


def _launch(work: Path, run: str, argv: list[str], *extra: str) -> dict:
    out = subprocess.run([*AGENT, "launch", "--run-dir", str(work / "runs" / run), "--cwd", str(work),
                          "--lock", str(work / "launch.lock"), "--marker", f"m-{run}", *extra, "--", *argv],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _wait_file(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.01)
    raise TimeoutError(path)


def queue_delay(work: Path, i: int) -> float:
    gate = work / f"gate{i}"
    _launch(work, f"h{i}", ["sh", "-c", f'while [ ! -e {gate} ]; do sleep 0.01; done'], "--queue")
    answer = _launch(work, f"q{i}", STAMP, "--queue")
    assert answer.get("queued"), answer
    gate.touch()
    started = float(_wait_file(work / "runs" / f"q{i}" / "log").split()[0])
    ended = json.loads(_wait_file(work / "runs" / f"h{i}" / "exit_code"))["ended_ts"]
    _wait_file(work / "runs" / f"q{i}" / "exit_code")
    return started - ended


def flock_delay(work: Path, i: int) -> float:
    gate, lock, out, end = work / f"fgate{i}", work / "f.lock", work / f"f{i}.out", work / f"f{i}.end"
    holder = subprocess.Popen(["flock", str(lock), "sh", "-c",
                               f'while [ ! -e {gate} ]; do sleep 0.01; done; '
                               f'{sys.executable} -c "import time; print(time.time())" > {end}'])
    time.sleep(0.3)  # the holder has the lock before the waiter asks (a benchmark's setup, not a test)
    waiter = subprocess.Popen(["flock", str(lock), *STAMP], stdout=out.open("w"))
    gate.touch()
    holder.wait()
    waiter.wait()
    return float(out.read_text().split()[0]) - float(end.read_text().split()[0])


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _cpu_over(work: Path, run: str, window: float, gate: Path) -> float:
    """CPU seconds a run's supervisor used in `window` s; then the run is let go and waited for."""
    pid = json.loads((work / "runs" / run / "run.json").read_text())["supervisor_pid"]
    before = _cpu(pid)
    time.sleep(window)
    used = _cpu(pid) - before
    gate.touch()
    _wait_file(work / "runs" / run / "exit_code")
    return used


def waiting_cpu(work: Path, ended_runs: int, window: float) -> float:
    """CPU seconds per second of one waiting supervisor, with `ended_runs` finished runs beside it."""
    for n in range(ended_runs):
        d = work / "runs" / f"old{n:04d}"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({"run_id": d.name, "pid": 1, "gpus": []}))
        (d / "exit_code").write_text('{"exit_code": 0}')
    gate = work / "hold"
    _launch(work, "holder", ["sh", "-c", f'while [ ! -e {gate} ]; do sleep 0.5; done'], "--queue")
    _launch(work, "waiter", ["true"], "--queue")
    return _cpu_over(work, "waiter", window, gate) / window


def sampling_cpu(work: Path, window: float) -> float:
    """Supervisor CPU seconds per idle-stop sample (every 0.2 s here), nvidia-smi's own CPU aside."""
    bindir = work / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 90'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"}
    gate = work / "go"
    meta = {"gpus": [0], "gpus_used": [0], "idle_stop": {"below": 5, "minutes": 60, "every": 0.2}}
    subprocess.run([*AGENT, "launch", "--run-dir", str(work / "runs" / "s"), "--cwd", str(work),
                    "--lock", str(work / "launch.lock"), "--marker", "m-s", "--meta", json.dumps(meta), "--",
                    "sh", "-c", f'while [ ! -e {gate} ]; do sleep 0.5; done'], env=env, check=True,
                   capture_output=True)
    return _cpu_over(work, "s", window, gate) / (window / 0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    ours, peer = [], []
    with tempfile.TemporaryDirectory(prefix="bench-queue-") as tmp:
        for i in range(args.repeat):  # interleaved, so drift hits both alike
            ours.append(queue_delay(Path(tmp), i))
            peer.append(flock_delay(Path(tmp), i))
    print(f"slot free -> queued run's first instruction, {args.repeat} rounds")
    print(f"  thrust-remote queue   median {statistics.median(ours) * 1000:7.0f} ms   max {max(ours) * 1000:6.0f} ms")
    print(f"  flock LOCK CMD (peer) median {statistics.median(peer) * 1000:7.0f} ms   max {max(peer) * 1000:6.0f} ms")
    print(f"  ratio (medians)       {statistics.median(ours) / statistics.median(peer):.1f}x")
    for ended in (0, 200):
        with tempfile.TemporaryDirectory(prefix="bench-queue-") as tmp:
            share = waiting_cpu(Path(tmp), ended, args.window)
        print(f"a waiting supervisor, {ended:3d} ended runs beside it: {share * 100:.2f}% of one core")
    with tempfile.TemporaryDirectory(prefix="bench-queue-") as tmp:
        per = sampling_cpu(Path(tmp), args.window)
    print(f"idle-GPU stop, supervisor CPU per sample: {per * 1000:.1f} ms (nvidia-smi's own not counted)")


if __name__ == "__main__":
    main()
