"""The local commit, plus the local uncommitted changes, as a run's own tree on the host.

Two steps (docs/architecture.md, "Sync" and "Trees"):
- `sync`: the commit's objects into the workdir's one object store (`<workdir>/.git`). The host fetches
  the commit from the local repo's origin when it can reach it; otherwise a `git bundle` of only the
  commits it lacks goes over SSH. Git LFS objects the host lacks go into its `.git/lfs/objects`; each
  checked-out submodule's objects into a store of its own (`<workdir>/.thrust/modules/<path>`). No tree
  is touched, so runs of other code go on undisturbed.
- `make_tree`: a new tree for one run (`<workdir>/.thrust/trees/<name>`, a git worktree) at the commit,
  with the patch applied (`--index`), the LFS content placed, each submodule a worktree of its store, and
  the job's `files:`, `setup:` outputs and `shared:` links (run/data.py).
- `.git` is never copied; untracked files are listed, not copied. A shallow clone's bundle takes its
  boundary along (the host's history stops there too); a commit whose history cannot be read goes as
  its tree alone (a stand-in commit, sync "tree") (run/repo.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import secrets
import shlex
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from thrust_remote.agent.checkout import BUNDLES, DIFF_SCOPE, WORKTREE_BEING_ADDED
from thrust_remote.agent.protocol import RunRecord, run_record
from thrust_remote.core.config import BEST_PARAMS_MARK, BEST_PARAMS_SUFFIX, CONFIG_NAME, parse_config_text, read_text
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.fetch import models
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run.repo import LfsFile, lfs_files, missing_in_tree, shallow_boundary, submodule_paths, tree_commit
from thrust_remote.run.repo import git as _git

Step = Callable[[str], None]
HOST_REF = "refs/thrust/sync"  # the host's name for what the bundle carries
TREE_ADD_TRIES = 5  # tree-add: once, once more after sending missing files:, and while a sibling is added
# git's words for an object it cannot read: the history is incomplete here (not a full disk, say)
UNREADABLE = re.compile(r"unable to read|could not read|bad object|missing (blob|tree|commit)|promisor",
                        re.IGNORECASE)


@dataclass(frozen=True)
class LocalState:
    root: Path
    commit: str
    patch: bytes = b""
    untracked: tuple[str, ...] = ()
    origin: str | None = None
    shallow: tuple[str, ...] = ()  # a shallow clone's boundary commits
    lfs: tuple[LfsFile, ...] | None = None  # None: not looked at yet (sync does; a local run needs none)
    submodules: tuple[tuple[str, LocalState], ...] = ()  # (path, its own state), checked out ones
    absent_submodules: tuple[str, ...] = ()  # not checked out on the laptop either

    @property
    def dirty(self) -> bool:
        return bool(self.patch)

    @property
    def patch_sha256(self) -> str | None:
        return hashlib.sha256(self.patch).hexdigest() if self.patch else None

    @property
    def applied_id(self) -> str:
        """What the host's checkout records as applied: the patch, and the LFS content put in place."""
        if not self.lfs:
            return self.patch_sha256 or "none"
        listed = "\n".join(f.spec for f in self.lfs).encode()
        return hashlib.sha256(self.patch + b"\0" + listed).hexdigest()


@dataclass
class SyncResult:
    commit: str
    method: str  # "up-to-date" | "fetch" | "bundle" | "shallow-bundle" | "clone" | "tree" | "local"
    dirty: bool
    patch_sha256: str | None
    untracked: tuple[str, ...]
    bundle_bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    checkout: str | None = None  # the host's HEAD when it is not `commit` (method "tree")
    shallow: bool = False
    lfs: tuple[str, ...] = ()
    submodules: dict[str, SyncResult] = field(default_factory=dict)
    lfs_id: str | None = None  # LocalState.applied_id when LFS content went along
    not_sent: tuple[str, ...] = ()  # submodules not checked out here: empty on the host too
    store: str | None = None  # the object store it synced into (the host's workdir)
    tree: str | None = None  # the run's own tree, once made (make_tree)
    tree_setup: str = "none"  # whether the tree got a setup's kept outputs (make_tree's Tree.setup)

    @property
    def code_key(self) -> str:
        """The run's code in one word: the commit checked out and everything beside it (code_id)."""
        return f"{self.checkout or self.commit}:{self.code_id or ''}"

    @property
    def code_id(self) -> str | None:
        """The patch's sha256, widened to the LFS content and the submodules' code when there are any:
        what a build cache keyed on commit + patch must also change with."""
        if not self.lfs_id and not self.submodules and not self.not_sent:
            return self.patch_sha256
        subs = {path: [sub.checkout or sub.commit, sub.code_id] for path, sub in sorted(self.submodules.items())}
        empty = sorted(self.not_sent)
        return hashlib.sha256(json.dumps([self.patch_sha256, self.lfs_id, subs, *([empty] if empty else [])]).encode()
                              ).hexdigest()

    def as_meta(self) -> RunRecord:
        """run.json's fields of the code the run got (a submodule's own, the same fields, nested in
        `submodules`); the optional ones only when they say something."""
        optional = {"checkout": self.checkout, "shallow": self.shallow, "lfs": list(self.lfs),
                    "submodules": {path: sub.as_meta() for path, sub in self.submodules.items()},
                    "submodules_not_sent": list(self.not_sent), "tree": self.tree}
        return run_record(commit=self.commit, sync=self.method, dirty=self.dirty, patch_sha256=self.patch_sha256,
                          untracked=list(self.untracked), **{k: v for k, v in optional.items() if v})


def local_state(root: Path) -> LocalState:
    """What the laptop has: HEAD, the uncommitted diff, untracked files, origin's URL, and what sync
    needs beyond them (shallow boundary, LFS content, submodules: run/repo.py)."""
    inside = _git(root, "rev-parse", "--show-toplevel", check=False)
    if inside.returncode != 0:
        raise ThrustError(
            f"{root} is not a git repository: thrust-remote sends the host an exact commit",
            "git init && git add -A && git commit -m 'first'",
            ExitCode.USAGE,
        )
    top = Path(inside.stdout.decode().strip())
    head = _git(top, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False)
    if head.returncode != 0:
        raise ThrustError(f"{top} has no commit yet", "git add -A && git commit -m 'first'", ExitCode.USAGE)
    # submodules and LFS files travel on their own (their own sync; the content), not in the patch
    patch = _git(top, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff", *DIFF_SCOPE).stdout
    untracked = _git(top, "ls-files", "--others", "--exclude-standard", "-z").stdout.decode().split("\0")
    origin = _git(top, "remote", "get-url", "origin", check=False)
    present, absent = submodule_paths(top)
    return LocalState(
        root=top,
        commit=head.stdout.decode().strip(),
        patch=patch,
        untracked=tuple(u for u in untracked if u),
        origin=origin.stdout.decode().strip() if origin.returncode == 0 else None,
        shallow=shallow_boundary(top),
        submodules=tuple((path, local_state(top / path)) for path in present),
        absent_submodules=tuple(absent),
    )


def _host_git(session: HostSession, *args: str, timeout: float = 120):
    """git on the host, in the workdir."""
    return session.runner.run(["git", "-C", session.paths.workdir, *args], timeout=timeout)


def _host_state(session: HostSession, commit: str, local: LocalState) -> dict:
    """One round trip: the agent's git-state (docs/architecture.md, "The host agent")."""
    lfs = [arg for f in local.lfs or () if f.oid for arg in ("--lfs", f.oid)]
    res = session.agent("git-state", "--workdir", session.paths.workdir, "--commit", commit, *lfs, timeout=120)
    try:
        state = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        state = {}
    if not res.ok or "git" not in state:
        raise ThrustError(f"cannot inspect {session.paths.workdir} on {session.runner.name}: "
                          f"{res.stderr.strip()[-300:]}")
    return state


def sync(session: HostSession, local: LocalState, *, step: Step = lambda _: None,
         files: Sequence[str] | None = None) -> SyncResult:
    """The commit's objects (and its LFS objects, and each checked-out submodule's) in the host's
    object store: what `make_tree` checks out. Nothing a run uses is changed. `files`: the paths the
    job sends by content (its `files:`), left out of the untracked warning; None: every job's."""
    runner = session.runner
    local = with_lfs(local)  # every level's LFS content is found (or refused) before the host is touched
    state = _host_state(session, local.commit, local)
    if not state["git"]:
        raise ThrustError(
            f"git is not installed on {runner.name}",
            "install it there (e.g. apt-get install git)",
            ExitCode.UNAVAILABLE,
        )
    check_room(session, state.get("free_bytes"), tree_bytes(local), "the run's tree")
    method = "up-to-date"
    if not state.get("repo"):
        method = "clone"
        state = _first_sync(session, local, step, state)
    with tempfile.TemporaryDirectory() as tmp:
        target, bundle = local.commit, None
        if not state.get("have"):
            method, bundle = _reach_commit(session, local, state, method, Path(tmp), step)
            if bundle is not None and bundle.target != local.commit:
                target = bundle.target
                state = _host_state(session, target, local)
        result = SyncResult(local.commit, method, local.dirty, local.patch_sha256, local.untracked,
                            warnings=_warnings(local, files), checkout=target if target != local.commit else None,
                            shallow=bool(local.shallow), lfs=tuple(f.path for f in local.lfs or ()),
                            lfs_id=local.applied_id if local.lfs else None, store=session.paths.workdir)
        if bundle is not None and bundle.target != local.commit:
            result.method = "tree"
            result.warnings.append(bundle.why)
        if bundle is not None and not state.get("have"):
            result.bundle_bytes = bundle.path.stat().st_size
            step(f"sending the missing {'tree' if result.checkout else 'commits'} as a git bundle "
                 f"({result.bundle_bytes} bytes)")
            if _send_bundle(session, local, bundle):
                result.method = "shallow-bundle"
        elif method == "up-to-date":
            step(f"{session.name} has {target[:12]} already")
        _send_lfs(session, local, state.get("lfs_missing") or (), step)
    _sync_submodules(session, local, result, step, files)
    return result


ROOM_MARGIN = 16 << 20  # what a run needs beyond its tree before its first write (a log, run.json, a venv stamp)


def tree_bytes(local: LocalState) -> int:
    """What a tree of this code takes on the host: the commit's files, the patch, the LFS content and the
    submodules' (their checked-out size, as git lists it; no second copy of git objects)."""
    listed = _git(local.root, "ls-tree", "-r", "-l", "-z", local.commit, check=False).stdout.split(b"\0")
    total = sum(int(fields[3]) for line in listed if len(fields := line.split(maxsplit=4)) >= 5
                and fields[3].isdigit())
    total += len(local.patch) + sum(_size(f.source) for f in local.lfs or ())
    return total + sum(tree_bytes(sub) for _path, sub in local.submodules)


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def check_room(session: HostSession, free: int | None, needed: int, what: str) -> None:
    """Refuse before anything is written when the workdir's filesystem cannot take `needed` more bytes
    (69, with the numbers and the way to make room), rather than fail half-way through a checkout."""
    if free is None or free >= needed + ROOM_MARGIN:
        return
    mb = 1 << 20
    raise ThrustError(
        f"{session.paths.workdir} on {session.name} has {free / mb:.0f} MB free; {what} needs about "
        f"{(needed + ROOM_MARGIN) / mb:.0f} MB",
        f"make room there: remove the trees of old runs with "
        f"{command_hint('prune', host=session.host)} (--dry-run shows them first), or give "
        f"hosts.{session.name}.workdir a disk with room",
        ExitCode.UNAVAILABLE,
    )


def with_lfs(local: LocalState) -> LocalState:
    """`local` with its Git LFS files found (every level: submodules too), once; what sync sends and what
    make_tree places."""
    if local.lfs is not None:
        return local
    return replace(local, lfs=lfs_files(local.root),
                   submodules=tuple((path, with_lfs(sub)) for path, sub in local.submodules))


def _sync_submodules(session: HostSession, local: LocalState, result: SyncResult, step: Step,
                     files: Sequence[str] | None = None) -> None:
    """Each checked-out submodule's objects, into a store of its own (`.thrust/modules/<path>`): its
    commit (the one the laptop has checked out), its own patch, its own submodules. A submodule that is
    not checked out here is an empty directory in the tree, as it is here. `files`: the job's, of which
    those under a submodule are that submodule's (relative to it)."""
    for path, sub in local.submodules:
        store = f"{session.paths.modules}/{_module_dir(path)}"
        sub_session = replace(session, paths=HostPaths(store))
        inside = None if files is None else [posixpath.relpath(f, path) for f in files if _under(f, (path,))]
        done = sync(sub_session, sub, step=lambda m, p=path: step(f"{p}: {m}"), files=inside)
        result.submodules[path] = done
        result.warnings += [f"submodule {path}: {w}" for w in done.warnings]
    result.not_sent = tuple(local.absent_submodules)


def _module_dir(path: str) -> str:
    """A submodule path as one directory name under .thrust/modules (`a/b` -> `a%2Fb`): stores of
    nested paths never sit inside one another."""
    return path.replace("%", "%25").replace("/", "%2F")


def _first_sync(session: HostSession, local: LocalState, step: Step, state: dict) -> dict:
    """A new workdir, owner-only (0700): cloned from origin (objects only) when the host can reach it,
    else `git init` (and a bundle). Refused, before anything is written, when it is the account's home
    or a directory that holds files and is not a thrust-remote workdir (its files are not ours)."""
    workdir = session.paths.workdir
    _refuse_foreign(session, state)
    step(f"first sync: setting up {workdir}")
    cloned = False
    if local.origin:
        res = session.runner.run(["git", "clone", "-q", "--no-checkout", "--", local.origin, workdir], timeout=300)
        cloned = res.ok
    if not cloned:
        session.runner.makedirs(workdir)
        _host_git(session, "init", "-q").check("git init on the host")
    session.runner.run(["chmod", "700", "--", workdir]).check(f"making {workdir} private")
    return _host_state(session, local.commit, local)


def _refuse_foreign(session: HostSession, state: dict) -> None:
    workdir, name = session.paths.workdir, session.name
    where = f"hosts.{name}.workdir"
    if workdir.rstrip("/") == session.runner.home().rstrip("/"):
        raise ThrustError(f"the workdir on {name} is the account's home directory ({workdir}): thrust-remote keeps "
                          "a repository, its runs and their trees there",
                          f"give {where} a directory of its own, e.g. ~/thrust", ExitCode.UNAVAILABLE)
    if state.get("entries") and ".thrust" not in (state.get("some") or []):
        shown = ", ".join(state.get("some") or [])
        raise ThrustError(f"{workdir} on {name} is not empty ({state['entries']} entries: {shown}"
                          f"{', ...' if state['entries'] > 5 else ''}) and is not a thrust-remote workdir: "
                          "its files are not ours to take over",
                          f"give {where} a new or empty directory (it is made for you)", ExitCode.UNAVAILABLE)


@dataclass(frozen=True)
class Bundle:
    """A bundle made on the laptop, sent once the busy check has passed."""

    path: Path
    ref: str  # the ref it carries (the laptop's name)
    target: str  # the commit it carries: the local commit, or the stand-in for its tree
    why: str = ""  # a stand-in: why the history could not be sent


def _reach_commit(session: HostSession, local: LocalState, state: dict, method: str, tmp: Path,
                  step: Step) -> tuple[str, Bundle | None]:
    """The host lacks the commit: it fetches it from origin (objects only: the checkout is untouched),
    else a bundle is made here. (method, the bundle to send)"""
    if local.origin:
        step("fetching the commit from origin on the host")
        fetched = _host_git(session, "fetch", "-q", "--", local.origin, local.commit, timeout=300).ok
        if fetched and _host_git(session, "cat-file", "-e", f"{local.commit}^{{commit}}").ok:
            return ("fetch" if method != "clone" else "clone"), None
    return "bundle", _make_bundle(local, set(state.get("known") or ()), tmp)


def _bundle(root: Path, commit: str, exclude: list[str], path: Path) -> tuple[str, str]:
    """`git bundle create` of `commit` under a ref of this thread's own: (ref, git's error or "")."""
    # per thread: the nodes of a run over several hosts (or optimize's hosts) sync at once from one
    # repository, and a shared name would be deleted under another thread's bundle
    mine = f"refs/thrust/sync-{os.getpid()}-{threading.get_ident()}"
    _git(root, "update-ref", mine, commit)
    try:
        made = _git(root, "bundle", "create", "-q", str(path), mine, *exclude, check=False)
    finally:
        _git(root, "update-ref", "-d", mine, check=False)
    return mine, "" if made.returncode == 0 else made.stderr.decode(errors="replace").strip()


def _make_bundle(local: LocalState, known: set[str], tmp: Path) -> Bundle:
    # What the host already has and we know too: those commits (and their history) stay out.
    exclude = [
        f"^{c}" for c in sorted(known)
        if _git(local.root, "cat-file", "-e", f"{c}^{{commit}}", check=False).returncode == 0
    ]
    path = tmp / "sync.bundle"
    ref, error = _bundle(local.root, local.commit, exclude, path)
    if not error:
        return Bundle(path, ref, local.commit)
    if not UNREADABLE.search(error):
        raise ThrustError(f"git bundle create in {local.root} failed: {error[-400:]}")
    # The history cannot be read (a promisor out of reach, a damaged object store) but the run needs
    # only the tree: when that is complete it goes alone, as a parentless stand-in commit. A made-up
    # history (or a shallow boundary at HEAD) would claim more than we know; the stand-in says what it is.
    missing = missing_in_tree(local.root, local.commit)
    if missing:
        shown = ", ".join(missing[:5]) + ("…" if len(missing) > 5 else "")
        raise ThrustError(
            f"{local.root}: the commit {local.commit[:12]} cannot be sent: its own files are missing from "
            f"the object store ({len(missing)}: {shown}); git said: {error.splitlines()[-1]}",
            f"cd {shlex.quote(str(local.root))} && git fsck, then fetch the missing objects again (git fetch "
            "from a remote that has them), or reclone",
            ExitCode.TRANSFER,
        )
    stand_in = tree_commit(local.root, local.commit)
    ref, again = _bundle(local.root, stand_in, [], path)
    if again:
        raise ThrustError(f"git bundle create of the tree of {local.commit[:12]} failed: {again[-400:]}")
    why = (f"the history of {local.commit[:12]} cannot be read in {local.root} ({error.splitlines()[-1]}): "
           f"the host got its tree alone, as commit {stand_in[:12]} (run.json: sync \"tree\"); `git fsck` "
           "says what is missing")
    return Bundle(path, ref, stand_in, why)


def _send_bundle(session: HostSession, local: LocalState, bundle: Bundle) -> bool:
    """Send and fetch `bundle` on the host; True when a shallow boundary went with it."""
    # a name of its own: syncs at once into one store (several `train`s, from one clone or several) each
    # send their own bundle, and git-receive deletes only its own
    remote = f"{session.paths.thrust}/{BUNDLES}/{secrets.token_hex(8)}.bundle"
    session.runner.put(bundle.path, remote)  # put makes the parent directories; a failed one leaves nothing
    # a shallow clone's bundle stops at commits whose parents the host may lack: the host is told to
    # stop there too (git-receive writes them to its .git/shallow); a stand-in has no parents at all
    shallow = local.shallow if bundle.target == local.commit else ()
    # "+": the ref moves wherever the laptop's HEAD went (amend, rebase, another branch), not only forward
    res = session.agent("git-receive", "--workdir", session.paths.workdir, "--bundle", remote,
                        "--refspec", f"+{bundle.ref}:{HOST_REF}", *[a for c in shallow for a in ("--shallow", c)],
                        timeout=300)
    res.check(f"fetching the bundle in {session.paths.workdir} on {session.name}")
    try:
        return bool(json.loads(res.stdout.strip().splitlines()[-1]).get("shallow"))
    except (ValueError, IndexError):
        return False


def _send_lfs(session: HostSession, local: LocalState, missing: Iterable[str], step: Step) -> None:
    """The LFS objects the host lacks, into its .git/lfs/objects (where git-lfs keeps them too)."""
    wanted = set(missing)
    files = {f.oid: f.source for f in local.lfs or () if f.oid in wanted and f.source is not None}
    if not files:
        return
    step(f"sending {len(files)} Git LFS file(s)")
    objects = f"{session.paths.workdir}/.git/lfs/objects"
    where = {oid: f"{objects}/{oid[:2]}/{oid[2:4]}/{oid}" for oid in files}  # git-lfs's own layout
    sent = session.runner.put_many([(source, where[oid]) for oid, source in files.items()])
    for (oid, source), sha in zip(files.items(), sent, strict=True):
        if sha != oid:
            # in place under its object id, which the host's checkout trusts: not a file to leave there
            session.runner.run(["rm", "-f", "--", where[oid]])
            raise ThrustError(f"{source} changed while it was sent (sha256 {sha[:12]}, expected {oid[:12]})",
                              "train again once it is written", ExitCode.TRANSFER)


@dataclass(frozen=True)
class TreeData:
    """What a tree gets beyond the code (run/data.py): `files:` as {path in the tree: (sha256,
    mtime_ns)}, the `setup:` outputs' key (None: no setup), the `shared:` paths."""

    files: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    setup_key: str | None = None
    shared: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tree:
    """A run's tree on the host: where it is, and whether a setup's kept outputs were placed in it."""

    path: str
    head: str
    setup: str  # "placed" | "none" | "missing" (agent tree-add)


class TreeRefused(ThrustError):
    """tree-add refused (exit 3): `answer` says why (a shared path the commit has files under...)."""

    def __init__(self, message: str, answer: dict) -> None:
        super().__init__(message, None, ExitCode.CONFIG)
        self.answer = answer


def make_tree(session: HostSession, local: LocalState, result: SyncResult, tree: str, *, ref: str | None,
              data: TreeData | None = None, step: Step = lambda _: None,
              send: Callable[[list[str]], None] | None = None) -> Tree:
    """A new tree at `tree` for one run: the synced commit (`sync` first), the patch, the LFS content,
    each submodule, then `data` (files:, setup: outputs, shared:). `ref` names the tree's ref (the run
    id): the commit stays reachable while the tree lives. `send(shas)`: the content store lacks these
    objects (a file changed on the host since it was sent): send them, and the tree is made again."""
    data = data or TreeData()
    extra = {"submodules": _submodule_trees(session, local, result),
             "files": {rel: {"sha256": sha, "mtime_ns": mtime} for rel, (sha, mtime) in data.files.items()},
             "setup": data.setup_key, "shared": list(data.shared)}
    target = result.checkout or result.commit
    argv = ["tree-add", "--workdir", session.paths.workdir, "--tree", tree, "--commit", target,
            "--patch", _patch_on_host(session, local), *(["--ref", ref] if ref else []),
            *[f"--lfs={f.spec}" for f in local.lfs or ()], "--stdin"]  # one word each: a path may start with "-"
    step(f"making the run's tree at {target[:12]}{' + patch' if local.patch else ''}")
    sent = False
    for attempt in range(TREE_ADD_TRIES):
        res = session.agent(*argv, stdin=json.dumps(extra).encode(), timeout=600)
        answer = _last_json(res.stdout)
        if res.exit_code == 3 and answer.get("error") == "missing" and send is not None and not sent:
            send(list(answer.get("missing") or []))
            sent = True
            continue
        # another run's tree being added at this moment (a failed add removes what it made): again
        if not res.ok and res.exit_code != 3 and WORKTREE_BEING_ADDED.search(res.stderr) \
                and attempt < TREE_ADD_TRIES - 1:
            time.sleep(0.1 * 2 ** attempt)
            continue
        break
    if res.exit_code == 3:
        raise TreeRefused(f"cannot make the run's tree on {session.name}: {answer}", answer)
    if not res.ok or "tree" not in answer:
        raise ThrustError(f"making the run's tree at {target[:12]} on {session.name} failed: "
                          f"{res.stderr.strip()[-400:]}")
    if answer.get("head") != target:
        raise ThrustError(f"the run's tree on {session.name} is at {str(answer.get('head'))[:12]}, "
                          f"expected {target[:12]}")
    return Tree(tree, target, str(answer.get("setup") or "none"))


def _last_json(text: str) -> dict:
    try:
        answer = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}
    return answer if isinstance(answer, dict) else {}


def _patch_on_host(session: HostSession, local: LocalState) -> str:
    """The uncommitted patch on the host, by its sha256 (`.thrust/patches/SHA.patch`; sent once), or ""."""
    if not local.patch:
        return ""
    remote = f"{session.paths.patches}/{local.patch_sha256}.patch"
    if not session.runner.exists(remote):
        with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
            tmp.write(local.patch)
            tmp.flush()
            session.runner.put(tmp.name, remote)
    return remote


def _submodule_trees(session: HostSession, local: LocalState, result: SyncResult, prefix: str = "") -> list[dict]:
    """Each synced submodule (nested ones after their parent), as tree-add places it: its path in the
    tree, its store, its commit, its patch on the host and its LFS content."""
    out = []
    for path, sub in local.submodules:
        done = result.submodules.get(path)
        if done is None:
            continue
        store = f"{session.paths.modules}/{_module_dir(path)}"
        sub_session = replace(session, paths=HostPaths(store))
        out.append({"path": f"{prefix}{path}", "store": store, "commit": done.checkout or done.commit,
                    "patch": _patch_on_host(sub_session, sub), "lfs": [f.spec for f in sub.lfs or ()]})
        out += _submodule_trees(sub_session, sub, done, f"{prefix}{path}/")
    return out


def _warnings(local: LocalState, files: Sequence[str] | None = None) -> list[str]:
    out = []
    if local.patch:
        changed = _git(local.root, "diff", "HEAD", "--name-only", *DIFF_SCOPE).stdout.decode().split()
        out.append(
            f"uncommitted changes sent as a patch ({len(local.patch)} bytes, {len(changed)} "
            f"file{'' if len(changed) == 1 else 's'}: "
            f"{', '.join(changed[:5])}{'…' if len(changed) > 5 else ''}); commit them to make the run reproducible"
        )
    placed = _placed_models(local.root)
    # what the job sends by content is untracked as far as git knows, but not unsent (a file the user
    # listed there is data they know git does not carry): the job's own, else every job's as a stand-in
    sent = _sent_as_files(local.root) if files is None else tuple(sorted({posixpath.normpath(f) for f in files}))
    untracked = [u for u in local.untracked
                 if not _tool_owned(u, local.root) and u not in placed and not _under(u, sent)]
    if untracked:
        shown = ", ".join(untracked[:5]) + ("…" if len(untracked) > 5 else "")
        files = "1 untracked file was" if len(untracked) == 1 else f"{len(untracked)} untracked files were"
        them = "it" if len(untracked) == 1 else "them"
        out.append(f"{files} not sent: {shown} (`git add` {them} to send {them}, "
                   f"or list {them} in .gitignore to silence this)")
    linked = [p for p in local.absent_submodules if os.path.islink(local.root / p)]
    absent = [p for p in local.absent_submodules if p not in linked]
    if absent:
        shown = ", ".join(absent[:5])
        out.append(f"submodule(s) not checked out here were not sent (empty on the host too): {shown} "
                   "(`git submodule update --init --recursive` to send them)")
    if linked:
        shown = ", ".join(f"{p} -> {os.readlink(local.root / p)}" for p in linked[:5])
        out.append(f"submodule path(s) that are links here were not sent (a repository elsewhere is not the "
                   f"project's; empty directories on the host): {shown} (check the submodule out in place: "
                   "`git submodule update --init` once the link is gone)")
    return out


def _sent_as_files(root: Path) -> tuple[str, ...]:
    """The paths the project's thrust.yaml sends by content (`files:`, the top level's and every job's):
    untracked as far as git knows, but not unsent, so not in the warning (whichever job runs: a file the
    user listed there is data they know git does not carry, not code they forgot to add)."""
    path = root / CONFIG_NAME
    try:
        config = parse_config_text(read_text(path), path)
    except (OSError, ThrustError):
        return ()
    listed = {*config.files, *(f for job in config.jobs.values() for f in job.files or ())}
    return tuple(sorted({posixpath.normpath(f) for f in listed}))


def _under(path: str, tops: Iterable[str]) -> bool:
    return any(path == top or path.startswith(top.rstrip("/") + "/") or top == "." for top in tops)


def _placed_models(root: Path) -> set[str]:
    """The files a fetch placed (a model under web/public/ and its manifest and metrics): this tool's
    output, not code the run lacks. Read from the kept models' fetch.json `target`s."""
    out: set[str] = set()
    for row in models.list_kept(root):
        target = Path(str(row.get("target") or ""))
        if not row.get("target"):
            continue
        if target.is_absolute():
            try:
                target = target.resolve().relative_to(root.resolve())
            except ValueError:
                continue
        stem = target.with_suffix("")
        out |= {target.as_posix(), f"{stem.as_posix()}.json", f"{stem.as_posix()}.metrics.jsonl"}
    return out


def _tool_owned(path: str, root: Path | None = None) -> bool:
    """thrust.yaml, .thrust/ and optimize's best params are this tool's own files, not code the run is
    missing: no warning."""
    if Path(path).name == CONFIG_NAME or Path(path).parts[:1] == (".thrust",):
        return True
    if root is None or not path.endswith(BEST_PARAMS_SUFFIX):
        return False
    try:
        with (root / path).open(encoding="utf-8", errors="replace") as fh:
            return fh.readline().rstrip().endswith(BEST_PARAMS_MARK)
    except OSError:
        return False
