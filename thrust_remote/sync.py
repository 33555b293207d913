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
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ExitCode, ThrustError
from .runner import Runner
from .runs import HostPaths

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


class _Host:
    """git on the host, in the workdir."""

    def __init__(self, runner: Runner, workdir: str) -> None:
        self.runner = runner
        self.workdir = workdir

    def git(self, *args: str, timeout: float = 120):
        return self.runner.run(["git", "-C", self.workdir, *args], timeout=timeout)


# One round trip to learn the host's state. A constant script: the workdir and commit arrive as
# positional arguments ($1, $2), never spliced into the text.
_STATE_SCRIPT = r"""
command -v git >/dev/null 2>&1 || { echo git=no; exit 0; }
echo git=yes
if [ -d "$1/.git" ] && git -C "$1" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo repo=yes
  echo "head=$(git -C "$1" rev-parse -q --verify HEAD 2>/dev/null)"
  echo "applied=$(cat "$1/.thrust/applied-patch" 2>/dev/null)"
  echo "current=$(git -C "$1" diff HEAD --binary 2>/dev/null | sha256sum | cut -c1-64)"
  if git -C "$1" cat-file -e "$2^{commit}" 2>/dev/null; then echo have=yes; else
    echo have=no
    printf 'known='
    { git -C "$1" rev-parse -q --verify HEAD; git -C "$1" for-each-ref --format='%(objectname)'; } 2>/dev/null \
      | tr '\n' ' '
    echo
  fi
else
  echo repo=no
fi
"""

# One round trip to put the checkout at the commit (and apply the patch when $3 names one).
_CHECKOUT_SCRIPT = r"""
set -e
cd "$1"
mkdir -p .thrust .git/info
grep -qxF /.thrust/ .git/info/exclude 2>/dev/null || printf '%s\n' /.thrust/ >> .git/info/exclude
git reset -q --hard
git checkout -q --force --detach "$2"
if [ -n "$3" ]; then git apply --index --whitespace=nowarn "$3"; fi
# what we left: the local patch's sha and the tree's own diff, so the next sync can tell it is untouched
printf '%s %s\n' "$4" "$(git diff HEAD --binary | sha256sum | cut -c1-64)" > .thrust/applied-patch
git rev-parse HEAD
"""


def _host_state(runner: Runner, workdir: str, commit: str) -> dict[str, str]:
    res = runner.run(["sh", "-c", _STATE_SCRIPT, "sh", workdir, commit], timeout=120)
    state = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    if not res.ok or "git" not in state:
        raise ThrustError(f"cannot inspect {workdir} on {runner.name}: {res.stderr.strip()[-300:]}")
    return state


def sync(runner: Runner, paths: HostPaths, local: LocalState, *, step: Step = lambda _: None,
         busy: Callable[[], list[str]] | None = None) -> SyncResult:
    """`busy` lists the runs that still use the workdir: the tree is never changed under them."""
    host = _Host(runner, paths.workdir)
    warnings: list[str] = []
    method = "up-to-date"
    bundle_bytes = 0
    state = _host_state(runner, paths.workdir, local.commit)
    if state["git"] != "yes":
        raise ThrustError(
            f"git is not installed on {runner.name}",
            "install it there (e.g. apt-get install git)",
            ExitCode.UNAVAILABLE,
        )
    if state.get("repo") != "yes":
        method = "clone"
        step(f"first sync: setting up {paths.workdir}")
        cloned = False
        if local.origin:
            res = runner.run(["git", "clone", "-q", "--no-checkout", "--", local.origin, paths.workdir], timeout=300)
            cloned = res.ok
        if not cloned:
            runner.run(["mkdir", "-p", "--", paths.workdir]).check("mkdir workdir")
            host.git("init", "-q").check("git init on the host")
        state = _host_state(runner, paths.workdir, local.commit)
    patch_id = local.patch_sha256 or "none"
    untouched = (
        state.get("head") == local.commit
        and state.get("applied", "").split() == [patch_id, state.get("current", "")]
    )
    if untouched:
        step(f"{paths.workdir} is already at {local.commit[:12]}" + (" with the same patch" if local.patch else ""))
        return SyncResult(local.commit, "up-to-date", local.dirty, local.patch_sha256, local.untracked, 0,
                          _warnings(local))
    running = busy() if busy and state.get("repo") == "yes" else []
    if running:
        raise ThrustError(
            f"{paths.workdir} on {runner.name} is in use by running run(s) {', '.join(running)}; syncing "
            f"{local.commit[:12]} would change their code under them",
            "wait for them (thrust-remote runs), stop them (thrust-remote stop RUN_ID), or give this host "
            "another workdir",
        )
    if state.get("have") != "yes":
        fetched = False
        if local.origin:
            step("fetching the commit from origin on the host")
            fetched = host.git("fetch", "-q", "--", local.origin, local.commit, timeout=300).ok
            fetched = fetched and host.git("cat-file", "-e", f"{local.commit}^{{commit}}").ok
        if fetched:
            method = "fetch" if method != "clone" else "clone"
        else:
            step("sending the missing commits as a git bundle")
            known = set(state.get("known", "").split())
            bundle_bytes = _send_bundle(runner, host, paths, local, known)
            method = "bundle"
    remote_patch = ""
    if local.patch:
        step("sending uncommitted changes as a patch")
        remote_patch = f"{paths.thrust}/sync.patch"
        with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
            tmp.write(local.patch)
            tmp.flush()
            runner.put(tmp.name, remote_patch)
    step(f"checking out {local.commit[:12]}")
    # reset --hard first drops the previous run's patch (it was applied with --index)
    res = runner.run(["sh", "-c", _CHECKOUT_SCRIPT, "sh", paths.workdir, local.commit, remote_patch, patch_id],
                     timeout=300)
    if not res.ok:
        raise ThrustError(f"checking out {local.commit[:12]} on {runner.name} failed: {res.stderr.strip()[-400:]}")
    head = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
    if head != local.commit:
        raise ThrustError(f"the host's checkout is at {head[:12]}, expected {local.commit[:12]}")
    warnings.extend(_warnings(local))
    return SyncResult(local.commit, method, local.dirty, local.patch_sha256, local.untracked, bundle_bytes, warnings)


def _warnings(local: LocalState) -> list[str]:
    out = []
    if local.patch:
        changed = _git(local.root, "diff", "HEAD", "--name-only").stdout.decode().split()
        out.append(
            f"uncommitted changes sent as a patch ({len(local.patch)} bytes, {len(changed)} files: "
            f"{', '.join(changed[:5])}{'…' if len(changed) > 5 else ''}); commit them to make the run reproducible"
        )
    if local.untracked:
        shown = ", ".join(local.untracked[:5]) + ("…" if len(local.untracked) > 5 else "")
        out.append(f"{len(local.untracked)} untracked files were not sent: {shown}")
    return out


def _send_bundle(runner: Runner, host: _Host, paths: HostPaths, local: LocalState, known: set[str]) -> int:
    # What the host already has and we know too: those commits (and their history) stay out.
    exclude = [
        f"^{c}" for c in sorted(known)
        if _git(local.root, "cat-file", "-e", f"{c}^{{commit}}", check=False).returncode == 0
    ]
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "sync.bundle"
        ref = "refs/thrust/sync"
        _git(local.root, "update-ref", ref, local.commit)
        try:
            _git(local.root, "bundle", "create", "-q", str(bundle), ref, *exclude)
        finally:
            _git(local.root, "update-ref", "-d", ref, check=False)
        size = bundle.stat().st_size
        remote = f"{paths.thrust}/sync.bundle"
        runner.run(["mkdir", "-p", "--", paths.thrust]).check("mkdir .thrust")
        runner.put(bundle, remote)
    # "+": the ref moves wherever the laptop's HEAD went (amend, rebase, another branch), not only forward
    host.git("fetch", "-q", remote, f"+{ref}:{ref}").check("fetching the bundle on the host")
    runner.run(["rm", "-f", "--", remote])
    return size
