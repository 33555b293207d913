"""Uploading many small files (what a sync sends for Git LFS objects): thrust-remote's streamed
`put_many` vs one verified `put` per file vs `rsync -a -e ssh` and `scp -r`, side by side.

    .venv/bin/python bench/bench_put_many.py [--files 1000] [--repeat 3]

On a private loopback sshd (tests/conftest.py's), FILES small files (1-4 KB, in 20 directories) go
from a local directory to a fresh directory on the "host" each round, every method in turn (the order
rotates each round). Each of ours opens its own connection, as a command does. Every host tree is
checked against the local one. Medians (and all rounds) are printed, with ratios to rsync.
"""

from __future__ import annotations

import argparse
import hashlib
import os
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
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from bench_fetch_dir import ssh_command, tree  # noqa: E402
from conftest import SSHServer, _start_sshd  # noqa: E402


def make_files(root: Path, files: int) -> list[Path]:
    out = []
    for i in range(files):
        path = root / f"d{i % 20:02d}" / f"obj{i:05d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1024 + (i * 37) % 3072))
        out.append(path)
    return out


def methods(server: SSHServer, src: Path, files: list[Path]) -> dict[str, Callable[[Path], None]]:
    def ours(many: bool) -> Callable[[Path], None]:
        def run(dest: Path) -> None:
            runner = server.runner()
            try:
                items = [(f, str(dest / f.relative_to(src))) for f in files]
                if many:
                    runner.put_many(items)
                else:
                    for local, remote in items:
                        runner.put(local, remote)
            finally:
                runner.close()
        return run

    def command(argv: Callable[[Path], list[str]]) -> Callable[[Path], None]:
        return lambda dest: subprocess.run(argv(dest), check=True, capture_output=True)

    ssh = ssh_command(server)
    scp = ["scp", "-q", "-r", *ssh.split()[1:]]
    scp[scp.index("-p")] = "-P"  # scp's port flag
    return {
        "thrust-remote put_many (streamed)": ours(True),
        "thrust-remote put, one by one": ours(False),
        "rsync -a -e ssh": command(lambda d: ["rsync", "-a", "-e", ssh, f"{src}/", f"{server.user}@127.0.0.1:{d}/"]),
        "scp -r": command(lambda d: [*scp, str(src), f"{server.user}@127.0.0.1:{d}"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="thrust-bench-putmany-"))
    server = _start_sshd(root / "sshd")
    try:
        src = root / "local" / "objects"
        files = make_files(src, args.files)
        want = tree(src)
        host = root / "sshd" / "remote-home" / "put"
        ways = methods(server, src, files)
        times: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(args.repeat):
            order = list(ways)[r % len(ways):] + list(ways)[:r % len(ways)]
            for name in order:
                dest = host / f"{r}-{list(ways).index(name)}"
                dest.mkdir(parents=True)
                started = time.perf_counter()
                ways[name](dest)
                times[name].append(time.perf_counter() - started)
                got = dest / src.name if name == "scp -r" else dest
                assert tree(got) == want, f"{name}: the host's tree differs"
                shutil.rmtree(dest)
        load = os.getloadavg()[0]
        print(f"{args.files} files of 1-4 KB in 20 dirs, laptop -> loopback sshd; {args.repeat} rounds, "
              f"median s (all rounds); load avg {load:.2f}")
        rsync = statistics.median(times["rsync -a -e ssh"])
        for name, vals in times.items():
            med = statistics.median(vals)
            print(f"  {name:<36} {med:6.2f} ({' '.join(f'{v:.2f}' for v in vals)})   {med / rsync:5.2f}x rsync")
        print("sha256 of every host file checked against the local one:",
              hashlib.sha256(repr(sorted(want.items())).encode()).hexdigest()[:12])
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
