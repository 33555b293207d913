"""Put the host's checkout at exactly the local commit, plus the local uncommitted changes.

- The host fetches the commit from the local repo's origin when it can reach it (the guide's
  `git pull`); otherwise a `git bundle` of only the commits the host lacks goes over SFTP.
- A first sync onto an empty workdir clones (or `git init` + bundle).
- Uncommitted changes to tracked files travel as a binary patch, applied with `--index` so the next
  sync's `reset --hard` removes them again; untracked files are listed, not copied.
- `.git` is never copied; untracked files on the host (target/, caches, .thrust/) are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from thrust_remote.core.config import CONFIG_NAME
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.session import HostSession
from thrust_remote.runs.control import see_or_stop

Step = Callable[[str], None]


@dataclass(frozen=True)
class LocalState:
    root: Path
    commit: str
    patch: bytes = b""
    untracked: tuple[str, ...] = ()
    origin: str | None = None

    @property
    def dirty(self) -> bool:
        return bool(self.patch)

    @property
    def patch_sha256(self) -> str | None:
        return hashlib.sha256(self.patch).hexdigest() if self.patch else None


@dataclass
class SyncResult:
    commit: str
    method: str  # "up-to-date" | "fetch" | "bundle" | "clone" | "local"
    dirty: bool
    patch_sha256: str | None
    untracked: tuple[str, ...]
    bundle_bytes: int = 0
    warnings: list[str] = field(default_factory=list)

    def as_meta(self) -> dict:
        return {
            "commit": self.commit,
            "sync": self.method,
            "dirty": self.dirty,
            "patch_sha256": self.patch_sha256,
            "untracked": list(self.untracked),
        }


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True)
    if check and result.returncode != 0:
        raise ThrustError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace').strip()}")
    return result


def local_state(root: Path) -> LocalState:
    """What the laptop has: HEAD, the uncommitted diff, untracked files, origin's URL."""
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
    patch = _git(top, "diff", "HEAD", "--binary", "--no-color", "--no-ext-diff").stdout
    untracked = _git(top, "ls-files", "--others", "--exclude-standard", "-z").stdout.decode().split("\0")
    origin = _git(top, "remote", "get-url", "origin", check=False)
    return LocalState(
        root=top,
        commit=head.stdout.decode().strip(),
        patch=patch,
        untracked=tuple(u for u in untracked if u),
        origin=origin.stdout.decode().strip() if origin.returncode == 0 else None,
    )


def _host_git(session: HostSession, *args: str, timeout: float = 120):
    """git on the host, in the workdir."""
    return session.runner.run(["git", "-C", session.paths.workdir, *args], timeout=timeout)


def _host_state(session: HostSession, commit: str) -> dict:
    """One round trip: the agent's git-state (docs/architecture.md, "The host agent")."""
    res = session.agent("git-state", "--workdir", session.paths.workdir, "--commit", commit, timeout=120)
    try:
        state = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        state = {}
    if not res.ok or "git" not in state:
        raise ThrustError(f"cannot inspect {session.paths.workdir} on {session.runner.name}: "
                          f"{res.stderr.strip()[-300:]}")
    return state


def sync(session: HostSession, local: LocalState, *, step: Step = lambda _: None,
         busy: Callable[[], list[str]] | None = None) -> SyncResult:
    """`busy` lists the runs that still use the workdir: the tree is never changed under them."""
    runner, workdir = session.runner, session.paths.workdir
    state = _host_state(session, local.commit)
    if not state["git"]:
        raise ThrustError(
            f"git is not installed on {runner.name}",
            "install it there (e.g. apt-get install git)",
            ExitCode.UNAVAILABLE,
        )
    method = "up-to-date"
    if not state.get("repo"):
        method = "clone"
        state = _first_sync(session, local, step)
    patch_id = local.patch_sha256 or "none"
    untouched = (
        state.get("head") == local.commit
        and state.get("applied", "").split() == [patch_id, state.get("current")]
    )
    if untouched:
        step(f"{workdir} is already at {local.commit[:12]}" + (" with the same patch" if local.patch else ""))
        return SyncResult(local.commit, "up-to-date", local.dirty, local.patch_sha256, local.untracked, 0,
                          _warnings(local))
    running = busy() if busy and state.get("repo") else []
    if running:
        # Runs of the same commit and patch share the workdir freely (the `untouched` return above);
        # other code would change under these runs (docs/architecture.md, "Concurrent runs").
        what = f"{local.commit[:12]}{' + uncommitted changes' if local.patch else ''}"
        first, name = running[0], session.name
        raise ThrustError(
            f"{workdir} on {name} is in use by running run(s) {', '.join(running)}; syncing {what} "
            "would change their code under them",
            f"{see_or_stop(first, session.host)}; or wait for it to end "
            f"({command_hint('logs', first, '-f', host=session.host)}), or give this host another workdir",
        )
    bundle_bytes = 0
    if not state.get("have"):
        method, bundle_bytes = _bring_commit(session, local, state, method, step)
    _checkout(session, local, patch_id, step)
    return SyncResult(local.commit, method, local.dirty, local.patch_sha256, local.untracked, bundle_bytes,
                      _warnings(local))


def _first_sync(session: HostSession, local: LocalState, step: Step) -> dict:
    """An empty workdir: clone from origin when the host can reach it, else `git init` (and a bundle)."""
    workdir = session.paths.workdir
    step(f"first sync: setting up {workdir}")
    cloned = False
    if local.origin:
        res = session.runner.run(["git", "clone", "-q", "--no-checkout", "--", local.origin, workdir], timeout=300)
        cloned = res.ok
    if not cloned:
        session.runner.makedirs(workdir)
        _host_git(session, "init", "-q").check("git init on the host")
    return _host_state(session, local.commit)


def _bring_commit(session: HostSession, local: LocalState, state: dict, method: str, step: Step) -> tuple[str, int]:
    """The host lacks the commit: fetch it from origin there, else send a bundle. (method, bundle bytes)"""
    if local.origin:
        step("fetching the commit from origin on the host")
        fetched = _host_git(session, "fetch", "-q", "--", local.origin, local.commit, timeout=300).ok
        if fetched and _host_git(session, "cat-file", "-e", f"{local.commit}^{{commit}}").ok:
            return ("fetch" if method != "clone" else "clone"), 0
    step("sending the missing commits as a git bundle")
    return "bundle", _send_bundle(session, local, set(state.get("known") or ()))


def _checkout(session: HostSession, local: LocalState, patch_id: str, step: Step) -> None:
    remote_patch = ""
    if local.patch:
        step("sending uncommitted changes as a patch")
        remote_patch = f"{session.paths.thrust}/sync.patch"
        with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
            tmp.write(local.patch)
            tmp.flush()
            session.runner.put(tmp.name, remote_patch)
    step(f"checking out {local.commit[:12]}")
    res = session.agent("git-checkout", "--workdir", session.paths.workdir, "--commit", local.commit,
                        "--patch", remote_patch, "--patch-id", patch_id, timeout=300)
    if not res.ok:
        raise ThrustError(f"checking out {local.commit[:12]} on {session.runner.name} failed: "
                          f"{res.stderr.strip()[-400:]}")
    try:
        head = json.loads(res.stdout.strip().splitlines()[-1]).get("head", "")
    except (ValueError, IndexError):
        head = ""
    if head != local.commit:
        raise ThrustError(f"the host's checkout is at {head[:12]}, expected {local.commit[:12]}")


def _warnings(local: LocalState) -> list[str]:
    out = []
    if local.patch:
        changed = _git(local.root, "diff", "HEAD", "--name-only").stdout.decode().split()
        out.append(
            f"uncommitted changes sent as a patch ({len(local.patch)} bytes, {len(changed)} files: "
            f"{', '.join(changed[:5])}{'…' if len(changed) > 5 else ''}); commit them to make the run reproducible"
        )
    untracked = [u for u in local.untracked if not _tool_owned(u)]
    if untracked:
        shown = ", ".join(untracked[:5]) + ("…" if len(untracked) > 5 else "")
        out.append(f"{len(untracked)} untracked files were not sent: {shown} (`git add` them to send them, "
                   "or list them in .gitignore to silence this)")
    return out


def _tool_owned(path: str) -> bool:
    """thrust.yaml and .thrust/ are this tool's own files, not code the run is missing: no warning."""
    return Path(path).name == CONFIG_NAME or Path(path).parts[:1] == (".thrust",)


def _send_bundle(session: HostSession, local: LocalState, known: set[str]) -> int:
    # What the host already has and we know too: those commits (and their history) stay out.
    exclude = [
        f"^{c}" for c in sorted(known)
        if _git(local.root, "cat-file", "-e", f"{c}^{{commit}}", check=False).returncode == 0
    ]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "sync.bundle"
        ref = "refs/thrust/sync"  # the host's name for it
        # ours is per thread: the nodes of a run over several hosts (or optimize's hosts) sync at once
        # from one repository, and a shared name would be deleted under another thread's bundle
        mine = f"refs/thrust/sync-{os.getpid()}-{threading.get_ident()}"
        _git(local.root, "update-ref", mine, local.commit)
        try:
            _git(local.root, "bundle", "create", "-q", str(bundle), mine, *exclude)
        finally:
            _git(local.root, "update-ref", "-d", mine, check=False)
        size = bundle.stat().st_size
        remote = f"{session.paths.thrust}/sync.bundle"
        session.runner.put(bundle, remote)  # put makes the parent directories
    # "+": the ref moves wherever the laptop's HEAD went (amend, rebase, another branch), not only forward
    _host_git(session, "fetch", "-q", remote, f"+{mine}:{ref}").check("fetching the bundle on the host")
    session.runner.run(["rm", "-f", "--", remote])
    return size
