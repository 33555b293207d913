"""The host's object store for sync: one command to learn its state, one to add a bundle's commits.
(A run's tree of that store is agent/trees.py's.)

    agent git-state --workdir W --commit C
        {"git": bool, "repo": bool, "free_bytes": int|null, "head": str|null, "have": bool, "known": [sha...]}
        (no repository there yet: + {"entries": N, "some": [NAME...]} when the directory exists)
    agent git-state ... [--lfs OID]...
        ... + {"lfs_missing": [oid...]}: the Git LFS objects W/.git/lfs/objects lacks
    agent git-receive --workdir W --bundle B --refspec SRC:DST [--shallow SHA]...
        {"shallow": [sha...]}    (fetch B into W, then delete B; exit 1 and git's stderr when it fails)

`known` (only when the commit is missing) lists the commits the host has, so the laptop bundles
only what the host lacks. git is always called with argv, never through a shell.

Syncs at once (several `train`s, the nodes of one run, optimize's hosts): each sends its bundle under a
name of its own and the receive takes the store's lock (`W/.git/thrust-store.lock`, flock) for its
shallow list and its fetch, so two fetches never race for one ref or for `.git/shallow`; `known` is read
before `have`, so a commit another sync adds meanwhile is never both missing and excluded.

`--shallow` (a shallow laptop clone): the boundary commits the host lacks are written to W/.git/shallow
before the fetch, so the host's history stops where the laptop's does (a bundle cannot say it).
`DIFF_SCOPE` is what a patch leaves out: submodules (each is synced on its own) and LFS paths (their
content goes as content, never as a patch of the pointer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

from .files import lock_within

# what the tree's diff leaves out: submodules (synced on their own) and LFS paths (content, not pointer)
DIFF_SCOPE = ("--ignore-submodules=all", "--", ".", ":(exclude,attr:filter=lfs)")
# a host's git-lfs, if installed, must not try to download what the laptop sends itself
ENV = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1"}
BUNDLES = "bundles"  # W/.thrust/bundles/<token>.bundle: each sync's bundle under a name of its own
STORE_LOCK = "thrust-store.lock"  # in W/.git: one receive at a time into a store
LOCK_WAIT_S = 240.0  # a big bundle's index-pack takes a while; the laptop's call waits 300 s
# `git worktree add` (agent tree-add, another run's tree) writes its admin files one by one, HEAD first as
# a null object id; a git that reads every worktree's (a fetch's connectivity walk, another worktree add)
# in that moment fails naming one of them ("bad object worktrees/X/HEAD", "failed to read
# .git/worktrees/X/commondir"), though nothing is wrong with the store: worth a second try
WORKTREE_BEING_ADDED = re.compile(r"worktrees/[^/\s]+/(HEAD|commondir|gitdir)\b")


def lfs_object(workdir: str, oid: str) -> str:
    """Where git-lfs keeps an object (.git/lfs/objects/aa/bb/aabb...)."""
    return os.path.join(workdir, ".git", "lfs", "objects", oid[:2], oid[2:4], oid)


def _git(workdir: str, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", "-C", workdir, *args], capture_output=True, env=ENV)
    if check and result.returncode != 0:
        sys.stderr.write(result.stderr.decode("utf-8", "replace"))
        raise SystemExit(1)
    return result


def _out(result: subprocess.CompletedProcess) -> str:
    return result.stdout.decode("utf-8", "replace").strip() if result.returncode == 0 else ""


def free_bytes(path: str) -> int | None:
    """Free space for this account on the filesystem that holds `path` (or would: its nearest parent)."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def state(workdir: str, commit: str, lfs: list[str] | None = None) -> dict:
    if shutil.which("git") is None:
        return {"git": False}
    out: dict = {"git": True, "repo": False, "free_bytes": free_bytes(workdir)}
    inside = os.path.isdir(os.path.join(workdir, ".git")) and _git(workdir, "rev-parse", "--is-inside-work-tree")
    if not inside or inside.returncode != 0:
        # what the directory already holds: a first sync refuses a non-empty one that is not ours
        with contextlib.suppress(OSError):
            names = sorted(os.listdir(workdir))
            out.update(entries=len(names), some=names[:5])
        return out
    # the refs before `have`: a sync that lands the commit in between must not leave it both missing and
    # among the commits the laptop excludes from its bundle (an empty bundle, which git refuses)
    refs = _out(_git(workdir, "for-each-ref", "--format=%(objectname)")).split()
    have = _git(workdir, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0
    out.update(repo=True, head=_out(_git(workdir, "rev-parse", "-q", "--verify", "HEAD")) or None,
               have=have, known=[],
               lfs_missing=[oid for oid in lfs or () if not os.path.isfile(lfs_object(workdir, oid))])
    if not have:
        out["known"] = sorted({*([out["head"]] if out["head"] else []), *refs})
    return out


@contextlib.contextmanager
def store_lock(workdir: str, seconds: float = LOCK_WAIT_S) -> Iterator[None]:
    """The store's own lock (flock on W/.git/thrust-store.lock, 0600), held while a sync changes it."""
    path = os.path.join(workdir, ".git", STORE_LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not lock_within(fd, seconds):
            raise OSError(f"the object store is busy: another sync has held {path} for {seconds:.0f} s")
        yield
    finally:
        os.close(fd)  # closing the descriptor lets go of the lock


def receive(workdir: str, bundle: str, refspec: str, shallow: list[str]) -> dict:
    try:
        with store_lock(workdir):
            added = _add_shallow(workdir, shallow)
            _fetch(workdir, bundle, refspec)
    finally:
        with contextlib.suppress(OSError):
            os.remove(bundle)
        _drop_stale_bundles(workdir)
    return {"shallow": added}


def _drop_stale_bundles(workdir: str, older_than_s: float = 86400.0) -> None:
    """Bundles of syncs whose receive never ran (the link cut after the upload): a day old, surely done."""
    where = os.path.join(workdir, ".thrust", BUNDLES)
    with contextlib.suppress(OSError):
        for entry in os.scandir(where):
            if entry.name.endswith(".bundle") and entry.is_file(follow_symlinks=False) \
                    and time.time() - entry.stat(follow_symlinks=False).st_mtime > older_than_s:
                with contextlib.suppress(OSError):
                    os.remove(entry.path)


def _add_shallow(workdir: str, shallow: list[str]) -> list[str]:
    """A boundary commit the host already has keeps its history; one it lacks arrives without parents."""
    added = [c for c in shallow if _git(workdir, "cat-file", "-e", f"{c}^{{commit}}").returncode != 0]
    if added:
        path = os.path.join(workdir, ".git", "shallow")
        try:
            with open(path) as fh:
                have = set(fh.read().split())
        except OSError:
            have = set()
        with open(path, "a") as fh:
            fh.writelines(f"{c}\n" for c in added if c not in have)
    return added


def _fetch(workdir: str, bundle: str, refspec: str, tries: int = 6) -> None:
    """`git fetch BUNDLE REFSPEC`, tried again (briefly) while another run's tree is being added."""
    for attempt in range(tries):
        done = _git(workdir, "fetch", "-q", bundle, refspec)
        if done.returncode == 0:
            return
        text = done.stderr.decode("utf-8", "replace")
        if attempt == tries - 1 or not WORKTREE_BEING_ADDED.search(text):
            sys.stderr.write(text)
            raise SystemExit(1)
        time.sleep(0.05 * 2 ** attempt)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("git-state")
    p.add_argument("--workdir", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--lfs", action="append", default=[])
    p = sub.add_parser("git-receive")
    p.add_argument("--workdir", required=True)
    p.add_argument("--bundle", required=True)
    p.add_argument("--refspec", required=True)
    p.add_argument("--shallow", action="append", default=[])
    args = parser.parse_args(argv)
    if args.cmd == "git-state":
        print(json.dumps(state(args.workdir, args.commit, args.lfs)))
        return 0
    try:
        answer = receive(args.workdir, args.bundle, args.refspec, args.shallow)
    except OSError as exc:
        sys.stderr.write(f"checkout in {args.workdir}: {exc}\n")
        return 1
    print(json.dumps(answer))
    return 0
