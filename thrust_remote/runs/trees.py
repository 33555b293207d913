"""The runs' trees on a host, kept and reclaimed (docs/architecture.md, "Trees"): a host's `keep: {runs:
N}` after each launch, and `thrust-remote prune`. The host decides what is live (agent `tree-prune`: a
QUEUED or RUNNING run's tree is never removed, nor one being set up or launched: its lease); the laptop
says which runs it has fetched, whose trees go first, and when a train is done with its tree (a
launch's keep: keeps a tree whose train is still to fetch it).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from thrust_remote.agent.protocol import RUNS_DIR
from thrust_remote.host.session import HostSession

FETCHED_RECORDS = ("fetch.json", "artifacts.json", "checkpoints.json")  # what a fetch leaves per run


def fetched_runs(root: Path) -> list[str]:
    """The runs this project has fetched something of (`.thrust/fetched/RUN/`)."""
    base = root / ".thrust" / "fetched"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if any((p / name).is_file() for name in FETCHED_RECORDS))


def project_roots(root: Path) -> tuple[str, ...]:
    """The project, as a host's trees are told apart by it: the root commits of its HEAD (a host's
    workdir is one store for every project of its account; a clone elsewhere, a fork, is the same
    history). () when git cannot tell: then nothing of the host is counted as this project's."""
    done = subprocess.run(["git", "-C", str(root), "rev-list", "--max-parents=0", "HEAD"], capture_output=True,
                          check=False)
    return tuple(sorted(done.stdout.decode().split())) if done.returncode == 0 else ()


@dataclass(frozen=True)
class Pruned:
    """One host's `tree-prune` answer: every tree with its runs, whether it stays, what was freed."""

    host: str
    trees: list[dict]
    freed: int
    dry_run: bool
    others: int = 0  # the trees of other projects in the same workdir: never counted, never removed

    @property
    def removed(self) -> list[dict]:
        return [t for t in self.trees if "removed" in t]

    @property
    def held(self) -> list[dict]:
        """The trees kept whatever N: being set up or launched, still to fetch (agent tree-prune's `hold`)."""
        return [t for t in self.trees if t.get("hold") and "removed" not in t]

    def as_json(self) -> dict:
        return {"host": self.host, "trees": self.trees, "freed": self.freed, "dry_run": self.dry_run,
                "others": self.others}


def prune(session: HostSession, root: Path, keep: int, *, dry_run: bool = False, launched: str | None = None,
          release: bool = False) -> Pruned:
    """Remove (or, `dry_run`, list) this project's trees beyond the newest `keep` of its ended runs on
    this host; never one being set up or launched, never another project's (project_roots: a launch's
    keep: and `thrust-remote prune` alike). `launched`: a launch's keep: (the run just launched is
    spared, and so is a tree whose train is still to fetch it); `release`: this train will not fetch
    from its tree."""
    roots = project_roots(root)
    argv = ["tree-prune", "--workdir", session.paths.workdir, "--keep", str(keep),
            *[a for run in fetched_runs(root) for a in ("--fetched", run)], *(["--dry-run"] if dry_run else [])]
    if launched is not None:
        argv += ["--auto", "--spare", launched, *(["--release", launched] if release else [])]
    # no roots (not a git project): a project no tree can be told to be, so none is counted; the run
    # just launched still lends its own tree's roots (agent tree-prune --spare)
    argv += [a for r in roots or ("-",) for a in ("--project", r)]
    answer = session.agent_json("tree-prune", *argv, timeout=600)
    return Pruned(session.name, list(answer.get("trees") or []), int(answer.get("freed") or 0), dry_run,
                  int(answer.get("others") or 0))


def keep_policy(session: HostSession, root: Path, launched: str, *, release: bool) -> Pruned | None:
    """After the launch of run `launched`: the host's `keep: {runs: N}` applied (`release`: its train
    fetches nothing from this host, so its tree is an ended run's like any once it ends); None where
    there are no trees (host local, a workdir without runs)."""
    if session.host.is_local or not session.runner.exists(f"{session.paths.workdir}/{RUNS_DIR}"):
        return None
    return prune(session, root, session.host.keep_runs, launched=launched, release=release)


def release(session: HostSession, run_id: str) -> None:
    """The train of `run_id` is done with its tree (fetched, or nothing to fetch): its lease goes, and a
    later launch's keep: may remove it as any ended run's."""
    if not session.host.is_local:
        session.agent_json("tree-prune", "tree-prune", "--workdir", session.paths.workdir, "--release", run_id,
                           timeout=60)


def size_text(n: object) -> str:
    """A tree's size for a table: `12.3 MB`; `-` when it was removed, `?` when unknown."""
    if n is None:
        return "?"
    if not isinstance(n, (int, float)):
        return "-"
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def summary(pruned: Pruned) -> str:
    what = "would free" if pruned.dry_run else "freed"
    gone = len(pruned.removed)
    kept = len(pruned.trees) - gone
    others = f"; {pruned.others} of other projects left alone" if pruned.others else ""
    return (f"{pruned.host}: {gone} tree(s) {'to remove' if pruned.dry_run else 'removed'}, {kept} kept; "
            f"{what} {size_text(pruned.freed)}{others}")


HOLDS = {"setup": "being set up or launched", "fetch": "its train is still to fetch it",
         "launched": "just launched"}


def describe(tree: dict) -> str:
    runs = ", ".join(tree.get("runs") or []) or "no run"
    why = "live" if tree.get("live") else (HOLDS.get(str(tree.get("hold")))
                                           or ("fetched" if tree.get("fetched") else "ended"))
    return f"{tree.get('name')} ({runs}; {why})" + (f" {size_text(tree['bytes'])}" if "bytes" in tree else "")

