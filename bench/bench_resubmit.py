"""Warm resubmit: `thrust-remote train cartpole --detach` of a job already set up, vs a hand-written
one-ssh launch, side by side on a loopback sshd.

    .venv/bin/python bench/bench_resubmit.py [--repeat 7]

The "host" is a directory reached only through SSH (tests/conftest.py's sshd, logging in as this
account: its rc files run on every command, as a user's would). A first `train --detach` syncs and sets
up the job; then each round, interleaved so that load from elsewhere hits every method alike:

- `train --detach` as a user types it (the CLI, a fresh process and connection), with the agent link
  (one `agent serve` per connection: the default);
- the same with THRUST_AGENT_LINK=0 (every agent subcommand a remote command of its own: before);
- by hand: `ssh -p PORT host 'cd W && git rev-parse HEAD && (setsid nohup PYTHON ARGV >log 2>&1 &)'`
  with the argv the first run recorded: what thrust-remote's launch does, minus every check.

Each launched run is waited for before the next round (tiny runs: 2,000 steps). Medians and the
ratios to the hand launch are printed. Run as root, it measures again as an account without rc files:
a second login of the same uid (`useradd -o`, removed at the end) whose home has empty rc files, so
the python and the files are the same and only root's ~/.bashrc (pyenv init here) is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXE = str(Path(sys.executable).parent / "thrust-remote")
sys.path.insert(0, str(REPO / "tests"))

from conftest import SSHServer, _start_sshd  # noqa: E402

SETS = ["--set", "total-steps=2000", "--set", "target-return=0", "--set", "log-interval=0"]


def _train(project: Path, env: dict[str, str]) -> tuple[float, str]:
    t0 = time.monotonic()
    out = subprocess.run([EXE, "train", "cartpole", "--detach", *SETS], cwd=project, env=env,
                         capture_output=True, text=True, check=False)
    took = time.monotonic() - t0
    if out.returncode != 0:
        raise SystemExit(f"train --detach failed: {out.stderr}")
    return took, re.search(r"run (\S+) started", out.stdout).group(1)


def _wait(project: Path, env: dict[str, str], run_id: str) -> None:
    subprocess.run([EXE, "wait", run_id], cwd=project, env=env, capture_output=True, check=False)


NO_RC_USER = "thrustnorc"


def make_no_rc_account(home: Path) -> str | None:
    """A second login for this account (same uid, `useradd -o`) whose home has empty rc files: the
    same python and files, without root's ~/.bashrc (pyenv init) on every command. Root only."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return None
    remove_no_rc_account()
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(["useradd", "-o", "-u", str(os.getuid()), "-g", str(os.getgid()), "-d", str(home), "-M",
                    "-s", "/bin/bash", NO_RC_USER], check=True, capture_output=True)
    subprocess.run(["usermod", "-p", "*", NO_RC_USER], check=True, capture_output=True)  # not locked for sshd
    for rc in (".bashrc", ".profile", ".bash_logout"):
        (home / rc).write_text("")
    return NO_RC_USER


def remove_no_rc_account() -> None:
    with contextlib.suppress(KeyError):
        pwd.getpwnam(NO_RC_USER)
        subprocess.run(["userdel", "-f", NO_RC_USER], capture_output=True, check=False)


def as_each_account(server: SSHServer, root: Path, run: Callable[[SSHServer, Path, str], None]) -> None:
    """`run(server, workdir, who)` as the server's user (its rc files run), then, when root, again as a
    login of the same uid without rc files (made here and removed after)."""
    run(server, root / "host" / "thrust", f"{server.user} (its rc files run)")
    user = make_no_rc_account(root / "norc-home")
    if user is None:
        print("(not root: no account without rc files to measure)")
        return
    try:
        run(replace(server, user=user), root / "host-norc" / "thrust", f"{user}: this uid with empty rc files")
    finally:
        remove_no_rc_account()


def ssh_argv(server: SSHServer) -> list[str]:
    """OpenSSH to the server as its user, with the key and known_hosts thrust-remote uses: the peer."""
    return ["ssh", "-F", "/dev/null", "-i", str(server.client_key), "-o", f"UserKnownHostsFile={server.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-p", str(server.port), f"{server.user}@{server.ip}"]


def measure(server: SSHServer, project: Path, workdir: Path, repeat: int) -> dict[str, list[float]]:
    """`repeat` interleaved rounds of the three launches against `server` (as its `user`)."""
    server.thrust_yaml(project / "thrust.yaml", workdir=str(workdir))
    # as an installed CLI runs: with its .pyc files (an environment that turns bytecode off would time
    # the compiling of every module, ~0.4 s here, on each of our launches and not on the hand one)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"NO_COLOR": "1"}
    _took, first = _train(project, env)  # sync + setup, not counted
    _wait(project, env, first)
    meta = json.loads((workdir / ".thrust" / "runs" / first / "run.json").read_text())
    ssh = ssh_argv(server)
    rows: dict[str, list[float]] = {"train --detach (link)": [], "train --detach (no link)": [], "by hand": []}
    for i in range(repeat):
        took, run = _train(project, env)
        rows["train --detach (link)"].append(took)
        _wait(project, env, run)
        took, run = _train(project, {**env, "THRUST_AGENT_LINK": "0"})
        rows["train --detach (no link)"].append(took)
        _wait(project, env, run)
        log = workdir / f"hand-{i}.log"
        hand = (f"cd {shlex.quote(str(workdir))} && git rev-parse HEAD && "
                f"(setsid nohup {shlex.join(meta['argv'])} > {shlex.quote(str(log))} 2>&1 &)")
        t0 = time.monotonic()
        subprocess.run([*ssh, hand], capture_output=True, check=True)
        rows["by hand"].append(time.monotonic() - t0)
        deadline = time.monotonic() + 120
        while "THRUST_DONE" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.2)
    return rows


def report(title: str, rows: dict[str, list[float]], peer: str = "the hand launch") -> None:
    """Each row's median and minimum, and its ratio to the "by hand" row's median."""
    hand_median = statistics.median(rows["by hand"])
    print(title)
    for name, vals in rows.items():
        print(f"  {name:<26} {statistics.median(vals):6.3f} s  (min {min(vals):.3f})   "
              f"{statistics.median(vals) / hand_median:5.2f}x {peer}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-resubmit-"))
    server = _start_sshd(root / "sshd")
    try:
        project = root / "project"
        subprocess.run(["git", "clone", "-q", str(REPO), str(project)], check=True)
        as_each_account(server, root, lambda srv, workdir, who: report(
            f"warm resubmit on loopback sshd as {who}, medians of {args.repeat} interleaved rounds",
            measure(srv, project, workdir, args.repeat)))
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
