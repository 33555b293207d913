"""The job's venv on the host, uncached and cached: thrust-remote vs making it by hand over ssh, side by side.

    .venv/bin/python bench/bench_venv.py [--repeat 5]

On a private loopback sshd (tests/conftest.py's), the "laptop" is a fresh git project (not this
repository) with a `kind: python` job (`script: train.py`, `requirements_file: requirements.txt`);
the "host" python is a distro-like python whose site-packages has torch, numpy, onnx, onnxruntime
and tensorboard (tests/test_host_venv.py's `externally_managed_python`: PEP 668's marker, as on
Debian 12), so the requirements file names only packages the host already has and pip downloads
nothing. Each round, interleaved (who goes first rotates) so that load from other processes hits
both methods alike:

- uncached: requirements.txt gets a new comment line (committed, outside the timing), so its venv
  key is new. thrust-remote: `stages.prepare` on a fresh connection, as each `train` has (sync,
  envcheck preflight, then setup: agent `venv ensure`, which makes the venv and pip-installs the
  file); the setup stage is also shown alone. By hand: `ssh host 'PY -m venv --system-site-packages
  DIR && DIR/bin/pip install -r requirements.txt'` into a new DIR.
- cached: the same again. thrust-remote: setup is one `venv ensure --check` (the stamp); by hand:
  `ssh host 'DIR/bin/pip install -r requirements.txt'`, which pip answers "already satisfied".

Both pips get `--disable-pip-version-check` (ours always passes it), so neither waits on PyPI.
Medians, min-max and the ratios are printed.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from conftest import SSHServer, _start_sshd  # noqa: E402
from helpers import new_project  # noqa: E402
from test_host_venv import externally_managed_python  # noqa: E402

from thrust_remote.core.config import load_config  # noqa: E402
from thrust_remote.host.session import HostSession  # noqa: E402
from thrust_remote.host.ssh import SSHRunner  # noqa: E402
from thrust_remote.run import stages  # noqa: E402

# all already on the host. Not torch: by hand, ensurepip's setuptools 65.5 (python 3.11) in the new venv
# shadows the host's, and torch's `setuptools>=77.0.3` then makes pip download one (ours has no pip or
# setuptools of its own: the host's, through the .pth); that would time the network, not the venv.
REQUIREMENTS = "numpy\nonnx\nonnxruntime\ntensorboard\n"
JOB_YAML = """jobs:
  mine:
    kind: python
    script: train.py
    requirements: requirements.txt
"""
OURS_SETUP = "thrust-remote: setup stage (venv ensure)"
OURS_ALL = "thrust-remote: whole prepare (connect+sync+preflight+setup)"
PEER = "by hand: ssh host 'python -m venv ... && pip install -r'"
Timing = dict[str, float]


def ssh_argv(server: SSHServer) -> list[str]:
    return ["ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={server.known_hosts}", "-o",
            "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i",
            str(server.client_key), "-p", str(server.port), f"{server.user}@127.0.0.1"]


def ours(project: Path) -> Callable[[bool], Timing]:
    config = load_config(project / "thrust.yaml", environ={})
    job, host = config.job("mine"), config.host()

    def prepare(cached: bool) -> Timing:
        started = time.perf_counter()
        runner = SSHRunner.from_host(host)  # a fresh connection, as each `train` has
        try:
            prepared = stages.prepare(config, job, HostSession.open(runner, host, config))
        finally:
            runner.close()
        total = time.perf_counter() - started
        if prepared.setup_skipped != cached:
            raise SystemExit(f"thrust-remote: setup_skipped={prepared.setup_skipped}, expected {cached}")
        return {OURS_SETUP: prepared.timings["setup"], OURS_ALL: total}

    return prepare


def by_hand(server: SSHServer, python: Path, requirements: Path, venvs: Path) -> Callable[[bool, int], Timing]:
    def run(cached: bool, round_no: int) -> Timing:
        venv = venvs / f"r{round_no}"
        pip = shlex.join([f"{venv}/bin/pip", "install", "--disable-pip-version-check", "-r", str(requirements)])
        make = shlex.join([str(python), "-m", "venv", "--system-site-packages", str(venv)])
        started = time.perf_counter()
        proc = subprocess.run([*ssh_argv(server), pip if cached else f"{make} && {pip}"], capture_output=True,
                              text=True, check=False)
        seconds, out = time.perf_counter() - started, proc.stdout
        if proc.returncode:
            raise SystemExit(f"by hand: exit {proc.returncode}\n{out}{proc.stderr}")
        if "already satisfied" not in out or "Successfully installed" in out:
            raise SystemExit(f"by hand: pip did not find everything already there:\n{out}")
        return {PEER: seconds}

    return run


def commit_requirements(project: Path, line: str) -> None:
    (project / "requirements.txt").write_text(f"# {line}\n{REQUIREMENTS}")
    subprocess.run(["git", "-C", str(project), "commit", "-qam", line], check=True)


def one_round(project: Path, our: Callable[[bool], Timing], peer: Callable[[bool, int], Timing],
              round_no: int) -> dict[str, Timing]:
    commit_requirements(project, f"round {round_no}: a new venv key")
    methods: list[Callable[[bool], Timing]] = [our, lambda cached: peer(cached, round_no)]
    order = methods[round_no % 2:] + methods[:round_no % 2]  # rotate who goes first
    out: dict[str, Timing] = {"uncached": {}, "cached": {}}
    for phase in out:
        for method in order:
            out[phase].update(method(phase == "cached"))
    return out


def report(rounds: list[dict[str, Timing]], repeat: int) -> None:
    print(f"the job's venv on a loopback sshd: {repeat} rounds, median s [min-max]; "
          f"load avg {os.getloadavg()[0]:.2f}")
    print(f"{'method':60} {'uncached':>22} {'cached':>22}")
    med: dict[tuple[str, str], float] = {}
    for name in (OURS_SETUP, OURS_ALL, PEER):
        cells = []
        for phase in ("uncached", "cached"):
            times = [r[phase][name] for r in rounds]
            med[name, phase] = statistics.median(times)
            cells.append(f"{med[name, phase]:6.2f} [{min(times):.2f}-{max(times):.2f}]")
        print(f"{name:60} {cells[0]:>22} {cells[1]:>22}")
    for ours_name in (OURS_SETUP, OURS_ALL):
        ratios = [f"{phase} {med[ours_name, phase] / med[PEER, phase]:.2f}x" for phase in ("uncached", "cached")]
        print(f"ratio {ours_name.split(': ')[1]} / by hand: {', '.join(ratios)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="thrust-bench-venv-"))
    server = _start_sshd(root / "sshd")
    try:
        python = externally_managed_python(root / "system-python")
        remote = root / "sshd" / "remote-home"
        project = new_project(root / "project", server, remote / "thrust", python=python, jobs=JOB_YAML,
                              files={"train.py": "print('training')\n", "requirements.txt": REQUIREMENTS})
        our = ours(project)
        peer = by_hand(server, python, remote / "thrust" / "requirements.txt", root / "sshd" / "by-hand")
        # round 0 (ours first: its sync puts requirements.txt on the host) pays the agent upload, the
        # first clone and the envcheck cache: not counted
        rounds = [one_round(project, our, peer, r) for r in range(args.repeat + 1)][1:]
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)
        server.wrapper.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    report(rounds, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
