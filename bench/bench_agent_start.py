"""An agent command's start: from the zipapp vs from its unpacked, compiled copy, side by side.

    .venv/bin/python bench/bench_agent_start.py [--repeat 30]

Every remote step that is a command of its own (a run's `launch`, `status` without a link, Slurm's
steps, torchrun's trainer ranks, doctor's envcheck) starts a python on the payload. Three ways,
interleaved round by round (who goes first rotates), each a fresh process of this machine's python:

- zip: `python -S agent.zip status --run-dir X`: the same archive under a name that does not end in
  `.pyz`, so payload_start leaves it alone: every module compiled from the zip (what every start was);
- copy: `python -S agent-<sha>.pyz status --run-dir X` after its first start: the unpacked copy, read
  from its .pyc files (what every start is now);
- floor: `python -S -c pass`: python's own start, what no payload can go under.

The first start (unpacking and compiling) is shown once. CPU is the child's user+system time
(getrusage), wall the parent's clock; medians and min-max, then the ratios.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO)]

from thrust_remote.host import payload  # noqa: E402


def timed(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    agent = payload.agent()
    with tempfile.TemporaryDirectory(prefix="bench-agent-start-") as tmp:
        pyz = Path(tmp) / Path(agent.remote).name
        pyz.write_bytes(agent.data)
        plain = Path(tmp) / "agent.zip"
        plain.write_bytes(agent.data)
        run_dir = str(Path(tmp) / "no-such-run")
        ways = {
            "zip": [sys.executable, "-S", str(plain), "status", "--run-dir", run_dir],
            "copy": [sys.executable, "-S", str(pyz), "status", "--run-dir", run_dir],
            "floor": [sys.executable, "-S", "-c", "pass"],
        }
        first_cpu, first_wall = timed(ways["copy"])
        assert pyz.with_suffix("").is_dir(), "the first start made no copy"
        got: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
        names = list(ways)
        for i in range(args.repeat):
            for name in names[i % 3:] + names[:i % 3]:
                got[name].append(timed(ways[name]))
    print(f"python {sys.version.split()[0]}, {args.repeat} rounds; the first start (unpack + compile): "
          f"{first_cpu * 1000:.0f} ms CPU, {first_wall * 1000:.0f} ms wall")
    print(f"{'start':<6} {'CPU ms median (min-max)':>26} {'wall ms median (min-max)':>26}")
    med = {}
    for name, rows in got.items():
        cpu = [c * 1000 for c, _ in rows]
        wall = [w * 1000 for _, w in rows]
        med[name] = (statistics.median(cpu), statistics.median(wall))
        print(f"{name:<6} {med[name][0]:>9.0f} ({min(cpu):.0f}-{max(cpu):.0f}){'':>8} "
              f"{med[name][1]:>9.0f} ({min(wall):.0f}-{max(wall):.0f})")
    print(f"copy / zip: CPU {med['copy'][0] / med['zip'][0]:.2f}x, wall {med['copy'][1] / med['zip'][1]:.2f}x; "
          f"above the floor: zip +{med['zip'][0] - med['floor'][0]:.0f} ms CPU, "
          f"copy +{med['copy'][0] - med['floor'][0]:.0f} ms CPU")


if __name__ == "__main__":
    main()
