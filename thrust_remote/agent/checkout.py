"""The host's checkout for sync: one command to learn its state, one to put it at a commit.

    agent git-state --workdir W --commit C
        {"git": bool, "repo": bool, "head": str|null, "applied": str, "current": str,
         "have": bool, "known": [sha...]}
    agent git-checkout --workdir W --commit C [--patch P] --patch-id ID
        {"head": sha}            (exit 1 and git's stderr when a step fails)

`applied` is what the last checkout left in W/.thrust/applied-patch ("<patch id> <tree diff sha>"),
`current` the sha256 of the tree's diff now: equal, the checkout is untouched since (sync skips it).
`known` (only when the commit is missing) lists the commits the host has, so the laptop bundles
only what the host lacks. git is always called with argv, never through a shell.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

APPLIED = os.path.join(".thrust", "applied-patch")
EXCLUDE = "/.thrust/"


def _git(workdir: str, *args: str, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", "-C", workdir, *args], capture_output=True)
    if check and result.returncode != 0:
        sys.stderr.write(result.stderr.decode("utf-8", "replace"))
        raise SystemExit(1)
    return result


def _out(result: subprocess.CompletedProcess) -> str:
    return result.stdout.decode("utf-8", "replace").strip() if result.returncode == 0 else ""


def tree_diff_sha(workdir: str) -> str:
    """sha256 of `git diff HEAD --binary`: what was changed in the tree (empty diff: sha of b"")."""
    return hashlib.sha256(_git(workdir, "diff", "HEAD", "--binary").stdout).hexdigest()


def state(workdir: str, commit: str) -> dict:
    if shutil.which("git") is None:
        return {"git": False}
    out: dict = {"git": True, "repo": False}
    inside = os.path.isdir(os.path.join(workdir, ".git")) and _git(workdir, "rev-parse", "--is-inside-work-tree")
    if not inside or inside.returncode != 0:
        return out
    try:
        with open(os.path.join(workdir, APPLIED)) as fh:
            applied = fh.read().strip()
    except OSError:
        applied = ""
    have = _git(workdir, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0
    out.update(repo=True, head=_out(_git(workdir, "rev-parse", "-q", "--verify", "HEAD")) or None,
               applied=applied, current=tree_diff_sha(workdir), have=have, known=[])
    if not have:
        refs = _out(_git(workdir, "for-each-ref", "--format=%(objectname)")).split()
        out["known"] = sorted({*([out["head"]] if out["head"] else []), *refs})
    return out


def checkout(workdir: str, commit: str, patch: str, patch_id: str) -> dict:
    os.makedirs(os.path.join(workdir, ".thrust"), exist_ok=True)
    os.makedirs(os.path.join(workdir, ".git", "info"), exist_ok=True)
    exclude = os.path.join(workdir, ".git", "info", "exclude")
    try:
        with open(exclude) as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    if EXCLUDE not in lines:  # the run directories must never show up as untracked files
        with open(exclude, "a") as fh:
            fh.write(EXCLUDE + "\n")
    # reset --hard first drops the previous run's patch (it was applied with --index)
    _git(workdir, "reset", "-q", "--hard", check=True)
    _git(workdir, "checkout", "-q", "--force", "--detach", commit, check=True)
    if patch:
        _git(workdir, "apply", "--index", "--whitespace=nowarn", patch, check=True)
    # what we left: the local patch's id and the tree's own diff, so the next sync can tell it is untouched
    with open(os.path.join(workdir, APPLIED), "w") as fh:
        fh.write(f"{patch_id} {tree_diff_sha(workdir)}\n")
    return {"head": _out(_git(workdir, "rev-parse", "HEAD", check=True))}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("git-state")
    p.add_argument("--workdir", required=True)
    p.add_argument("--commit", required=True)
    p = sub.add_parser("git-checkout")
    p.add_argument("--workdir", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--patch", default="")
    p.add_argument("--patch-id", required=True)
    args = parser.parse_args(argv)
    if args.cmd == "git-state":
        print(json.dumps(state(args.workdir, args.commit)))
        return 0
    try:
        answer = checkout(args.workdir, args.commit, args.patch, args.patch_id)
    except OSError as exc:
        sys.stderr.write(f"checkout in {args.workdir}: {exc}\n")
        return 1
    print(json.dumps(answer))
    return 0
