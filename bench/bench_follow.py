"""Following a run's log against copying it: MB/s of `logs RUN --follow` (piped, and to a terminal, with
and without a job's `metrics: {pattern:}`) beside `logs RUN` (a plain copy) and `ssh HOST cat LOG`, on
the same log in one run (issue 51, item 16).

    .venv/bin/python bench/bench_follow.py [--repeat 3] [--lines 2000000] [--wide-mb 256]

One loopback sshd host (tests/conftest.py's), a new project whose jobs print `--lines` lines of
`iter N: loss 0.5000` as fast as `seq` goes (~51 MB for 2,000,000), one of them read by a pattern; each
run is followed once to its end while it runs (`train`, piped), then its ended log is read whole by
every reader in turn, `--repeat` rounds, order reversed every other round. Each figure is the log's
size over the command's wall time (its start included, as a user waits for it: ~0.5-1 s of it is the
CLI's own start and connection, the same for `logs`). A terminal is a pty whose other end is read and
dropped by this script: on a small machine the pty itself is the limit, so `cat` of the same file and
`logs` to the same pty are its peers there. Last, a log of one line of `--wide-mb` MiB: how long a
follow takes to say the run ended.
"""

from __future__ import annotations

import argparse
import os
import platform
import pty
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXE = str(Path(sys.executable).parent / "thrust-remote")
sys.path.insert(0, str(REPO / "tests"))

from conftest import SSHServer, _start_sshd  # noqa: E402

from thrust_remote.agent.protocol import LOG  # noqa: E402

PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"


def _env() -> dict[str, str]:
    # an installed package has its .pyc files: a benchmark times what a user runs
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "THRUST_CONFIG")}
    return env | {"NO_COLOR": "1", "COLUMNS": "120"}


def _project(root: Path, server: SSHServer, workdir: Path, lines: int, wide_mb: int) -> Path:
    project = root / "project"
    project.mkdir(parents=True)
    seq = f"seq -f 'iter %.0f: loss 0.5000' 0 {lines - 1}"
    jobs = (f"jobs:\n  plain:\n    command: [sh, -c, \"{seq}\"]\n"
            f"  counted:\n    command: [sh, -c, \"{seq}\"]\n    metrics: {{pattern: '{PATTERN}'}}\n"
            f"  wide:\n    command: [sh, -c, \"head -c {wide_mb << 20} /dev/zero | tr '\\\\0' x; echo\"]\n")
    server.thrust_yaml(project / "thrust.yaml", workdir=str(workdir), rest=jobs)
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.email=b@b", "-c", "user.name=b", "commit", "-qm", "x"]):
        subprocess.run(["git", *args], cwd=project, check=True)
    return project


def _timed(argv: list[str], cwd: Path, *, tty: bool = False) -> tuple[float, int]:
    """(wall seconds, exit code) of a command whose output is dropped: a pipe read to its end, or a pty."""
    started = time.monotonic()
    if not tty:
        with tempfile.TemporaryFile() as err, \
                subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=err) as proc:
            assert proc.stdout is not None
            while proc.stdout.read(1 << 20):
                pass
            proc.wait()
            if proc.returncode != 0:
                err.seek(0)
                sys.stderr.write(err.read().decode("utf-8", "replace")[-2000:])
        return time.monotonic() - started, proc.returncode
    master, slave = pty.openpty()
    os.set_blocking(master, True)
    proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)

    def drain() -> None:
        try:
            while os.read(master, 1 << 20):
                pass
        except OSError:  # EIO: the pty's last writer closed
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    proc.wait()
    reader.join(30)
    os.close(master)
    return time.monotonic() - started, proc.returncode


def _run_id(project: Path, job: str) -> tuple[str, float]:
    """A run of `job` followed while it runs (`train`, piped): its id and that follow's wall time."""
    started = time.monotonic()
    done = subprocess.run([EXE, "train", job, "--no-fetch", "--json"], cwd=project, env=_env(), capture_output=True,
                          text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"train {job} failed ({done.returncode}): {done.stderr[-2000:]}")
    import json

    return json.loads(done.stdout)["run_id"], wall


def _readers(server: SSHServer, project: Path, run_id: str, log: Path) -> dict[str, list[str] | tuple]:
    hc = server.host_config()
    ssh = ["ssh", "-i", hc.identity, "-p", str(server.port), "-o", f"UserKnownHostsFile={hc.known_hosts}",
           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{server.user}@127.0.0.1", "cat", str(log)]
    follow = [EXE, "logs", run_id, "--follow", "--no-fetch"]
    return {"ssh cat LOG": ssh, "logs RUN": [EXE, "logs", run_id], "logs RUN --follow, piped": follow,
            "cat LOG (here), terminal": ("tty", ["cat", str(log)]),
            "logs RUN, terminal": ("tty", [EXE, "logs", run_id]),
            "logs RUN --follow, terminal": ("tty", follow)}


def _round(server: SSHServer, project: Path, runs: dict[str, tuple[str, Path]], repeat: int) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {}
    for i in range(repeat):
        for job, (run_id, log) in runs.items():
            readers = list(_readers(server, project, run_id, log).items())
            for name, argv in (readers if i % 2 == 0 else list(reversed(readers))):
                tty = isinstance(argv, tuple)
                wall, code = _timed(list(argv[1] if tty else argv), project, tty=tty)
                if code != 0:
                    raise SystemExit(f"{name} of {job} exited {code}")
                key = f"{name}{' (pattern)' if job == 'counted' else ''}"
                if job == "counted" and "--follow" not in name:
                    continue  # the same bytes as plain's: a pattern changes nothing for a copy
                rows.setdefault(key, []).append(log.stat().st_size / wall / 1e6)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lines", type=int, default=2_000_000)
    parser.add_argument("--wide-mb", type=int, default=256)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    server = _start_sshd(root / "sshd")
    try:
        workdir = Path(tempfile.mkdtemp(prefix="remote-", dir=server.root / "remote-home"))
        project = _project(root, server, workdir, args.lines, args.wide_mb)
        subprocess.run([EXE, "train", "plain", "--no-fetch"], cwd=project, env=_env(), capture_output=True,
                       check=False)  # set up and warm: not counted
        runs, live = {}, {}
        for job in ("plain", "counted"):
            run_id, wall = _run_id(project, job)
            log = workdir / ".thrust" / "runs" / run_id / LOG
            runs[job], live[job] = (run_id, log), log.stat().st_size / wall / 1e6
        size = runs["plain"][1].stat().st_size
        print(f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}; "
              f"log: {args.lines:,} lines, {size / 1e6:.1f} MB; repeat {args.repeat}")
        print(f"  train JOB (piped, followed while it runs, set-up and launch included): "
              f"{live['plain']:.1f} MB/s; with the pattern {live['counted']:.1f} MB/s")
        for name, values in _round(server, project, runs, args.repeat).items():
            print(f"  {name:40s} median {statistics.median(values):7.1f} MB/s  "
                  f"(min {min(values):.1f}, max {max(values):.1f})")
        if args.wide_mb <= 0:
            return
        wide_id, wall = _run_id(project, "wide")
        print(f"  one line of {args.wide_mb} MiB: train (piped) ends in {wall:.1f} s")
        for tty in (False, True):
            took, code = _timed([EXE, "logs", wide_id, "--follow", "--no-fetch"], project, tty=tty)
            print(f"  one line of {args.wide_mb} MiB: logs --follow ({'terminal' if tty else 'piped'}) ends in "
                  f"{took:.1f} s (exit {code})")
        took, code = _timed([EXE, "logs", wide_id], project)
        print(f"  one line of {args.wide_mb} MiB: logs (a copy) ends in {took:.1f} s (exit {code})")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
