"""The walk over a run's artifact globs: the files they match on the host, each hashed as it is listed.

What `agent list-files` answers (listing.py, which chooses the window: a run's own files) and where a
cluster's run continuing itself finds its newest checkpoint (its scheduler's module). A glob is relative to
`cwd`; one that starts with `$THRUST_RUN_DIR/` is relative to the run directory. `**` matches any
depth; a directory that matches stands for every file under it. `*`, `?` and `[...]` match names
that start with a dot too (`out/**` lists `out/.hidden`, `out/..foo`): an artifact is whatever the job
wrote. Only regular files are listed, each once. Files modified before `since` or after `until` are
counted ("older", "newer"), not listed.

Links and hostile trees (docs/architecture.md, "Security"): the walk never follows a symlinked
directory (one is reported in "links", once, and not entered: no loop, no copy of /etc), so it ends;
a symlink to a file is listed by its real path only when that lies under its base, else refused. A
match whose real path is outside its base (a symlink out, a `..`) is refused, never listed: the
laptop fetches only what is under the workdir or the run dir (docs/architecture.md, "Artifacts").
Each file is opened without following a symlink and listed with the dev/ino it was hashed from, so
the transfer (`xfer get PATH DEV INO`) sends that file or nothing. An unreadable file or directory
is reported in "unreadable" and the rest is listed. The walk stops at `--deadline` seconds: exit 3
with {"error": "deadline", "glob", "seconds"} (the glob it was on).

Answer: {"cwd", "files": [{"base": "cwd" | "run", "path" (relative to the base, '/'-separated),
"abs", "size", "mtime", "mode", "dev", "ino", "sha256"}], "unmatched": [GLOB...], "refused": [GLOB or
PATH...], "links": [PATH...], "unreadable": [{"path", "error"}], "older": N, "newer": N}; a path
under the run directory is named `$THRUST_RUN_DIR/PATH` in "refused", "links" and "unreadable".
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
import time

from .protocol import DEADLINE_ERROR as DEADLINE_ERROR  # re-exported: listing answers with it
from .protocol import RUN_DIR_PREFIX

BLOCK = 1 << 20
OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # no link, no FIFO wait


class DeadlineHit(Exception):  # noqa: N818 - an event, answered as {"error": "deadline"}
    """The listing ran past its deadline while on `glob`."""

    def __init__(self, glob: str) -> None:
        super().__init__(glob)
        self.glob = glob


def _hash_regular(path: str) -> tuple[os.stat_result, str] | None:
    """(fstat, sha256) of the regular file at path, opened without following a link; None when a
    symlink or something other than a regular file stands there now."""
    try:
        fd = os.open(path, OPEN_FLAGS)
    except OSError:
        if os.path.islink(path):
            return None
        raise
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        digest = hashlib.sha256()
        for block in iter(lambda: fh.read(BLOCK), b""):
            digest.update(block)
    return st, digest.hexdigest()


def _bad_glob(pattern: str) -> bool:
    parts = pattern.replace("\\", "/").split("/")
    return not pattern.strip() or pattern.startswith(("/", "~")) or ".." in parts


def _segments(pattern: str) -> list[str]:
    """The pattern's path segments; `.` and empty ones dropped, a run of `**` kept once."""
    out: list[str] = []
    for seg in pattern.split("/"):
        if seg in ("", ".") or (seg == "**" and out[-1:] == ["**"]):
            continue
        out.append(seg)
    return out


def _magic(seg: str) -> bool:
    return any(c in seg for c in "*?[")


class Walk:
    """One base's walk: what a glob names under it, never through a symlinked directory."""

    def __init__(self, base: str, label: str, deadline: float | None) -> None:
        self.base = base
        self.label = label  # "" for the cwd, "$THRUST_RUN_DIR/" for the run dir: how paths are reported
        self.inside = os.path.realpath(base).rstrip(os.sep) + os.sep
        self.deadline = deadline
        self.glob = ""
        self.links: set[str] = set()
        self.refused: set[str] = set()
        self.unreadable: dict[str, str] = {}

    def tick(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise DeadlineHit(self.glob)

    def full(self, rel: str) -> str:
        return os.path.join(self.base, rel) if rel else self.base

    def _entries(self, rel: str) -> list[os.DirEntry]:
        self.tick()
        try:
            with os.scandir(self.full(rel)) as it:
                return sorted(it, key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.unreadable[self.label + (rel or ".")] = exc.strerror or str(exc)
            return []

    def _descend(self, rel: str, entry: os.DirEntry | None = None) -> bool:
        """Whether rel is a directory to walk into: a real one, not a symlink (noted in links)."""
        try:
            if entry is not None:
                if entry.is_dir(follow_symlinks=False):
                    return True
                is_link = entry.is_symlink()
            else:
                st = os.lstat(self.full(rel))
                if stat.S_ISDIR(st.st_mode):
                    return True
                is_link = stat.S_ISLNK(st.st_mode)
            if is_link and os.path.isdir(self.full(rel)):
                self._link(rel, os.path.realpath(self.full(rel)))
        except OSError:
            pass
        return False

    def _link(self, rel: str, real: str) -> None:
        """A symlinked directory, not entered: refused when it points out of the base, else a link."""
        (self.links if real.startswith(self.inside) else self.refused).add(self.label + rel)

    def matches(self, rel: str, segs: list[str]):  # noqa: ANN201 - an iterator of relative paths
        """The paths (relative to the base) that segs names under rel; directories among them too."""
        if not segs:
            yield rel
            return
        seg, rest = segs[0], segs[1:]
        if seg == "**":
            if not rest:
                yield rel  # the directory itself: it stands for every file under it
                return
            yield from self.matches(rel, rest)
            for entry in self._entries(rel):
                child = os.path.join(rel, entry.name)
                if self._descend(child, entry):
                    yield from self.matches(child, segs)
        elif not _magic(seg):
            child = os.path.join(rel, seg)
            if not rest:
                if os.path.lexists(self.full(child)):
                    yield child
            elif self._descend(child):
                yield from self.matches(child, rest)
        else:
            for entry in self._entries(rel):
                if not fnmatch.fnmatchcase(entry.name, seg):
                    continue
                child = os.path.join(rel, entry.name)
                if not rest:
                    yield child
                elif self._descend(child, entry):
                    yield from self.matches(child, rest)

    def files(self, rel: str):  # noqa: ANN201 - an iterator of (rel, abs path)
        """The regular files a match stands for: itself, a symlink's target inside the base, or every
        file under a directory (symlinked directories below it are not entered)."""
        path = self.full(rel)
        try:
            st = os.lstat(path) if rel else os.stat(path)  # the base itself may be reached through a link
        except FileNotFoundError:
            return
        except OSError as exc:
            self.unreadable[self.label + rel] = exc.strerror or str(exc)
            return
        if stat.S_ISREG(st.st_mode):
            yield rel, path
        elif stat.S_ISLNK(st.st_mode):
            real = os.path.realpath(path)
            if os.path.isdir(real):
                self._link(rel, real)
            elif not real.startswith(self.inside):
                self.refused.add(self.label + rel)  # a symlink out of its base
            elif os.path.isfile(real):
                yield rel, real
        elif stat.S_ISDIR(st.st_mode):
            for entry in self._entries(rel):
                yield from self.files(os.path.join(rel, entry.name))


# file times come from the kernel's coarse clock, which may lag time.time() by a tick or two
MTIME_SLACK_S = 0.05
# the run's last files are written before its process exits and the supervisor records the end: a
# second covers that, and a later run of the same workdir starts after a sync and a launch anyway
ENDED_SLACK_S = 1.0


def list_files(cwd: str, run_dir: str, patterns: list[str], since: float | None = None,
               until: float | None = None, deadline_s: float | None = None) -> dict:
    deadline = None if deadline_s is None else time.monotonic() + deadline_s
    files: dict[str, dict] = {}
    older: set[str] = set()
    newer: set[str] = set()
    unmatched: list[str] = []
    walks = {"cwd": Walk(cwd, "", deadline), "run": Walk(run_dir, RUN_DIR_PREFIX, deadline)}
    refused: list[str] = []
    for pattern in patterns:
        base_name, rel_pattern = "cwd", pattern
        if pattern.startswith(RUN_DIR_PREFIX):
            base_name, rel_pattern = "run", pattern[len(RUN_DIR_PREFIX):]
        if _bad_glob(rel_pattern):
            refused.append(pattern)
            continue
        walk = walks[base_name]
        walk.glob = pattern
        found = 0
        for match in walk.matches("", _segments(rel_pattern)):
            for rel, path in walk.files(match):
                walk.tick()
                key = f"{base_name}:{rel}"
                if key in files:
                    found += 1
                    continue
                try:
                    hashed = _hash_regular(path)
                except OSError as exc:
                    walk.unreadable[walk.label + rel] = exc.strerror or str(exc)
                    continue
                if hashed is None:
                    continue  # replaced by a link or a special file while we looked
                st, sha = hashed
                if base_name == "cwd" and since is not None and st.st_mtime < since - MTIME_SLACK_S:
                    older.add(key)
                    continue
                if base_name == "cwd" and until is not None and st.st_mtime > until + ENDED_SLACK_S:
                    newer.add(key)
                    continue
                found += 1
                files[key] = {"base": base_name, "path": rel.replace(os.sep, "/"), "abs": path, "size": st.st_size,
                              "mtime": st.st_mtime, "mode": stat.S_IMODE(st.st_mode), "dev": st.st_dev,
                              "ino": st.st_ino, "sha256": sha}
        if not found:
            unmatched.append(pattern)
    for walk in walks.values():
        refused += sorted(walk.refused)
    return {"cwd": cwd, "files": list(files.values()), "unmatched": unmatched, "refused": refused,
            "links": sorted(set().union(*(w.links for w in walks.values()))),
            "unreadable": [{"path": p, "error": e} for w in walks.values() for p, e in sorted(w.unreadable.items())],
            "older": len(older), "newer": len(newer)}
