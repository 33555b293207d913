"""`thrust-remote doctor` over SSH, warm, vs the one-line check a user types by hand, side by side on a
loopback sshd.

    .venv/bin/python bench/bench_doctor.py [--repeat 5]

Each round, interleaved so that load from elsewhere hits every method alike:

- `doctor` as a user types it (the CLI: a fresh process and connection), where the host kept a passing
  torch probe (the default after a first doctor: reused while nothing it depends on changed);
- `doctor --fresh` (imports torch on the host again, as every doctor did before the probe was kept);
- by hand: `ssh -p PORT host 'PYTHON -c "import torch; print(torch.__version__, torch.cuda.is_available())"'`:
  one of doctor's 24 checks, the one that costs.

A warm-up round is not counted. Medians are printed with the ratio to the hand check. Run as root, it
measures again as an account without rc files (bench_resubmit.as_each_account).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXE = str(Path(sys.executable).parent / "thrust-remote")
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "bench"))

from bench_resubmit import as_each_account, report, ssh_argv  # noqa: E402
from conftest import SSHServer, _start_sshd  # noqa: E402

HAND_CHECK = "import torch; print(torch.__version__, torch.cuda.is_available())"


def _timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    t0 = time.monotonic()
    out = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if out.returncode not in (0, 1):  # 1: a check failed, which is a report all the same
        raise SystemExit(f"{shlex.join(argv)} failed ({out.returncode}): {out.stderr[-500:]}")
    return took


def measure(server: SSHServer, project: Path, workdir: Path, repeat: int) -> dict[str, list[float]]:
    project.mkdir(parents=True, exist_ok=True)
    server.thrust_yaml(project / "thrust.yaml", workdir=str(workdir))
    # as an installed CLI runs: with its .pyc files (bench_resubmit.measure says why)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"NO_COLOR": "1"}
    ssh = [*ssh_argv(server), shlex.join([sys.executable, "-c", HAND_CHECK])]
    methods = {"doctor (kept probe)": [EXE, "doctor"], "doctor --fresh": [EXE, "doctor", "--fresh"], "by hand": ssh}
    rows: dict[str, list[float]] = {name: [] for name in methods}
    for i in range(repeat + 1):
        for name, argv in methods.items():
            took = _timed(argv, project, env)
            if i:
                rows[name].append(took)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-doctor-"))
    server = _start_sshd(root / "sshd")
    try:
        as_each_account(server, root, lambda srv, workdir, who: report(
            f"doctor on loopback sshd as {who}, medians of {args.repeat} interleaved rounds",
            measure(srv, root / f"project-{srv.user}", workdir, args.repeat), "the hand check"))
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
