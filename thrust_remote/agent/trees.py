"""A run's own tree on the host (docs/architecture.md, "Trees"): a git worktree of the workdir's one
object store, at the run's commit and patch, with its Git LFS content, its submodules, its `files:`,
its `setup:` outputs and its `shared:` directories.

    agent tree-add --workdir W --tree T --commit C [--patch P] [--ref NAME] [--lfs PATH=OID]... --stdin
        stdin: {"submodules": [{"path", "store", "commit", "patch", "lfs": [...]}],
                "files": {RELPATH: {"sha256", "mtime_ns"}}, "shared": [RELPATH...], "setup": KEY|null}
        -> {"tree": T, "head": C, "setup": "placed"|"none"|"missing"}
           exit 3 {"error": "missing", "missing": [SHA...]}: store objects to send (again) first
           exit 3 {"error": "shared-tracked", "path", "tracked"}: a shared path holds files of the commit
           exit 3 {"error": "outside", "path", ["through", "link", "what"]}: a path would leave the tree
                  (`..`), or a directory on its way is a symlink (or a file) of the commit: `through`
                  names it, `link` its target, `what` the kind (files, shared, lfs, submodule). Nothing
                  is ever written, replaced or removed through a link; kept setup outputs that do not
                  fit the tree so are not placed ("setup": "missing": the setup runs in it)
    agent tree-remove --workdir W --tree T [--ref NAME] [--module STORE]...
    agent tree-size --tree T [--deadline S]     -> {"bytes", "files", "complete"}
    agent tree-prune --workdir W [--keep N] [--fetched RUN]... [--spare RUN]... [--release RUN]... [--auto]
                     [--project ROOT]... [--dry-run]
        -> {"trees": [{"name", "tree", "runs", "live", "fetched", "at", "hold", "bytes", "removed"}], "freed",
            "others"}
           --project: the root commits of the laptop's project; only the trees whose HEAD shares one (or
           one with --spare's tree) are counted and removed: `others` is how many other projects' were
           left alone (a host's workdir serves every project of its account)
           hold (when kept whatever N): "setup" (being set up or launched), "fetch" (--auto: its train is
           still to fetch it), "launched" (--spare: the run just launched); without --keep only the leases
           --release names are dropped
    agent store-missing --workdir W  (stdin: [SHA...])      -> {"missing": [SHA...]}
    agent setup-keep --workdir W --tree T --key K (stdin: {"exclude": [RELPATH...]}) -> {"outputs": N, "bytes"}

The content store, `W/.thrust/store/aa/SHA` (what `files:` sends and what `setup:` made), holds each
file once per host; a tree gets hard links to it, so a 10 GB dataset placed in ten trees is 10 GB on
disk. Each object has `SHA.stat` beside it, (size, mtime_ns, inode) when it was sealed: an object that
no longer matches (a job rewrote a linked file in place) is removed and reported missing, so the laptop
sends it again and no tree ever gets content that is not what its name says.

tree-add takes the tree's lease (W/.thrust/leases/NAME) before the tree exists: tree-prune never removes
a tree being set up or launched, and a launch's keep: (--auto) not one whose train is still to fetch it
(the laptop releases it: --release, or --fetched once it fetched something). A tree removed by
tree-prune leaves `tree-removed.json` (when, by prune or keep, and keep's launch) in each of its runs'
directories.

`--ref NAME` keeps the commit reachable (refs/thrust/trees/NAME) while the tree lives: `git gc` keeps
its objects, and the next sync's bundle leaves them out. Stdlib only; git is called with argv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time

from .checkout import ENV, lfs_object, store_lock
from .protocol import RUNS_DIR, TREE_REMOVED, RunState
from .treesize import SIZE_FILE as SIZE_FILE  # re-exported (as tree_info below): tests name them here
from .treesize import size
from .treesize import tree_info as tree_info
from .xfer import sha256_of

STORE = os.path.join(".thrust", "store")
SETUP = os.path.join(".thrust", "setup")
SHARED = os.path.join(".thrust", "shared")
REFS = "refs/thrust/trees/"
BLOCK = 1 << 20
# A tree's lease (W/.thrust/leases/NAME), taken by tree-add before the tree exists: the tree is being set
# up and launched, and then, while its run has ended and its train is still to fetch it, kept from
# another launch's keep:. Released by the laptop (tree-prune --release, or --fetched), or abandoned this
# long after it was taken or its run ended (a train killed before its fetch).
LEASES = os.path.join(".thrust", "leases")
LEASE_SETUP_S = 8 * 3600.0  # no run yet: a setup may take 6 h (run/data.SETUP_TIMEOUT_S), a venv's build too
LEASE_FETCH_S = 24 * 3600.0  # after its run's end
LOCK = os.path.join(".thrust", "locks", "launch.lock")  # supervisor's launch lock (runs/control.launch_lock)
LOCK_WAIT_S = 10.0  # prune waits this long for a launch under way; past it, every leased tree stays
# a remove waits this long for a receive under way (its fetch of a big bundle) before it leaves the
# worktree records for the next remove's prune: a prune of many trees never waits 240 s a tree
REMOVE_LOCK_WAIT_S = 30.0


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
    """The object is there, is what was sealed (not rewritten in place through a tree's link), and this
    account can read it (a job may chmod a linked file: the mode is put back, the content is the same)."""
    try:
        with open(f"{path}.stat") as fh:
            sealed = fh.read().strip()
        st = os.stat(path)
        if _stamp(st) != sealed:
            return False
        if stat.S_IMODE(st.st_mode) != 0o400:
            os.chmod(path, 0o400)  # changes no stamp field (ctime only)
        return True
    except OSError:
        return False


def _unsealed(path: str) -> bool:
    """Sent and verified by the transfer, not sealed yet: tree-add seals it. One this account cannot read
    (an older version stored a laptop file's mode 000 as it was) is made readable, or it is not there."""
    if not os.path.exists(path) or os.path.exists(f"{path}.stat"):
        return False
    if not os.access(path, os.R_OK):
        try:
            os.chmod(path, 0o600)
        except OSError:
            return False
    return os.access(path, os.R_OK)


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
        if intact(path) or _unsealed(path):
            continue
        _drop(path)
        out.append(sha)
    return out


# ------------------------------------------------------------------------------------------ a tree

class _Blocked(Exception):
    """A directory on the way to a destination in the tree is a symlink, or a file: nothing is written
    through it. `at` is that path, relative to the tree."""

    def __init__(self, at: str) -> None:
        super().__init__(at)
        self.at = at


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)


def _parts(rel: str) -> list[str]:
    """REL's names, refused when it would leave the tree (absolute, `..`, empty)."""
    parts = [p for p in rel.strip("/").split("/") if p not in ("", ".")]
    if rel.startswith("/") or not parts or ".." in parts:
        raise Refused({"error": "outside", "path": rel})
    return parts


def _parent_fd(tree: str, parts: list[str], make: bool) -> int:
    """An fd of the directory TREE/parts[:-1], each step opened without following a link (made when
    missing and `make`): never a directory outside the tree, whatever the commit's links say."""
    fd = os.open(os.path.realpath(tree), os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, name in enumerate(parts[:-1]):
            try:
                step = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, 0o777, dir_fd=fd)
                try:
                    step = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    raise _Blocked("/".join(parts[:i + 1])) from None
            except OSError:  # ELOOP: a symlink; ENOTDIR: a file
                raise _Blocked("/".join(parts[:i + 1])) from None
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(tree: str, rel: str, at: str, what: str) -> Refused:
    """The answer for a destination behind a link (or a file) of the tree: what it is, where it points."""
    path = os.path.join(tree, at)
    answer = {"error": "outside", "path": rel, "through": at, "what": what}
    if os.path.islink(path):
        with contextlib.suppress(OSError):
            answer["link"] = os.readlink(path)
    return Refused(answer)


def _blocked(tree: str, rel: str) -> str | None:
    """The first directory on the way to TREE/REL that is a link or a file (relative), None when none is
    (those still missing are made as real directories)."""
    parts = _parts(rel)
    here = os.path.realpath(tree)
    for i, name in enumerate(parts[:-1]):
        here = os.path.join(here, name)
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            return "/".join(parts[:i + 1])
    return None


def _place(source: str, tree: str, rel: str, what: str) -> None:
    """TREE/REL becomes a hard link to `source` (a copy across filesystems), replacing what was there, a
    link included (replaced, never written through); refused when a directory on the way is a link or
    a file (`what`: files, setup, lfs, for the answer)."""
    parts = _parts(rel)
    try:
        fd = _parent_fd(tree, parts, make=True)
    except _Blocked as exc:
        raise _refusal(tree, rel, exc.at, what) from None
    name, tmp = parts[-1], f"{parts[-1]}.thrust-place"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=fd)
        try:
            os.link(source, tmp, dst_dir_fd=fd)
        except OSError:
            _copy_at(source, fd, tmp)
        os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)


def _copy_at(source: str, dir_fd: int, name: str) -> None:
    """`source` copied to a new file `name` in `dir_fd` (never through a link), its mode and times kept."""
    st = os.stat(source)
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600, dir_fd=dir_fd)
    with open(source, "rb") as src, os.fdopen(out, "wb") as dst:
        shutil.copyfileobj(src, dst, BLOCK)
        os.fchmod(dst.fileno(), stat.S_IMODE(st.st_mode))
        os.utime(dst.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))


def _unlink_in(tree: str, rel: str, what: str) -> None:
    """TREE/REL removed (a link itself, never what it points at); refused behind a link as _place is."""
    parts = _parts(rel)
    try:
        fd = _parent_fd(tree, parts, make=False)
    except FileNotFoundError:
        return
    except _Blocked as exc:
        raise _refusal(tree, rel, exc.at, what) from None
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)


def _place_files(workdir: str, tree: str, files: dict) -> None:
    absent = []
    for want in files.values():
        path = object_path(workdir, want["sha256"])
        if _unsealed(path):
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
        _place(object_path(workdir, want["sha256"]), tree, rel, "files")


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
    # another commit of the same inputs may track a link where the outputs go (`out -> ~/elsewhere`):
    # they do not fit its tree, and none is placed; its setup runs in it as it would on a fresh host
    if any(_blocked(tree, rel) for rel in outputs):
        return "missing"
    for rel, sha in outputs.items():
        _place(object_path(workdir, sha), tree, rel, "setup")
    return "placed"


def _link_shared(workdir: str, tree: str, paths: list[str]) -> None:
    """Each `shared:` path is a link to one directory of the host's (W/.thrust/shared/PATH) that
    outlives the tree. A path the commit has files under is refused: it would hide them; so is one
    behind a link of the commit (`data -> ~/datasets` with `shared: [data/cache]`): the link would be
    made, and what stood there removed, in a directory outside the tree."""
    for given in paths:
        parts = _parts(given)
        rel = "/".join(parts)
        at = _blocked(tree, rel)
        if at is not None:
            raise _refusal(tree, rel, at, "shared")
        listed = _git(tree, "ls-files", "-z", "--", rel)
        if listed.returncode != 0:  # "beyond a symbolic link": git cannot say, so neither is it made
            raise Refused({"error": "outside", "path": rel, "what": "shared",
                           "git": listed.stderr.decode("utf-8", "replace").strip()[-300:]})
        tracked = [t for t in listed.stdout.decode("utf-8", "replace").split("\0") if t]
        if tracked:
            raise Refused({"error": "shared-tracked", "path": rel, "tracked": tracked[:5]})
        target = os.path.join(workdir, SHARED, rel)
        _private_dir(os.path.join(workdir, SHARED))
        os.makedirs(target, exist_ok=True)
        try:
            fd = _parent_fd(tree, parts, make=True)
        except _Blocked as exc:
            raise _refusal(tree, rel, exc.at, "shared") from None
        try:
            _clear_at(fd, parts[-1])
            os.symlink(target, parts[-1], dir_fd=fd)
        finally:
            os.close(fd)


def _clear_at(dir_fd: int, name: str) -> None:
    """What stands at `name` in `dir_fd` removed: a link as a link, a real directory with its files (the
    fd-based rmtree, which never follows a link inside it either)."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _private_dir(path: str) -> None:
    """`path` made owner-only (0700) when it is new: the trees hold the user's code and data, the store
    the data (docs/architecture.md, "Security")."""
    os.makedirs(path, mode=0o700, exist_ok=True)


def _worktree(store: str, tree: str, commit: str, patch: str, lfs: list[str], ref: str | None) -> str:
    """`git worktree add --detach TREE COMMIT` of `store`, the patch applied, LFS content in place.

    The worktree's admin files (W/.git/worktrees/NAME, written one by one, HEAD first as a null id) are
    made under the store's lock, which a receive holds around its fetch: a fetch's walk over every
    worktree's HEAD never meets a half-made one ("bad object worktrees/X/HEAD"), nor two adds each
    other's. Only that: the checkout of the files (`reset --hard`, what `worktree add` itself runs
    next) comes after the lock is let go, so a big tree never keeps the other trains' receives waiting."""
    _private_dir(os.path.dirname(tree))
    with store_lock(store):
        _git_ok(store, "worktree", "add", "-q", "--detach", "--force", "--no-checkout", tree, commit)
        if ref:
            _git_ok(store, "update-ref", REFS + ref, commit)
    _git_ok(tree, "reset", "-q", "--hard", "--no-recurse-submodules")
    if patch:
        _git_ok(tree, "apply", "--index", "--whitespace=nowarn", patch)
    for item in lfs:
        path, _, oid = item.rpartition("=")
        if not oid:
            _unlink_in(tree, path, "lfs")
            continue
        _place(lfs_object(store, oid), tree, path, "lfs")
    return _git_ok(tree, "rev-parse", "HEAD")


def _submodule_path(tree: str, rel: str) -> str:
    """Where a submodule's worktree goes: TREE/REL, refused behind a link of the tree as _place is."""
    at = _blocked(tree, rel)
    if at is not None:
        raise _refusal(tree, rel, at, "submodule")
    return os.path.join(os.path.realpath(tree), *_parts(rel))


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
    _take_lease(workdir, os.path.basename(os.path.normpath(tree)))  # before the tree: prune sees it first
    try:
        head = _worktree(workdir, tree, commit, patch, lfs, ref)
        for sub in extra.get("submodules") or []:
            _worktree(sub["store"], _submodule_path(tree, sub["path"]), sub["commit"], sub.get("patch") or "",
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
    # under the store's lock, as a tree's add is: a receive's fetch reads every worktree's admin files,
    # which prune removes; a store busy past the wait keeps a stale record, pruned by the next remove
    for store in [workdir, *modules]:
        with contextlib.suppress(OSError), store_lock(store, REMOVE_LOCK_WAIT_S):
            _git(store, "worktree", "prune")
    if ref:
        _git(workdir, "update-ref", "-d", REFS + ref)
    drop_lease(workdir, os.path.basename(os.path.normpath(tree)))
    return {"removed": existed}


def _lease_path(workdir: str, name: str) -> str:
    if not name or name in (".", "..") or "/" in name:
        raise Refused({"error": "outside", "path": name})
    return os.path.join(workdir, LEASES, name)


def _take_lease(workdir: str, name: str) -> None:
    _private_dir(os.path.join(workdir, LEASES))
    with open(_lease_path(workdir, name), "w") as fh:
        json.dump({"at": time.time(), "pid": os.getpid()}, fh)


def drop_lease(workdir: str, name: str) -> None:
    with contextlib.suppress(FileNotFoundError, Refused):
        os.unlink(_lease_path(workdir, name))


def _lease_at(workdir: str, name: str) -> float | None:
    try:
        return os.stat(_lease_path(workdir, name)).st_mtime
    except (OSError, Refused):
        return None


def _make_writable(tree: str) -> None:
    """A job may leave read-only directories (a cache, a copied package): rmtree needs to enter them."""
    for root, dirs, _files in os.walk(tree):
        for d in dirs:
            path = os.path.join(root, d)
            with contextlib.suppress(OSError):
                if not os.path.islink(path):
                    os.chmod(path, 0o700)


# ------------------------------------------------------------------------------------------ prune

def _users(workdir: str) -> dict[str, list[dict]]:
    """Each tree's runs (run.json `tree`) with their state: a study's trials share one."""
    from .runjson import read_record
    from .supervisor import run_state  # here only: a prune, not every tree-add, reads runs' states

    runs_dir = os.path.join(workdir, RUNS_DIR)
    users: dict[str, list[dict]] = {}
    for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else ():
        run_dir = os.path.join(runs_dir, name)
        meta = read_record(run_dir)
        if isinstance(meta.get("tree"), str):
            users.setdefault(os.path.normpath(meta["tree"]), []).append(run_state(run_dir, meta))
    return users


def prune(workdir: str, keep: int | None, fetched: list[str], dry_run: bool, *, spare: tuple[str, ...] = (),
          release: tuple[str, ...] = (), auto: bool = False, project: tuple[str, ...] = ()) -> dict:
    """Remove trees beyond the newest `keep` of ended runs: never a tree a QUEUED or RUNNING run uses,
    nor one still being set up or launched (its lease, and no run yet), nor `spare` (the run just
    launched); with `auto` (a launch's keep:) neither one whose run ended and whose train is still to
    fetch it (its lease). The trees of FINISHED runs already fetched (`fetched`: the laptop's word) go
    first, then the oldest. A tree no run names and no lease holds (a set-up abandoned) counts as ended.
    `project`: the root commits of the laptop's project: only its trees are counted and removed, every
    other project's sharing the workdir is left alone (`others` counts them); none given: every tree.
    `release`: leases the laptop is done with, dropped first; `keep` None: only that."""
    for name in release if not dry_run else ():
        drop_lease(workdir, name)
    if keep is None:
        return {"trees": [], "freed": 0, "dry_run": dry_run}
    rows = _tree_rows(workdir, fetched, set(spare), auto)
    others = 0
    if project:
        ours = _ours(rows, set(project), set(spare))
        others, rows = len(rows) - len(ours), ours
    ended = [r for r in rows if not r["live"] and not r.get("hold")]
    # newest first; the fetched-and-finished ones count as older than every other
    ended.sort(key=lambda r: (not r["fetched"], r["at"]), reverse=True)
    freed = 0
    for row in ended[keep:] if keep >= 0 else ended:
        row["bytes"] = size(row["tree"], 10.0)["bytes"]
        row["removed"] = not dry_run
        freed += row["bytes"]
        if not dry_run:
            launch = {"launch": spare[0], "keep": keep} if auto and spare else {}
            _note_removed(workdir, row, "keep" if auto else "prune", launch)
            remove(workdir, row["tree"], row["name"], _module_stores(workdir))
    return {"trees": rows, "freed": freed, "dry_run": dry_run, **({"others": others} if project else {})}


def _roots(tree: str) -> frozenset[str]:
    """The root commits of the tree's HEAD: its project, as the workdir's one store knows it (a shallow
    sync's boundary stands for the root there). Empty when git cannot tell (a tree half made)."""
    done = _git(tree, "rev-list", "--max-parents=0", "HEAD")
    return frozenset(done.stdout.decode().split()) if done.returncode == 0 else frozenset()


def _ours(rows: list[dict], project: set[str], spare: set[str]) -> list[dict]:
    """The rows of the project whose root commits are `project` (the laptop's) or the just-launched
    tree's, as the host's store sees them (a shallow sync's boundary): one project's keep: never counts,
    nor removes, another's trees. A tree whose history shares no root with it is another project's; one
    git cannot read is no project's, left for its own project's prune."""
    roots = {row["name"]: _roots(row["tree"]) for row in rows}
    for name in spare:
        project |= roots.get(name, frozenset())
    return [row for row in rows if roots[row["name"]] & project]


def _tree_rows(workdir: str, fetched: list[str], spare: set[str], auto: bool) -> list[dict]:
    """Each tree with its runs and what keeps it (`live`; `hold`: "setup" being set up or launched,
    "fetch" its train still to fetch it (honoured by `auto` only), "launched" the run just launched).
    Decided under the launch lock: a launch under way has its run.json and its supervisor by then."""
    trees_dir = os.path.join(workdir, ".thrust", "trees")
    fd = os.open(os.path.join(workdir, LOCK), os.O_RDWR | os.O_CREAT, 0o600) \
        if os.path.isdir(os.path.dirname(os.path.join(workdir, LOCK))) else None
    try:
        locked = fd is None or _lock_within(fd)
        users = _users(workdir)
        now, rows = time.time(), []
        for name in sorted(os.listdir(trees_dir)) if os.path.isdir(trees_dir) else ():
            tree = os.path.join(trees_dir, name)
            runs = users.get(os.path.normpath(tree), [])
            live = any(RunState.of(r["state"]).is_live for r in runs)
            ids = [r["run_id"] for r in runs]
            done = bool(runs) and all(r["state"] == RunState.FINISHED and r["run_id"] in fetched for r in runs)
            ended_ts = max([r.get("ended_ts") or 0 for r in runs] or [0])
            mtime = max(os.lstat(tree).st_mtime, ended_ts)
            row = {"name": name, "tree": tree, "runs": ids, "live": live, "fetched": done, "at": mtime}
            leased = _lease_at(workdir, name)
            age = LEASE_FETCH_S if runs else LEASE_SETUP_S
            fresh = leased is not None and now - max(leased, ended_ts) < age \
                and not (ids and all(i in fetched for i in ids))
            if name in spare:
                row["hold"] = "launched"
            elif fresh and (not runs or not locked):
                row["hold"] = "setup"
            elif fresh and auto and not live:
                row["hold"] = "fetch"
            rows.append(row)
        return rows
    finally:
        if fd is not None:
            os.close(fd)


def _lock_within(fd: int) -> bool:
    from .files import lock_within

    return lock_within(fd, LOCK_WAIT_S)


def _note_removed(workdir: str, row: dict, by: str, launch: dict) -> None:
    """Each run of a tree being removed is told in its directory (TREE_REMOVED): a fetch says so plainly,
    with the launch whose keep: removed it (`launch`: its run id, `keep` its N)."""
    from .files import write_atomic

    note = json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ts": time.time(), "by": by,
                       "tree": row["tree"], **launch}).encode()
    for run_id in row["runs"]:
        run_dir = os.path.join(workdir, RUNS_DIR, run_id)
        with contextlib.suppress(OSError):
            if os.path.isdir(run_dir):
                write_atomic(os.path.join(run_dir, TREE_REMOVED), note)


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


def _record_fits(workdir: str, key: str) -> bool:
    """The key has a record whose outputs are all in the store: a setup that ran anyway (its outputs did
    not fit this commit's tree, behind a link of it) leaves that record as it is, so the commits they
    fit keep getting them."""
    try:
        with open(os.path.join(workdir, SETUP, f"{key}.json")) as fh:
            outputs = json.load(fh)["outputs"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(outputs, dict) and bool(outputs) and all(
        isinstance(sha, str) and intact(object_path(workdir, sha)) for sha in outputs.values())


def keep_setup(workdir: str, tree: str, key: str, exclude: list[str]) -> dict:
    """Every file the setup made or changed, into the store (a link, same filesystem) and recorded
    under its key, so a later tree of the same inputs gets them instead of running it again."""
    if _record_fits(workdir, key):
        return {"outputs": 0, "bytes": 0, "kept": "already"}
    skipped = tuple(e.strip("/") for e in exclude)
    outputs, total = {}, 0
    for rel in _changed(tree):
        if any(rel == s or rel.startswith(s + "/") for s in skipped):
            continue
        path = os.path.join(tree, rel)
        if os.path.islink(path) or not os.path.isfile(path) or _blocked(tree, rel) is not None:
            continue  # a file behind a link the setup made is not the tree's: not kept, never placed
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
    p.add_argument("--keep", type=int)  # none: only --release
    p.add_argument("--fetched", action="append", default=[])
    p.add_argument("--spare", action="append", default=[])
    p.add_argument("--release", action="append", default=[])
    p.add_argument("--auto", action="store_true")
    p.add_argument("--project", action="append", default=[])  # the laptop project's root commits
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
        return prune(args.workdir, args.keep, args.fetched, args.dry_run, spare=tuple(args.spare),
                     release=tuple(args.release), auto=args.auto, project=tuple(args.project))
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
