"""Fetching a TensorBoard-like directory of many small files: thrust-remote vs `rsync -e ssh`, side by side.

    .venv/bin/python bench/bench_fetch_dir.py [--files 1000] [--changed 10] [--repeat 3]

On a private loopback sshd (tests/conftest.py's), the host has a run whose cwd holds `runs/tb/` with
FILES small files (1-4 KB, in 20 subdirectories). Each round, interleaved so that load from other
processes hits every method alike:

- first fetch into an empty local dir: thrust-remote's artifacts fetch (`artifacts.fetch_artifacts`:
  a fresh SSH connection, agent `list-files` with a sha256 of every file on the host, one verified
  `get` per file), `rsync -a -e ssh` (its quick check: size + mtime), and `rsync -a -c -e ssh`
  (checksums, the closest to ours);
- then CHANGED files are appended to on the host, and each method fetches again (incremental).

Every local tree is checked against the host's after each fetch. Medians (and all rounds) are
printed, with the files each method transferred, and the ratios of the medians, ours / each rsync.
"""

from __future__ import annotations

import argparse
import hashlib
import json
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

from thrust_remote.fetch import artifacts  # noqa: E402
from thrust_remote.host.session import HostSession  # noqa: E402

RUN_ID = "bench-20261123-000000-1"
GLOB = "runs/tb/**"


def ssh_command(server: SSHServer) -> str:
    opts = ["-F", "/dev/null", "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(server.client_key), "-p", str(server.port)]
    return shlex.join(["ssh", *opts])


def make_host_dir(workdir: Path, files: int) -> Path:
    """workdir/runs/tb with `files` small files, and a run dir whose run.json names workdir as its cwd."""
    tb = workdir / "runs" / "tb"
    for i in range(files):
        sub = tb / f"run{i % 20:02d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"events.out.tfevents.{i:05d}").write_bytes(os.urandom(1024 + (i * 37) % 3072))
    run_dir = workdir / ".thrust" / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"cwd": str(workdir)}))
    return tb


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def ours(server: SSHServer, workdir: Path, project: Path) -> Callable[[], tuple[float, int]]:
    host = server.host_config(workdir=str(workdir))

    def fetch() -> tuple[float, int]:
        started = time.perf_counter()
        runner = server.runner(workdir=str(workdir))  # a fresh connection, as each `fetch` command has
        try:
            session = HostSession.open(runner, host)
            got = artifacts.fetch_artifacts(session, session.paths.run(RUN_ID), RUN_ID, project, [GLOB])
        finally:
            runner.close()
        return time.perf_counter() - started, len(got.fetched)

    return fetch


def rsync(server: SSHServer, tb: Path, dest: Path, checksum: bool) -> Callable[[], tuple[float, int]]:
    argv = ["rsync", "-a", *(["-c"] if checksum else []), "--stats", "-e", ssh_command(server),
            f"{server.user}@127.0.0.1:{tb}/", f"{dest}/"]

    def fetch() -> tuple[float, int]:
        started = time.perf_counter()
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        seconds = time.perf_counter() - started
        line = next(x for x in out.splitlines() if x.startswith("Number of regular files transferred"))
        return seconds, int(line.split(":")[1].replace(",", ""))

    return fetch


def one_round(server: SSHServer, workdir: Path, tb: Path, scratch: Path, changed: int,
              round_no: int) -> dict[str, dict[str, tuple[float, int]]]:
    project = scratch / f"project-{round_no}"
    ours_dir = project / ".thrust" / "fetched" / RUN_ID / "artifacts" / "runs" / "tb"
    local = {"thrust-remote fetch (verified, sha256)": ours_dir,
             "rsync -a -e ssh": scratch / f"rsync-{round_no}",
             "rsync -a -c -e ssh (checksums)": scratch / f"rsyncc-{round_no}"}
    methods = {
        "thrust-remote fetch (verified, sha256)": ours(server, workdir, project),
        "rsync -a -e ssh": rsync(server, tb, local["rsync -a -e ssh"], False),
        "rsync -a -c -e ssh (checksums)": rsync(server, tb, local["rsync -a -c -e ssh (checksums)"], True),
    }
    order = list(methods)[round_no % 3:] + list(methods)[:round_no % 3]  # rotate who goes first
    out: dict[str, dict[str, tuple[float, int]]] = {name: {} for name in methods}
    for phase in ("first", "incremental"):
        if phase == "incremental":
            for i in range(changed):
                path = tb / f"run{(i * 7) % 20:02d}" / f"events.out.tfevents.{(i * 7) % 1000:05d}"
                with open(path, "ab") as fh:
                    fh.write(os.urandom(256))
        want = tree(tb)
        for name in order:
            out[name][phase] = methods[name]()
            assert tree(local[name]) == want, f"{name} {phase}: the local tree differs from the host's"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--changed", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="thrust-bench-fetchdir-"))
    server = _start_sshd(root)
    try:
        workdir = root / "remote-home" / "w"
        tb = make_host_dir(workdir, args.files)
        scratch = root / "local"
        scratch.mkdir()
        ours(server, workdir, scratch / "warm")()  # uploads the agent once, as any first command would
        rounds = [one_round(server, workdir, tb, scratch, args.changed, r) for r in range(args.repeat)]
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)
        server.wrapper.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.files} files of 1-4 KB in 20 dirs; incremental: {args.changed} of them appended to; "
          f"{args.repeat} rounds, median s (all rounds) [files transferred]; load avg {os.getloadavg()[0]:.2f}")
    print(f"{'method':42} {'first fetch':>28} {'incremental':>28}")
    for name in rounds[0]:
        cells = []
        for phase in ("first", "incremental"):
            times = [r[name][phase][0] for r in rounds]
            counts = sorted({r[name][phase][1] for r in rounds})
            cells.append(f"{statistics.median(times):6.2f} ({' '.join(f'{t:.2f}' for t in times)}) {counts}")
        print(f"{name:42} {cells[0]:>28} {cells[1]:>28}")
    def median(name: str, phase: str) -> float:
        return statistics.median(r[name][phase][0] for r in rounds)

    ours_name, *peers = rounds[0]
    for peer in peers:
        ratios = [f"{ph} {median(ours_name, ph) / median(peer, ph):.2f}x" for ph in ("first", "incremental")]
        print(f"ratio thrust-remote / {peer}: {', '.join(ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
