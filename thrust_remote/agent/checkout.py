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
import shutil
import subprocess
import sys

# what the tree's diff leaves out: submodules (synced on their own) and LFS paths (content, not pointer)
DIFF_SCOPE = ("--ignore-submodules=all", "--", ".", ":(exclude,attr:filter=lfs)")
# a host's git-lfs, if installed, must not try to download what the laptop sends itself
ENV = {**os.environ, "GIT_LFS_SKIP_SMUDGE": "1"}


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
    have = _git(workdir, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0
    out.update(repo=True, head=_out(_git(workdir, "rev-parse", "-q", "--verify", "HEAD")) or None,
               have=have, known=[],
               lfs_missing=[oid for oid in lfs or () if not os.path.isfile(lfs_object(workdir, oid))])
    if not have:
        refs = _out(_git(workdir, "for-each-ref", "--format=%(objectname)")).split()
        out["known"] = sorted({*([out["head"]] if out["head"] else []), *refs})
    return out


def receive(workdir: str, bundle: str, refspec: str, shallow: list[str]) -> dict:
    # a boundary commit the host already has keeps its history; one it lacks arrives without parents
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
    try:
        _git(workdir, "fetch", "-q", bundle, refspec, check=True)
    finally:
        with contextlib.suppress(OSError):
            os.remove(bundle)
    return {"shallow": added}


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
