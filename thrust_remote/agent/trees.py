"""A run's own tree on the host (docs/architecture.md, "Trees"): a git worktree of the workdir's one
object store, at the run's commit and patch, with its Git LFS content, its submodules, its `files:`,
its `setup:` outputs and its `shared:` directories.

    agent tree-add --workdir W --tree T --commit C [--patch P] [--ref NAME] [--lfs PATH=OID]... --stdin
        stdin: {"submodules": [{"path", "store", "commit", "patch", "lfs": [...]}],
                "files": {RELPATH: {"sha256", "mtime_ns"}}, "shared": [RELPATH...], "setup": KEY|null}
        -> {"tree": T, "head": C, "setup": "placed"|"none"|"missing"}
           exit 3 {"error": "missing", "missing": [SHA...]}: store objects to send (again) first
           exit 3 {"error": "shared-tracked", "path", "tracked"}: a shared path holds files of the commit
    agent tree-remove --workdir W --tree T [--ref NAME] [--module STORE]...
    agent tree-size --tree T [--deadline S]     -> {"bytes", "files", "complete"}
    agent tree-prune --workdir W --keep N [--fetched RUN]... [--dry-run]
        -> {"trees": [{"name", "tree", "runs", "live", "fetched", "at", "bytes", "removed"}], "freed"}
    agent store-missing --workdir W  (stdin: [SHA...])      -> {"missing": [SHA...]}
    agent setup-keep --workdir W --tree T --key K (stdin: {"exclude": [RELPATH...]}) -> {"outputs": N, "bytes"}

The content store, `W/.thrust/store/aa/SHA` (what `files:` sends and what `setup:` made), holds each
file once per host; a tree gets hard links to it, so a 10 GB dataset placed in ten trees is 10 GB on
disk. Each object has `SHA.stat` beside it, (size, mtime_ns, inode) when it was sealed: an object that
no longer matches (a job rewrote a linked file in place) is removed and reported missing, so the laptop
sends it again and no tree ever gets content that is not what its name says.

`--ref NAME` keeps the commit reachable (refs/thrust/trees/NAME) while the tree lives: `git gc` keeps
its objects, and the next sync's bundle leaves them out. Stdlib only; git is called with argv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

from .checkout import ENV, lfs_object
from .protocol import RUN_JSON, RUNS_DIR, RunState
from .xfer import sha256_of

STORE = os.path.join(".thrust", "store")
SETUP = os.path.join(".thrust", "setup")
SHARED = os.path.join(".thrust", "shared")
REFS = "refs/thrust/trees/"
BLOCK = 1 << 20


class Refused(Exception):
    """The tree cannot be made as asked: an answer for the laptop (exit 3), not a failure of the host."""

    def __init__(self, answer: dict) -> None:
        super().__init__(answer.get("error"))
        self.answer = answer


def _git(cwd: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", cwd, *args], capture_output=True, env=ENV)


def _git_ok(cwd: str, *args: str) -> str:
    done = _git(cwd, *args)
    if done.returncode != 0:
        raise OSError(f"git {' '.join(args[:3])} in {cwd}: {done.stderr.decode('utf-8', 'replace').strip()[-400:]}")
    return done.stdout.decode("utf-8", "replace").strip()


# ------------------------------------------------------------------------------------------ the store

def object_path(workdir: str, sha: str) -> str:
    return os.path.join(workdir, STORE, sha[:2], sha)


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ino}"


def seal(path: str, mtime_ns: int | None = None) -> None:
    """An object just written (sent and verified, or made by setup): read-only, the laptop file's mtime,
    and its stat recorded beside it."""
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))
    os.chmod(path, 0o400)  # read-only, and this account's alone
    with open(f"{path}.stat", "w") as fh:
        fh.write(_stamp(os.stat(path)))


def intact(path: str) -> bool:
    """The object is there and is what was sealed (not rewritten in place through a tree's link)."""
    try:
        with open(f"{path}.stat") as fh:
            sealed = fh.read().strip()
        return _stamp(os.stat(path)) == sealed
    except OSError:
        return False


def _drop(path: str) -> None:
    for p in (path, f"{path}.stat"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


def missing(workdir: str, shas: list[str]) -> list[str]:
    """The objects the store lacks or holds changed (those are removed): the laptop sends them."""
    _private_dir(os.path.join(workdir, STORE))  # before the transfers make its subdirectories
    out = []
    for sha in dict.fromkeys(shas):
        path = object_path(workdir, sha)
        if intact(path):
            continue
        if os.path.exists(path) and not os.path.exists(f"{path}.stat"):
            continue  # sent and verified by the transfer, not sealed yet: tree-add seals it
        _drop(path)
        out.append(sha)
    return out


# ------------------------------------------------------------------------------------------ a tree

def _link(source: str, dest: str) -> None:
    """`dest` becomes a hard link to `source` (a copy across filesystems), replacing what was there."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = f"{dest}.thrust-place"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copy2(source, tmp)
    os.replace(tmp, dest)


def _place_files(workdir: str, tree: str, files: dict) -> None:
    absent = []
    for want in files.values():
        path = object_path(workdir, want["sha256"])
        if os.path.exists(path) and not os.path.exists(f"{path}.stat"):
            if sha256_of(path) != want["sha256"]:
                _drop(path)
                absent.append(want["sha256"])
                continue
            seal(path, want.get("mtime_ns"))
        if not intact(path):
            _drop(path)
            absent.append(want["sha256"])
    if absent:
        raise Refused({"error": "missing", "missing": sorted(set(absent))})
    for rel, want in files.items():
        _link(object_path(workdir, want["sha256"]), _inside(tree, rel))


def _inside(tree: str, rel: str) -> str:
    """TREE/REL, refused when REL would leave the tree (an absolute path, `..`)."""
    path = os.path.normpath(os.path.join(tree, rel))
    if os.path.isabs(rel) or not path.startswith(os.path.normpath(tree) + os.sep):
        raise Refused({"error": "outside", "path": rel})
    return path


def _place_setup(workdir: str, tree: str, key: str | None) -> str:
    """A setup's outputs kept for `key`, linked in: "placed"; "none" without a key; "missing" when
    there is no record, or an output is gone (then the setup runs again)."""
    if not key:
        return "none"
    try:
        with open(os.path.join(workdir, SETUP, f"{key}.json")) as fh:
            outputs = json.load(fh)["outputs"]
    except (OSError, ValueError, KeyError):
        return "missing"
    if not all(intact(object_path(workdir, sha)) for sha in outputs.values()):
        return "missing"
    for rel, sha in outputs.items():
        _link(object_path(workdir, sha), _inside(tree, rel))
    return "placed"


def _link_shared(workdir: str, tree: str, paths: list[str]) -> None:
    """Each `shared:` path is a link to one directory of the host's (W/.thrust/shared/PATH) that
    outlives the tree. A path the commit has files under is refused: it would hide them."""
    for rel in paths:
        rel = rel.strip("/")
        where = _inside(tree, rel)
        tracked = _git(tree, "ls-files", "-z", "--", rel).stdout.decode("utf-8", "replace").split("\0")
        tracked = [t for t in tracked if t]
        if tracked:
            raise Refused({"error": "shared-tracked", "path": rel, "tracked": tracked[:5]})
        target = os.path.join(workdir, SHARED, rel)
        _private_dir(os.path.join(workdir, SHARED))
        os.makedirs(target, exist_ok=True)
        if os.path.lexists(where):
            shutil.rmtree(where) if os.path.isdir(where) and not os.path.islink(where) else os.unlink(where)
        os.makedirs(os.path.dirname(where), exist_ok=True)
        os.symlink(target, where)


def _private_dir(path: str) -> None:
    """`path` made owner-only (0700) when it is new: the trees hold the user's code and data, the store
    the data (docs/architecture.md, "Security")."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def _worktree(store: str, tree: str, commit: str, patch: str, lfs: list[str], ref: str | None) -> str:
    """`git worktree add --detach TREE COMMIT` of `store`, the patch applied, LFS content in place."""
    _private_dir(os.path.dirname(tree))
    _git_ok(store, "worktree", "add", "-q", "--detach", "--force", tree, commit)
    if ref:
        _git_ok(store, "update-ref", REFS + ref, commit)
    if patch:
        _git_ok(tree, "apply", "--index", "--whitespace=nowarn", patch)
    for item in lfs:
        path, _, oid = item.rpartition("=")
        dest = _inside(tree, path)
        if not oid:
            with contextlib.suppress(FileNotFoundError):
                os.remove(dest)
            continue
        _link(lfs_object(store, oid), dest)
    return _git_ok(tree, "rev-parse", "HEAD")


def _private(workdir: str) -> None:
    """The workdir and its .thrust owner-only (0700), tightened each run: one an older version left 0755
    let another account list the runs and hold the launch lock (docs/architecture.md, "Security")."""
    for path in (workdir, os.path.join(workdir, ".thrust")):
        with contextlib.suppress(OSError):
            if os.stat(path).st_uid == os.getuid():
                os.chmod(path, 0o700)


def add(workdir: str, tree: str, commit: str, patch: str, lfs: list[str], ref: str | None, extra: dict) -> dict:
    if os.path.lexists(tree):
        raise Refused({"error": "exists", "tree": tree})
    try:
        head = _worktree(workdir, tree, commit, patch, lfs, ref)
        for sub in extra.get("submodules") or []:
            _worktree(sub["store"], _inside(tree, sub["path"]), sub["commit"], sub.get("patch") or "",
                      sub.get("lfs") or [], ref)
        _place_files(workdir, tree, extra.get("files") or {})
        setup = _place_setup(workdir, tree, extra.get("setup"))
        _link_shared(workdir, tree, extra.get("shared") or [])
    except BaseException:
        remove(workdir, tree, ref, [s["store"] for s in extra.get("submodules") or []])
        raise
    _private(workdir)
    return {"tree": tree, "head": head, "setup": setup}


def remove(workdir: str, tree: str, ref: str | None, modules: list[str]) -> dict:
    """The tree's files, its worktree records and its ref; shared directories and the store stay."""
    existed = os.path.lexists(tree)
    if existed:
        _make_writable(tree)
        shutil.rmtree(tree, ignore_errors=True)
    for store in [workdir, *modules]:
        _git(store, "worktree", "prune")
    if ref:
        _git(workdir, "update-ref", "-d", REFS + ref)
    return {"removed": existed}


def _make_writable(tree: str) -> None:
    """A job may leave read-only directories (a cache, a copied package): rmtree needs to enter them."""
    for root, dirs, _files in os.walk(tree):
        for d in dirs:
            path = os.path.join(root, d)
            with contextlib.suppress(OSError):
                if not os.path.islink(path):
                    os.chmod(path, 0o700)


def size(tree: str, deadline: float) -> dict:
    """The bytes of the tree's own files (a file linked from the store, or into another tree, is not
    its own; shared directories are links, not entered). `complete` false: the walk ran out of time."""
    total, count, end = 0, 0, time.monotonic() + deadline
    for root, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_nlink == 1:
                total += st.st_blocks * 512
                count += 1
        if time.monotonic() > end:
            return {"bytes": total, "files": count, "complete": False}
    return {"bytes": total, "files": count, "complete": True}


# ------------------------------------------------------------------------------------------ size, prune

SIZE_FILE = "tree-size.json"  # in a run's directory: its tree's size, once the run has ended


def tree_info(run_dir: str, meta: dict, ended: bool, deadline: float = 1.0) -> dict:
    """A run's tree for `status` and `list`: its path, whether it is still kept, its size (counted once
    the run ended and kept in the run's directory; a running run's is counted within `deadline`)."""
    tree = meta.get("tree")
    if not isinstance(tree, str):
        return {}
    if not os.path.isdir(tree):
        return {"tree": tree, "tree_kept": False, "tree_bytes": None}
    cached = os.path.join(run_dir, SIZE_FILE)
    if ended:
        with contextlib.suppress(OSError, ValueError), open(cached) as fh:
            return {"tree": tree, "tree_kept": True, "tree_bytes": json.load(fh)["bytes"]}
    counted = size(tree, deadline)
    if ended and counted["complete"]:
        with contextlib.suppress(OSError):
            with open(f"{cached}.tmp", "w") as fh:
                json.dump(counted, fh)
            os.replace(f"{cached}.tmp", cached)
    return {"tree": tree, "tree_kept": True, "tree_bytes": counted["bytes"]}


def _users(workdir: str) -> dict[str, list[dict]]:
    """Each tree's runs (run.json `tree`) with their state: a study's trials share one."""
    from .supervisor import read_json, run_state

    runs_dir = os.path.join(workdir, RUNS_DIR)
    users: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
        run_dir = os.path.join(runs_dir, name)
        meta = read_json(os.path.join(run_dir, RUN_JSON)) or {}
        if isinstance(meta.get("tree"), str):
            users.setdefault(os.path.normpath(meta["tree"]), []).append(run_state(run_dir, meta))
    return users


def prune(workdir: str, keep: int, fetched: list[str], dry_run: bool) -> dict:
    """Remove trees beyond the newest `keep` of ended runs: never a tree a QUEUED or RUNNING run uses;
    the trees of FINISHED runs already fetched (`fetched`: the laptop's word) go first, then the oldest.
    A tree no run names (a set-up that stopped before its launch) counts as ended."""
    trees_dir = os.path.join(workdir, ".thrust", "trees")
    users = _users(workdir)
    rows = []
    for name in sorted(os.listdir(trees_dir)) if os.path.isdir(trees_dir) else ():
        tree = os.path.join(trees_dir, name)
        runs = users.get(os.path.normpath(tree), [])
        live = any(RunState.of(r["state"]).is_live for r in runs)
        done = bool(runs) and all(r["state"] == RunState.FINISHED and r["run_id"] in fetched for r in runs)
        mtime = max([os.lstat(tree).st_mtime, *[r.get("ended_ts") or 0 for r in runs]])
        rows.append({"name": name, "tree": tree, "runs": [r["run_id"] for r in runs], "live": live,
                     "fetched": done, "at": mtime})
    ended = [r for r in rows if not r["live"]]
    # newest first; the fetched-and-finished ones count as older than every other
    ended.sort(key=lambda r: (not r["fetched"], r["at"]), reverse=True)
    freed = 0
    for row in ended[keep:] if keep >= 0 else ended:
        row["bytes"] = size(row["tree"], 10.0)["bytes"]
        row["removed"] = not dry_run
        freed += row["bytes"]
        if not dry_run:
            remove(workdir, row["tree"], row["name"], _module_stores(workdir))
    return {"trees": rows, "freed": freed, "dry_run": dry_run}


def _module_stores(workdir: str) -> list[str]:
    base = os.path.join(workdir, ".thrust", "modules")
    return [os.path.join(base, n) for n in sorted(os.listdir(base))] if os.path.isdir(base) else []


# ------------------------------------------------------------------------------------------ setup:

def _changed(tree: str) -> list[str]:
    """Files the setup made or changed in the tree: untracked, ignored and modified tracked ones."""
    out = _git(tree, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignored").stdout
    paths, words = [], out.decode("utf-8", "surrogateescape").split("\0")
    skip = False
    for word in words:
        if skip:  # a rename's second path
            skip = False
            continue
        if len(word) < 4:
            continue
        status, path = word[:2], word[3:]
        if status.startswith("R"):
            skip = True
        if status != " D" and not path.endswith("/"):
            paths.append(path)
    return paths


def keep_setup(workdir: str, tree: str, key: str, exclude: list[str]) -> dict:
    """Every file the setup made or changed, into the store (a link, same filesystem) and recorded
    under its key, so a later tree of the same inputs gets them instead of running it again."""
    skipped = tuple(e.strip("/") for e in exclude)
    outputs, total = {}, 0
    for rel in _changed(tree):
        if any(rel == s or rel.startswith(s + "/") for s in skipped):
            continue
        path = os.path.join(tree, rel)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        sha = sha256_of(path)
        obj = object_path(workdir, sha)
        if not intact(obj):
            _drop(obj)
            _private_dir(os.path.join(workdir, STORE))
            os.makedirs(os.path.dirname(obj), exist_ok=True)
            try:
                os.link(path, obj)
            except OSError:
                shutil.copy2(path, obj)
            seal(obj)
        outputs[rel] = sha
        total += os.path.getsize(path)
    record = os.path.join(workdir, SETUP, f"{key}.json")
    os.makedirs(os.path.dirname(record), exist_ok=True)
    with open(f"{record}.tmp", "w") as fh:
        json.dump({"outputs": outputs, "at": time.time()}, fh)
    os.replace(f"{record}.tmp", record)
    return {"outputs": len(outputs), "bytes": total}


# ------------------------------------------------------------------------------------------ command line

def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tree-add")
    p.add_argument("--workdir", required=True)
    p.add_argument("--tree", required=True)
    p.add_argument("--commit", required=True)
    p.add_argument("--patch", default="")
    p.add_argument("--ref")
    p.add_argument("--lfs", action="append", default=[])
    p.add_argument("--stdin", action="store_true")
    p = sub.add_parser("tree-remove")
    p.add_argument("--workdir", required=True)
    p.add_argument("--tree", required=True)
    p.add_argument("--ref")
    p.add_argument("--module", action="append", default=[])
    p = sub.add_parser("tree-size")
    p.add_argument("--tree", required=True)
    p.add_argument("--deadline", type=float, default=5.0)
    p = sub.add_parser("tree-prune")
    p.add_argument("--workdir", required=True)
    p.add_argument("--keep", type=int, required=True)
    p.add_argument("--fetched", action="append", default=[])
    p.add_argument("--dry-run", action="store_true")
    p = sub.add_parser("store-missing")
    p.add_argument("--workdir", required=True)
    p = sub.add_parser("setup-keep")
    p.add_argument("--workdir", required=True)
    p.add_argument("--tree", required=True)
    p.add_argument("--key", required=True)
    return parser


def _run(args: argparse.Namespace) -> dict:
    if args.cmd == "tree-add":
        extra = json.loads(sys.stdin.read() or "{}") if args.stdin else {}
        return add(args.workdir, args.tree, args.commit, args.patch, args.lfs, args.ref, extra)
    if args.cmd == "tree-remove":
        return remove(args.workdir, args.tree, args.ref, args.module)
    if args.cmd == "tree-size":
        return size(args.tree, args.deadline)
    if args.cmd == "tree-prune":
        return prune(args.workdir, args.keep, args.fetched, args.dry_run)
    if args.cmd == "store-missing":
        return {"missing": missing(args.workdir, json.loads(sys.stdin.read() or "[]"))}
    return keep_setup(args.workdir, args.tree, args.key, json.loads(sys.stdin.read() or "{}").get("exclude") or [])


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        answer = _run(args)
    except Refused as exc:
        print(json.dumps(exc.answer))
        return 3
    except OSError as exc:
        sys.stderr.write(f"{args.cmd}: {exc}\n")
        return 1
    print(json.dumps(answer))
    return 0
