"""One run, one tree: what a run's own tree costs, and `files:` against rsync, side by side.

    .venv/bin/python bench/bench_trees.py [--mb 50] [--files 1000] [--repeat 5]

On a private loopback sshd (tests/conftest.py's), with a session as `train` has one (its agent link
started):

1. A project of `--mb` MB of incompressible files (git objects as large), synced once. Then each round
   times a run's new tree at the other of two commits: thrust-remote's `make_tree` (agent `tree-add`: a
   worktree, the patch, the placements, one round trip) against what the workdir's shared checkout did
   before trees (`ssh host git -C W checkout --force --detach C`, the two commits in turn) and a bare
   `ssh host git -C W worktree add --detach T C` by hand. The disk a tree takes beside the store is
   printed (its files, no second copy of git objects: its `.git` is a file).
2. `files:` of `--files` small files (1-4 KB in 20 directories): the first run's (all sent, then placed
   in a tree) and an incremental one's (one file changed), against `rsync -a -e ssh` of the same
   directory, first and incremental. Each of ours opens the session's agent as a command does.

Medians (and every round) are printed, with ratios.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "bench")]

from bench_fetch_dir import ssh_command  # noqa: E402
from bench_put_many import make_files  # noqa: E402
from conftest import SSHServer, _start_sshd  # noqa: E402
from helpers import commit, git_init  # noqa: E402

from thrust_remote.host.session import HostSession  # noqa: E402
from thrust_remote.run import data  # noqa: E402
from thrust_remote.run.sync import TreeData, local_state, make_tree, sync, with_lfs  # noqa: E402
from thrust_remote.run.vocab import NullReporter  # noqa: E402


def project(root: Path, mb: int) -> tuple[Path, list[str]]:
    """A repository of `mb` MB in 256 KB files, and two commits (the second changes one file)."""
    repo = git_init(root / "project")
    for i in range(mb * 4):
        (repo / "src" / f"m{i // 50:02d}").mkdir(parents=True, exist_ok=True)
        (repo / "src" / f"m{i // 50:02d}" / f"f{i:04d}.bin").write_bytes(os.urandom(256 << 10))
    commit(repo, "first")
    first = _head(repo)
    (repo / "src" / "m00" / "f0000.bin").write_bytes(os.urandom(256 << 10))
    commit(repo, "second")
    second = _head(repo)
    return repo, [first, second]


def _head(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def du(path: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True).stdout.split()[0])


def median_line(name: str, vals: list[float], base: float) -> str:
    med = statistics.median(vals)
    return f"  {name:<52} {med:6.3f} s ({' '.join(f'{v:.3f}' for v in vals)})   {med / base:5.2f}x"


def trees(server: SSHServer, root: Path, mb: int, repeat: int) -> None:
    repo, commits = project(root, mb)
    workdir = root / "sshd" / "remote-home" / "w"
    runner = server.runner(workdir=str(workdir))
    session = HostSession.open(runner, server.host_config(workdir=str(workdir)))
    ssh = shlex.split(ssh_command(server)) + [f"{server.user}@127.0.0.1"]
    try:
        local = with_lfs(local_state(repo))
        result = sync(session, local)
        objects = du(workdir / ".git")
        subprocess.run([*ssh, shlex.join(["git", "-C", str(workdir), "checkout", "-q", "--detach", commits[0]])],
                       check=True, capture_output=True)
        times: dict[str, list[float]] = {"ours": [], "checkout": [], "worktree": []}
        sizes = []
        for r in range(repeat):
            started = time.perf_counter()
            tree = make_tree(session, local, result, session.paths.tree(f"bench-{r}"), ref=f"bench-{r}")
            times["ours"].append(time.perf_counter() - started)
            sizes.append(du(Path(tree.path)))
            target = commits[r % 2]
            started = time.perf_counter()
            subprocess.run([*ssh, shlex.join(["git", "-C", str(workdir), "checkout", "-q", "--force", "--detach",
                                              target])], check=True, capture_output=True)
            times["checkout"].append(time.perf_counter() - started)
            started = time.perf_counter()
            subprocess.run([*ssh, shlex.join(["git", "-C", str(workdir), "worktree", "add", "-q", "--detach",
                                              str(workdir / f"by-hand-{r}"), target])], check=True, capture_output=True)
            times["worktree"].append(time.perf_counter() - started)
        base = statistics.median(times["checkout"])
        print(f"a run's tree of a {mb} MB project ({mb * 4} files), loopback sshd, {repeat} rounds; "
              f"load avg {os.getloadavg()[0]:.2f}")
        print(median_line("thrust-remote make_tree (agent tree-add)", times["ours"], base))
        print(median_line("ssh host git checkout --force --detach C (shared)", times["checkout"], base))
        print(median_line("ssh host git worktree add --detach T C (by hand)", times["worktree"], base))
        one_file = (workdir / ".thrust" / "trees" / "bench-0" / ".git").is_file()
        print(f"  disk: the store's git objects {objects / 1e6:.1f} MB, once; each tree "
              f"{statistics.median(sizes) / 1e6:.1f} MB of files and a .git file ({'no' if one_file else 'a'} second "
              f"object store); after {repeat} trees the store is {du(workdir / '.git') / 1e6:.1f} MB")
    finally:
        session.close()


def files(server: SSHServer, root: Path, count: int, repeat: int) -> None:
    repo = git_init(root / "data-project")
    (repo / "README").write_text("data\n")
    commit(repo, "data project")
    make_files(repo / "data", count)
    ssh = ssh_command(server)
    times: dict[str, list[float]] = {k: [] for k in ("ours first", "ours incremental", "rsync first",
                                                     "rsync incremental")}
    for r in range(repeat):
        workdir = root / "sshd" / "remote-home" / f"files-{r}"
        runner = server.runner(workdir=str(workdir))
        session = HostSession.open(runner, server.host_config(workdir=str(workdir)))
        try:
            local = with_lfs(local_state(repo))
            result = sync(session, local)
            for phase in ("first", "incremental"):
                if phase == "incremental":
                    (repo / "data" / "d00" / "obj00000").write_bytes(os.urandom(2000))
                started = time.perf_counter()
                placed = data.local_files(repo, ("data",))
                data.send_files(session, placed, NullReporter())
                make_tree(session, local, result, session.paths.tree(f"f-{r}-{phase}"), ref=None,
                          data=TreeData(files={k: (f.sha256, f.mtime_ns) for k, f in placed.items()}))
                times[f"ours {phase}"].append(time.perf_counter() - started)
                dest = f"{server.user}@127.0.0.1:{root / 'sshd' / 'remote-home' / f'rsync-{r}'}/"
                started = time.perf_counter()
                subprocess.run(["rsync", "-a", "-e", ssh, f"{repo / 'data'}/", dest], check=True, capture_output=True)
                times[f"rsync {phase}"].append(time.perf_counter() - started)
        finally:
            session.close()
    print(f"files: of {count} small files (1-4 KB, 20 dirs), into a run's tree; {repeat} rounds")
    for phase in ("first", "incremental"):
        base = statistics.median(times[f"rsync {phase}"])
        print(median_line(f"thrust-remote files: ({phase}: sent + placed)", times[f"ours {phase}"], base))
        print(median_line(f"rsync -a -e ssh ({phase})", times[f"rsync {phase}"], base))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=50)
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="thrust-bench-trees-"))
    server = _start_sshd(root / "sshd")
    try:
        trees(server, root, args.mb, args.repeat)
        files(server, root, args.files, args.repeat)
    finally:
        os.killpg(server.wrapper.pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
