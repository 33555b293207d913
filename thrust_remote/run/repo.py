"""What a local repository holds beyond HEAD and its diff, for sync (docs/architecture.md, "Sync").

- a shallow clone's boundary (`.git/shallow`): the host is told to stop its history there too;
- Git LFS files: the content (the smudged working tree file, or `.git/lfs/objects`), never the pointer;
- submodules: their paths (each is synced as a repository of its own);
- a commit whose history cannot be read (a promisor out of reach, a damaged object store): its tree,
  complete or named as incomplete, as a stand-in commit with that tree and no parents.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.host.runner import sha256_file

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"
GITLINK = "160000"
# a stand-in commit is made the same way every time, so the same tree gives the same sha (and the
# next sync finds the host already at it)
_TREE_COMMIT_ENV = {
    "GIT_AUTHOR_NAME": "thrust-remote", "GIT_AUTHOR_EMAIL": "thrust-remote@localhost",
    "GIT_COMMITTER_NAME": "thrust-remote", "GIT_COMMITTER_EMAIL": "thrust-remote@localhost",
    "GIT_AUTHOR_DATE": "@0 +0000", "GIT_COMMITTER_DATE": "@0 +0000",
}


def git(root: Path, *args: str, check: bool = True, stdin: bytes | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, input=stdin,
                            env={**os.environ, **env} if env else None)
    if check and result.returncode != 0:
        raise ThrustError(f"git {' '.join(args)} failed: {result.stderr.decode(errors='replace').strip()}")
    return result


def _git_path(root: Path, *args: str) -> Path:
    out = Path(git(root, "rev-parse", *args).stdout.decode().strip())
    return out if out.is_absolute() else root / out


@dataclass(frozen=True)
class LfsFile:
    path: str
    oid: str  # sha256 of the content; "" when the file is gone from the working tree
    source: Path | None  # where the content is on the laptop

    @property
    def spec(self) -> str:
        """The agent's `--lfs PATH=OID`."""
        return f"{self.path}={self.oid}"


def shallow_boundary(root: Path) -> tuple[str, ...]:
    """The commits a shallow clone has without their parents (empty for a full clone)."""
    try:
        return tuple(_git_path(root, "--git-path", "shallow").read_text().split())
    except OSError:
        return ()


def _pointer_oid(path: Path) -> str | None:
    """The oid a pointer file names; None when the file is content (not a pointer)."""
    with path.open("rb") as fh:
        head = fh.read(1024)
    if not head.startswith(LFS_POINTER):
        return None
    match = re.search(rb"^oid sha256:([0-9a-f]{64})$", head, re.MULTILINE)
    return match.group(1).decode() if match else None


def lfs_files(root: Path) -> tuple[LfsFile, ...]:
    """Every tracked path with `filter=lfs` (a symlink is not one) and where its content is; refuses
    (naming them) when the laptop has only the pointer: sending it would give the job a 130-byte text
    file for its data."""
    listed = git(root, "ls-files", "-z", "--", ":(attr:filter=lfs)").stdout.decode().split("\0")
    # a symlink is committed as its target's text, never filtered: not LFS content, and whatever it leads
    # to on the laptop is not the project's to send (the tree gets the link, as committed)
    tracked = [p for p in listed if p and not os.path.islink(root / p)]
    if not tracked:
        return ()
    store = _git_path(root, "--git-common-dir") / "lfs" / "objects"
    found, missing = [], []
    for path in tracked:
        file = root / path
        if not file.is_file():
            found.append(LfsFile(path, "", None))
            continue
        oid = _pointer_oid(file)
        if oid is None:
            found.append(LfsFile(path, sha256_file(file), file))
        elif (store / oid[:2] / oid[2:4] / oid).is_file():
            found.append(LfsFile(path, oid, store / oid[:2] / oid[2:4] / oid))
        else:
            missing.append(path)
    if missing:
        shown = ", ".join(missing[:5]) + ("…" if len(missing) > 5 else "")
        # 69: the data exists somewhere (the LFS server) but is not available here; the command line is fine
        raise ThrustError(
            f"{len(missing)} Git LFS file(s) in {root} hold only their pointer, not the data: {shown}; "
            "the host would get the pointer in place of the content",
            # `--exclude ''`: a file lfs.fetchexclude leaves out is fetched too (--include alone does not)
            f"cd {shlex.quote(str(root))} && git lfs pull --include {shlex.quote(','.join(missing))} --exclude '' "
            "(fetches and checks out their content), then train again",
            ExitCode.UNAVAILABLE,
        )
    return tuple(found)


def submodule_paths(root: Path) -> tuple[list[str], list[str]]:
    """(checked out, not checked out) submodule paths of the index; one whose path is a link counts as
    not checked out (it is sent as an empty directory, and the warning names it)."""
    entries = git(root, "ls-files", "-s", "-z").stdout.decode().split("\0")
    paths = [e.split("\t", 1)[1] for e in entries if e.startswith(GITLINK + " ")]
    present = [p for p in paths if (root / p / ".git").exists() and _own_directory(root, p)]
    return present, [p for p in paths if p not in present]


def _own_directory(root: Path, path: str) -> bool:
    """`path` is a directory of the project, reached through no link: a submodule path that leads to a
    repository elsewhere (a link to another of the user's repositories) is not the project's to send."""
    real = (root / path).resolve()
    return real == root.resolve() / path and not os.path.islink(root / path)


def missing_in_tree(root: Path, commit: str) -> list[str]:
    """The objects of `commit`'s tree this repository cannot read, as paths (or shas when unnamed)."""
    listed = git(root, "rev-list", "--objects", "--missing=print", f"{commit}^{{tree}}", check=False)
    if listed.returncode != 0:
        return [f"the tree of {commit[:12]}"]
    shas = [line[1:] for line in listed.stdout.decode().split("\n") if line.startswith("?")]
    if not shas:
        return []
    names = {}
    for line in git(root, "ls-tree", "-r", "-t", "-z", commit, check=False).stdout.decode().split("\0"):
        if "\t" in line:
            meta, path = line.split("\t", 1)
            names[meta.split()[2]] = path
    return [names.get(sha, sha) for sha in shas]


def tree_commit(root: Path, commit: str) -> str:
    """A stand-in for `commit` that carries its tree and nothing of its history (same tree, same sha)."""
    message = f"thrust-remote: the tree of {commit} (its history could not be read)"
    made = git(root, "commit-tree", f"{commit}^{{tree}}", "-m", message, env=_TREE_COMMIT_ENV)
    return made.stdout.decode().strip()
