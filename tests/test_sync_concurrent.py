"""Syncs at once into one host's object store (docs/architecture.md, "Sync"), over a real sshd: many
`train --queue --detach` of different commits, started together from two clones of one project (several
worktrees each), all succeed, each run's tree holds its own commit, and no sync's bundle or ref is
left behind on either side. Each sync has its own bundle path (laptop and host) and its own refs, and the
host takes one bundle into the store at a time (agent git-receive's lock)."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from helpers import EXE, commit, git, new_project, remote_tempdir

JOBS = """\
jobs:
  quick:
    kind: command
    command: [sh, -c, 'cat version.txt > "$THRUST_RUN_DIR/seen"']
"""
PER_CLONE = 5  # two clones: ten syncs at once, each of its own commit


def _worktrees(clone: Path, tag: str) -> list[tuple[Path, str]]:
    """PER_CLONE worktrees of `clone`, each at a commit of its own: (where, the version it holds)."""
    out = []
    for i in range(PER_CLONE):
        where = clone.parent / f"{clone.name}-wt{i}"
        git(clone, "worktree", "add", "-q", "-b", f"v{tag}{i}", str(where))
        version = f"{tag}{i}\n"
        (where / "version.txt").write_text(version)
        commit(where, f"version {tag}{i}", "version.txt")
        out.append((where, version))
    return out


def _train(where: Path) -> subprocess.CompletedProcess:
    # a process each: what a user starts from several terminals (or a script) at once
    return subprocess.run([EXE, "train", "quick", "--queue", "--detach", "--json"], cwd=where,
                          capture_output=True, text=True, timeout=300)


def test_many_syncs_of_different_commits_from_two_clones_at_once_all_succeed(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    origin = new_project(tmp_path / "origin", sshd, workdir, jobs=JOBS, files={"version.txt": "base\n"})
    first = cli("train", "quick", cwd=origin)  # the workdir exists: what is raced is the sync, not the set-up
    assert first.returncode == 0, first.stderr
    clones = []
    for name in ("a", "b"):
        clone = tmp_path / name
        subprocess.run(["git", "clone", "-q", str(origin), str(clone)], check=True, capture_output=True)
        git(clone, "remote", "remove", "origin")  # no origin: every sync sends a bundle
        git(clone, "config", "user.email", "t@example.com")
        git(clone, "config", "user.name", "t")
        clones.append(clone)
    places = _worktrees(clones[0], "a") + _worktrees(clones[1], "b")
    with ThreadPoolExecutor(len(places)) as pool:
        done = list(pool.map(_train, [where for where, _ in places]))
    failed = [f"{where.name}: exit {res.returncode}: {res.stderr[-800:]}"
              for (where, _), res in zip(places, done, strict=True) if res.returncode != 0]
    assert not failed, "\n\n".join(failed)
    runs = [json.loads(res.stdout) for res in done]
    waited = cli("wait", *[r["run_id"] for r in runs], "--timeout", "120", cwd=origin)
    assert waited.returncode == 0, waited.stderr
    for (where, version), run in zip(places, runs, strict=True):
        assert (Path(run["run_dir"]) / "seen").read_text() == version, where.name
        recorded = json.loads((Path(run["run_dir"]) / "run.json").read_text())
        assert recorded["commit"] == git(where, "rev-parse", "HEAD")
        assert recorded["sync"] == "bundle", recorded["sync"]
    # nothing of the syncs is left: no bundle on the host, no sync ref on either side
    assert not [p.name for p in (workdir / ".thrust").rglob("*.bundle")]
    refs = git(workdir, "for-each-ref", "--format=%(refname)", "refs/thrust/").split()
    # the runs' own refs, and the one the receives move in turn (the newest commit sent: a later bundle's base)
    assert sorted(r for r in refs if not r.startswith("refs/thrust/trees/")) == ["refs/thrust/sync"], refs
    assert git(workdir, "rev-parse", "refs/thrust/sync") in {git(where, "rev-parse", "HEAD") for where, _ in places}
    for clone in clones:
        assert git(clone, "for-each-ref", "--format=%(refname)", "refs/thrust/") == ""
