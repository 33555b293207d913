"""A run's artifacts brought home: `.thrust/fetched/<run-id>/artifacts/` (docs/architecture.md, "Artifacts").

The host lists what the job's `artifacts:` globs match (agent `list-files`: size, mtime, sha256 of
each file), and each file whose sha256 differs from the local copy's is fetched with the runner's
verified `get` (sha256 on both ends, written to a temporary file and renamed only when they agree). So a
second fetch transfers nothing, a file changed on the host comes again (a TensorBoard dir comes
incrementally), and a cut fetch leaves no half file under its final name: fetching again resumes
with the files still missing. What was fetched is recorded in `.thrust/fetched/<run-id>/artifacts.json`
(host sha256 plus the local size and mtime), so an unchanged local file is not hashed again.

Paths keep their place: a glob under the run's cwd lands in `artifacts/<path>`, one under
`$THRUST_RUN_DIR/` in `artifacts/THRUST_RUN_DIR/<path>`. A glob that matches nothing is a warning.

A file the run's `checkpoints:` names too is in both places: the pull that comes second finds the
same content (sha256) here already, in the other place, and hard-links it (a copy where the filesystem
refuses a link), verified, instead of moving its bytes again (`twins`, `fetch_changed`).

A run's tree is a checkout of its commit: a file the globs match there whose content is still the
commit's (its sha256 is the sha256 of the commit's blob at that path, read from the laptop's own git) is
the project's, not the run's, and is left out, with one warning saying how many (commits_own).

The host may be hostile (docs/architecture.md, "Security"): its answer is checked whole before anything
is written (checked_entries), directories here are made without following links (_parent_dirs), each
file is fetched only while it is the one listed (its dev/ino), keeps the host's mode less the umask,
and Ctrl-C cuts the transfers in flight and keeps what completed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import posixpath
import queue
import re
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import (
    CHECKPOINTS,
    DEADLINE_ERROR,
    RUN_DIR_ENV,
    RUN_DIR_PREFIX,
    RUN_JSON,
    RUN_JSON_MAX,
    TREE_REMOVED,
)
from thrust_remote.core.config import JobConfig
from thrust_remote.core.errors import ExitCode, ThrustError, TransferError
from thrust_remote.core.files import write_atomic
from thrust_remote.core.hints import command_hint
from thrust_remote.core.names import valid_id
from thrust_remote.fetch.models import _ensure_kept_root, kept_root
from thrust_remote.host.runner import FileChangedError, drop_orphan_parts, open_part, sha256_file
from thrust_remote.host.session import HostSession, parse_json

ARTIFACTS_DIR = "artifacts"
RECORD = "artifacts.json"
RUN_PREFIX = RUN_DIR_PREFIX  # a glob under the run directory (agent/listing.py reads the same)
RUN_LOCAL = RUN_DIR_ENV  # where the run dir's files land under artifacts/
# Streams at once, each one transfer helper's channel on the host (sshd's default MaxSessions is 10 per
# connection) with its gets pipelined (Runner.get_many): many small files cost their bytes, not a round
# trip each. A second stream keeps small files from queueing behind a large one, but its helper costs
# a login shell and a python on the host: measured, one stream fetched 1,000 small files faster than
# two (bench_fetch_dir), so the second comes only for this many bytes.
STREAMS = 2
SECOND_STREAM_BYTES = 64 << 20
Job = tuple[str, Path, dict[str, Any]]  # a file to fetch: its name under artifacts/, where it goes, its listing
# A verified file here already, by its host sha256: where it is, what its record says, its name for what is said.
Twin = tuple[Path, dict[str, Any], str]
HARD_LINK, COPY = "hard link", "copy"  # how a twin came
# How long the host's walk of the globs may take (agent list-files --deadline), and the grace past it
# for the command itself: a listing always ends, with an error naming the glob it was on.
LIST_DEADLINE_S = 300.0
LIST_GRACE_S = 60.0
# After Ctrl-C, how long the transfers in flight (their link cut) get to end and remove their temp files.
ABORT_WAIT_S = 2.0
MAX_NAMED = 5  # symlinked directories named in the one warning about them


@dataclass
class DirFetch:
    """What one artifacts fetch did: `fetched` came over the link, `unchanged` were already here."""

    dest: Path  # .thrust/fetched/<run-id>/artifacts/
    fetched: list[str] = field(default_factory=list)  # paths relative to dest
    unchanged: list[str] = field(default_factory=list)
    bytes: int = 0  # bytes transferred
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    tree_removed: str | None = None  # the run's tree is gone (prune, keep:): said in these words
    committed: int = 0  # matched, but the run's commit's own files, unchanged: left out (commits_own)
    linked: list[str] = field(default_factory=list)  # came from a twin here (the checkpoint), not over the link
    # each file that is also in the other place (a checkpoint): its name -> the other's name and how
    # (HARD_LINK, COPY); said at the end, whichever pull brought it
    shared: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def files(self) -> int:
        return len(self.fetched) + len(self.unchanged) + len(self.linked)

    def as_json(self) -> dict[str, Any]:
        return {"dir": str(self.dest), "files": self.files, "fetched": len(self.fetched),
                "unchanged": len(self.unchanged), "linked": len(self.linked), "bytes": self.bytes,
                "warnings": self.warnings, "tree_removed": self.tree_removed, "committed": self.committed,
                "also_checkpoints": {name: other for name, (other, _how) in self.shared.items()}}

    def summary(self, root: Path) -> str:
        if not self.files and self.tree_removed:
            return "artifacts: none fetched: the run's tree was removed"  # the why comes once, as the error
        if not self.files and not self.dest.exists() and self.committed:
            return f"artifacts: none fetched: the {self.committed} file(s) matched are the commit's own, unchanged"
        if not self.files and not self.dest.exists():
            return "artifacts: nothing matched on the host, nothing fetched"
        try:
            where = f"{self.dest.relative_to(root)}/"
        except ValueError:
            where = f"{self.dest}/"
        linked = f"; {len(self.linked)} from the checkpoints here" if self.linked else ""
        return (f"artifacts: {self.files} file(s) in {where} ({len(self.fetched)} fetched, {self.bytes:,} bytes; "
                f"{len(self.unchanged)} unchanged{linked}), verified by sha256" + shared_text(self.shared, CHECKPOINTS)
                + (f"; nothing of its tree: {self.tree_removed}" if self.tree_removed else ""))


def shared_text(shared: dict[str, tuple[str, str]], other: str) -> str:
    """What a summary adds for the files that are in both places: each named with the other's name."""
    if not shared:
        return ""
    named = [f"{name} is also {other}/{twin} (a {how})" for name, (twin, how) in sorted(shared.items())[:MAX_NAMED]]
    more = f" and {len(shared) - MAX_NAMED} more are in {other}/ too" if len(shared) > MAX_NAMED else ""
    return f"; {', '.join(named)}{more}"


def twins(dest: Path, files: dict[str, dict[str, Any]]) -> dict[str, Twin]:
    """The files a record (artifacts.json, checkpoints.json) says are in `dest`, by their host sha256:
    what a pull into the other place links instead of fetching (`fetch_changed`)."""
    out: dict[str, Twin] = {}
    for name, row in files.items():
        sha = row.get("sha256") if isinstance(row, dict) else None
        path = _target(dest, name)
        if isinstance(sha, str) and path is not None:
            out[sha] = (path, row, name)
    return out


def kept_twins(project_root: Path, run_id: str) -> dict[str, Twin]:
    """The run's artifacts here, by sha256 (for its checkpoints' pull)."""
    return twins(artifacts_dir(project_root, run_id), _read_record(kept_root(project_root) / run_id / RECORD))


def note_shared(result_shared: dict[str, tuple[str, str]], done: list[tuple[str, Path, str]],
                others: dict[str, Twin]) -> None:
    """Each file here now (name, path, sha256) that is in the other place too: its other name, and
    whether the two are one file (a hard link) or a copy."""
    for name, path, sha in done:
        twin = others.get(sha)
        if twin is None or not twin[0].is_file():
            continue
        with contextlib.suppress(OSError):
            result_shared[name] = (twin[2], HARD_LINK if os.path.samefile(path, twin[0]) else COPY)


def from_twin(twin: Twin, target: Path, sha: str, umask: int, mode: int) -> str | None:
    """`target` made the same file as `twin` (a hard link; a copy where the filesystem refuses one),
    only while the twin is still the verified file its record says (`local_sha256`); a copy is hashed
    as it is written and must match. How it came (HARD_LINK, COPY), or None: it is fetched instead."""
    source, row, _name = twin
    if local_sha256(source, row) != sha:
        return None
    fh, part = open_part(target)
    try:
        fh.close()
        os.unlink(part)
        try:
            os.link(source, part, follow_symlinks=False)
            how = HARD_LINK
        except OSError:  # another filesystem, or one without hard links: a verified copy
            how = COPY
            fh, part = open_part(target)
            with fh, open(source, "rb") as src:
                digest = hashlib.sha256()
                while block := src.read(1 << 20):
                    digest.update(block)
                    fh.write(block)
            if digest.hexdigest() != sha:
                return None
            _keep_mode(part, mode, umask)
        os.replace(part, target)
        return how
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)


def artifact_globs(job: JobConfig) -> tuple[str, ...]:
    """The job's `artifacts:`. The built-in trainer has none by default: its checkpoints come as
    checkpoints (fetch/checkpoints.py), its model and metrics.jsonl with the model (fetch/models.py)."""
    return tuple(job.artifacts)


def artifacts_dir(project_root: Path, run_id: str) -> Path:
    return kept_root(project_root) / run_id / ARTIFACTS_DIR


def local_name(entry: dict[str, Any]) -> str:
    return f"{RUN_LOCAL}/{entry['path']}" if entry.get("base") == "run" else str(entry["path"])


def list_remote(session: HostSession, run_dir: str, globs: Sequence[str]) -> dict[str, Any]:
    """The host's answer to `list-files`: files (with sha256), unmatched globs, refused paths. A walk
    that runs past LIST_DEADLINE_S is a TransferError naming the host and the glob it was on."""
    result = session.agent("list-files", "--run-dir", run_dir, "--deadline", f"{LIST_DEADLINE_S:g}", "--", *globs,
                           timeout=LIST_DEADLINE_S + LIST_GRACE_S)
    hint = ("narrow that glob in `artifacts:` (a directory with many files, or a slow disk); "
            "symlinked directories are never followed")
    if result.timed_out:
        raise TransferError(f"listing the artifacts of {run_dir} on {session.name} took more than "
                            f"{LIST_DEADLINE_S + LIST_GRACE_S:g} s (globs {list(globs)})", hint)
    answer = parse_json(result, "list-files", check=False) if result.stdout.strip() else None
    if isinstance(answer, dict) and answer.get("error") == DEADLINE_ERROR:
        seconds = answer.get("seconds")
        raise TransferError(f"listing the artifacts of {run_dir} on {session.name} took more than "
                            f"{seconds if isinstance(seconds, int | float) else LIST_DEADLINE_S:g} s, "
                            f"at glob {answer.get('glob')!r}", hint)
    if not result.ok or not isinstance(answer, dict) or "files" not in answer:
        why = answer.get("error") if isinstance(answer, dict) else None
        raise TransferError(f"cannot list the artifacts of {run_dir} on {session.name}: "
                            f"{why or result.stderr.strip()[-200:] or f'exit {result.exit_code}, no answer'}")
    return answer


def tree_removed(session: HostSession, run_dir: str, run_id: str, answer: dict[str, Any],
                 local: Path | None = None) -> str | None:
    """When a glob under the run's cwd matched nothing and that cwd is gone: what removed it and when
    (the run directory's `tree-removed.json`, agent/trees.py: prune, or which launch's keep:), and
    `local`, the copy an earlier fetch left here, when there is one, in a sentence; else None. Asked
    only then: a listing that matched costs nothing more."""
    if not any(not g.startswith(RUN_DIR_PREFIX) for g in _strings(answer, "unmatched")):
        return None
    text = session.runner.read_text(f"{run_dir}/{TREE_REMOVED}", max_bytes=RUN_JSON_MAX)
    try:
        note = json.loads(text) if text else None
    except (ValueError, RecursionError):
        note = None
    cwd = answer.get("cwd")
    if not isinstance(note, dict):
        if not isinstance(cwd, str) or session.runner.exists(cwd):
            return None
        note = {}
    return (f"the tree of run {run_id} on {session.name} was removed {_removed_how(note)}; its files there "
            f"({cwd}) are gone. Its run directory's files stay ({run_dir}: log, metrics, model, $THRUST_RUN_DIR/ "
            f"files)" + (f"; its copy here (what was fetched of it): {local}/" if local is not None and local.is_dir()
                         else "; no fetch of it left a copy here"))


def _removed_how(note: dict[str, Any]) -> str:
    """By what and when, from the note: `prune`, or the keep: of a launch (its run id, its N)."""
    by = note.get("by") if note.get("by") in ("prune", "keep") else None
    at = note.get("at") if isinstance(note.get("at"), str) else None
    if not by or not at:
        return "(no record of when: by hand, or an older thrust-remote)"
    if by == "prune":
        return f"by prune at {at}"
    keep = note.get("keep") if isinstance(note.get("keep"), int) and not isinstance(note.get("keep"), bool) else "N"
    launch = note.get("launch")
    return (f"by keep: {{runs: {keep}}} at {at}" + (f", when run {launch} of the same project was launched"
                                                    if isinstance(launch, str) and valid_id(launch) else ""))


def _strings(answer: dict[str, Any], key: str) -> list[str]:
    """A list of strings from the answer (anything else in it is dropped: it is only warned about)."""
    value = answer.get(key)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def listing_warnings(answer: dict[str, Any], host: str, run_dir: str) -> list[str]:
    """What the listing left out, one line each (a link or an unreadable path named once)."""
    out: list[str] = []
    aged = bool(answer.get("older") or answer.get("newer"))  # a glob that matched only those is unmatched too
    for pattern in _strings(answer, "unmatched"):
        under = run_dir if pattern.startswith(RUN_DIR_PREFIX) else answer.get("cwd")
        what = "nothing of this run's" if aged else "nothing"
        out.append(f"artifacts: {pattern!r} matches {what} on {host} (under {under})")
    if answer.get("older"):
        out.append(f"artifacts: {answer['older']} matching file(s) under {answer.get('cwd')} on "
                   f"{host} are older than this run (an earlier run's): not fetched")
    if answer.get("newer"):
        out.append(f"artifacts: {answer['newer']} matching file(s) under {answer.get('cwd')} on "
                   f"{host} are newer than this run's end (a later run's): not fetched")
    return out + left_out(answer, host, "artifacts")


def left_out(answer: dict[str, Any], host: str, what: str) -> list[str]:
    """What a listing refused or could not read, one warning each, `what` (artifacts, checkpoints) first:
    a link to a file outside the run's directories, a symlinked directory not entered, an unreadable path."""
    out = [f"{what}: {path!r} is outside the run's directories on {host} (a link to outside?): not fetched"
           for path in _strings(answer, "refused")]
    links = _strings(answer, "links")
    if links:
        shown = ", ".join(repr(p) for p in links[:MAX_NAMED]) + (f" and {len(links) - MAX_NAMED} more"
                                                                    if len(links) > MAX_NAMED else "")
        out.append(f"{what}: {len(links)} symlinked director{'y' if len(links) == 1 else 'ies'} on {host} "
                   f"not followed (their files are fetched only through their real path): {shown}")
    unreadable = answer.get("unreadable")
    for row in unreadable if isinstance(unreadable, list) else []:
        if isinstance(row, dict) and isinstance(row.get("path"), str):
            out.append(f"{what}: cannot read {row['path']!r} on {host} ({row.get('error')}): not fetched")
    return out


def _read_record(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return files if isinstance(files, dict) else {}


def _write_record(path: Path, files: dict[str, dict[str, Any]]) -> None:
    write_atomic(path, json.dumps({"files": files}, separators=(",", ":")) + "\n")  # compact: 1,000s of rows


def local_sha256(path: Path, recorded: dict[str, Any] | None) -> str | None:
    """The local file's sha256: the recorded one while its size and mtime are as recorded, else hashed.
    None when no regular file is there (a symlink counts as none: it is replaced, never written through)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    if recorded and recorded.get("local_size") == st.st_size and recorded.get("local_mtime_ns") == st.st_mtime_ns:
        return str(recorded.get("sha256"))
    return sha256_file(path)


def _target(dest: Path, name: str) -> Path | None:
    """dest/name, or None when name would leave dest (absolute, or a `..` part) or has a NUL."""
    parts = name.split("/")
    if not name or "\0" in name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    return dest.joinpath(*parts)


def _malformed(host: str, what: str, path: object) -> TransferError:
    return TransferError(f"artifacts: {host} answered a malformed listing: {what}: {path!r}",
                         "nothing was fetched; the host's agent answered what thrust-remote's never does "
                         f"(check the host: thrust-remote doctor --host {host})")


_SHA256 = re.compile(r"[0-9a-f]{64}")
_ENTRY_INTS = ("size", "mode", "dev", "ino")


def checked_entries(answer: dict[str, Any], host: str, dest: Path) -> list[tuple[str, Path, dict[str, Any]]]:
    """(local name, target, entry) for each file the host listed, every entry checked before anything
    is written: its keys and types, a path that stays under dest, each name once, and no name that
    is both a file and a directory. A malformed answer is a TransferError naming the host and path."""
    entries = answer.get("files")
    if not isinstance(entries, list):
        raise _malformed(host, "`files` is not a list", entries)
    out: list[tuple[str, Path, dict[str, Any]]] = []
    names: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("base") not in ("cwd", "run") or not isinstance(
                entry.get("path"), str):
            raise _malformed(host, "an entry without a base and a path", entry)
        name = local_name(entry)
        target = _target(dest, name)
        if target is None:
            raise _malformed(host, "a path that is not a plain relative path under the artifacts", name)
        src = entry.get("abs")
        if not isinstance(src, str) or "\0" in src or not src.startswith("/"):
            raise _malformed(host, "no absolute host path for", name)
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            raise _malformed(host, "no sha256 for", name)
        if any(not isinstance(entry.get(k), int) or isinstance(entry.get(k), bool) or entry[k] < 0
               for k in _ENTRY_INTS) or not isinstance(entry.get("mtime"), int | float):
            raise _malformed(host, f"no {'/'.join(_ENTRY_INTS)}/mtime numbers for", name)
        if name in names:
            raise _malformed(host, "the same path listed twice", name)
        names.add(name)
        out.append((name, target, entry))
    for name in names:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in names:
                raise _malformed(host, "a path listed both as a file and as a directory", "/".join(parts[:i]))
    return out


def commits_own(session: HostSession, run_dir: str, root: Path, todo: list[Job]) -> list[Job]:
    """`todo` less the files under the run's cwd that are its commit's own, unchanged: the tree is a
    checkout of the commit (run.json's `commit`, `tree`), so a tracked file whose sha256 is the sha256 of
    the commit's blob at that path was not written by the run. The blobs are read here, from the
    project's own git: a commit it lacks (or a run from before trees) leaves out nothing."""
    under_cwd = [row for row in todo if row[2].get("base") == "cwd"]
    if not under_cwd:
        return todo  # the run directory holds nothing the commit tracks: no read of run.json
    text = session.runner.read_text(f"{run_dir}/{RUN_JSON}", max_bytes=RUN_JSON_MAX)
    try:
        meta = json.loads(text) if text else None
    except (ValueError, RecursionError):
        meta = None
    if not isinstance(meta, dict):
        return todo
    commit, tree, cwd = meta.get("commit"), meta.get("tree"), meta.get("cwd")
    if not (isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{40,64}", commit) and isinstance(tree, str)
            and isinstance(cwd, str) and (cwd == tree or cwd.startswith(tree.rstrip("/") + "/"))):
        return todo
    prefix = posixpath.relpath(cwd, tree)
    tracked = _tracked_blobs(root, commit)
    # only a file of the blob's size can be it: the others' blobs are never read
    wanted = {row[2]["abs"]: tracked[path][0] for row in under_cwd
              if (path := posixpath.normpath(posixpath.join(prefix, row[2]["path"]))) in tracked
              and tracked[path][1] == row[2]["size"]}
    if not wanted:
        return todo
    shas = _blob_sha256s(root, set(wanted.values()))
    return [row for row in todo if row[2].get("base") != "cwd" or row[2]["abs"] not in wanted
            or shas.get(wanted[row[2]["abs"]]) != row[2]["sha256"]]


def own_files_warning(globs: Sequence[str], own: list[Job], host: str) -> str:
    """The one warning for the files left out as the commit's own: how many, which globs matched them, why."""
    named = [g for g in globs if any(glob_matches(g, entry) for _, _, entry in own)]
    return (f"artifacts: {len(own)} file(s) {', '.join(named)} matched on {host} are the commit's own, unchanged "
            "(the run's tree is a checkout of it): not fetched; they are in your checkout already")


def _tracked_blobs(root: Path, commit: str) -> dict[str, tuple[str, int]]:
    """Each regular file the commit tracks: its path from the repository's top -> (blob id, size). Empty
    when the laptop's git has not the commit (the run came from another clone)."""
    listed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "-z", "--long", "--full-tree", commit],
                            capture_output=True, check=False)
    if listed.returncode != 0:
        return {}
    out: dict[str, tuple[str, int]] = {}
    for line in listed.stdout.decode(errors="surrogateescape").split("\0"):
        head, _, path = line.partition("\t")
        fields = head.split()
        if len(fields) == 4 and fields[0] in ("100644", "100755") and fields[1] == "blob" and fields[3].isdigit():
            out[path] = (fields[2], int(fields[3]))
    return out


def _blob_sha256s(root: Path, blobs: set[str]) -> dict[str, str]:
    """The sha256 of each blob's content (git cat-file --batch), read in chunks: a large committed
    file is never held whole. The ids are written from a thread so neither pipe can fill and stall."""
    proc = subprocess.Popen(["git", "-C", str(root), "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    order = sorted(blobs)
    stdin = proc.stdin

    def feed() -> None:
        with contextlib.suppress(OSError), stdin:
            stdin.write("".join(f"{blob}\n" for blob in order).encode())

    writer = threading.Thread(target=feed, daemon=True, name="cat-file")
    writer.start()
    out: dict[str, str] = {}
    try:
        for blob in order:
            header = proc.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                continue  # "<id> missing": that blob is not here, its file is fetched
            digest, left = hashlib.sha256(), int(header[2])
            while left > 0:
                chunk = proc.stdout.read(min(left, 1 << 20))
                if not chunk:
                    return out
                digest.update(chunk)
                left -= len(chunk)
            proc.stdout.read(1)  # the newline after the content
            out[blob] = digest.hexdigest()
    finally:
        proc.stdout.close()
        writer.join()
        proc.wait()
    return out


def _parent_dirs(dest: Path, target: Path, host: str, made: set[Path]) -> None:
    """Make target's parents under dest (0700), never through a symlink: each one must be a real
    directory, and the whole path must stay under dest's real path. `made`: the parents already
    checked in this fetch (thousands of files share a few directories)."""
    if target.parent not in made:
        here = dest
        for part in target.relative_to(dest).parts[:-1]:
            here = here / part
            with contextlib.suppress(FileExistsError):
                os.mkdir(here, 0o700)
            if not stat.S_ISDIR(os.lstat(here).st_mode):
                raise TransferError(f"artifacts: {here} is a symlink or a file, not a directory: refusing to write "
                                    f"{host}'s files through it", f"remove {here} and fetch again")
        root, real = os.path.realpath(dest), os.path.realpath(target.parent)
        if real != root and not real.startswith(root + os.sep):
            raise TransferError(f"artifacts: {target} leads out of {dest}: refused", "remove it and fetch again")
        made.add(target.parent)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(target).st_mode):
            raise TransferError(f"artifacts: {host} lists {str(target.relative_to(dest))!r} as a file, and "
                                f"{target} is a directory here: not fetched", f"remove {target} and fetch again")


def safe_dir(dest: Path, what: str) -> Path:
    """`dest` (a directory under .thrust/fetched/<run-id>/) made 0700; refused when it is itself a
    symlink or a file: nothing a host sends is written through it. `what` names it in the error."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(dest, 0o700)
    if not stat.S_ISDIR(os.lstat(dest).st_mode):
        raise TransferError(f"{what}: {dest} is a symlink or a file, not a directory: refused",
                            f"remove {dest} and fetch again")
    return dest


def glob_matches(glob: str, entry: dict[str, Any]) -> bool:
    """Whether a listed file is one `glob` names, as agent/listing.py matches (a directory matched
    stands for its files; `**` any depth; `*` one name, dotfiles too; `$THRUST_RUN_DIR/` the run dir)."""
    base, rel = ("run", glob[len(RUN_PREFIX):]) if glob.startswith(RUN_PREFIX) else ("cwd", glob)
    if entry.get("base", "cwd") != base:
        return False
    pattern = [seg for seg in rel.split("/") if seg not in ("", ".")]
    parts = str(entry["path"]).split("/")
    return any(_segments_match(pattern, parts[:k]) for k in range(1, len(parts) + 1))


def _segments_match(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_segments_match(pattern[1:], parts[k:]) for k in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _segments_match(pattern[1:], parts[1:])


def fetch_artifacts(session: HostSession, run_dir: str, run_id: str, project_root: Path, globs: Sequence[str], *,
                    warn: Callable[[str], None] | None = None, others: dict[str, Twin] | None = None) -> DirFetch:
    """Fetch what `globs` match for the run into .thrust/fetched/<run-id>/artifacts/, only what changed.
    `others`: the run's checkpoints here (checkpoints.kept_twins): a file that is one of them is linked
    from there, not fetched again, and each file in both places is named in the summary."""
    started = time.monotonic()
    dest = artifacts_dir(project_root, run_id)
    result = DirFetch(dest)
    session.runner.warm_transfers(1)  # its start (a shell, a python) beside the listing's, not after it
    answer = list_remote(session, run_dir, globs)
    result.tree_removed = tree_removed(session, run_dir, run_id, answer, dest.parent)
    if result.tree_removed:  # said once, plainly (the summary, or the error when nothing came), instead of
        # a "matches nothing" per glob under the tree
        answer = {**answer, "unmatched": [g for g in _strings(answer, "unmatched") if g.startswith(RUN_DIR_PREFIX)]}
    result.warnings += listing_warnings(answer, session.name, run_dir)
    for text in result.warnings:
        if warn:
            warn(text)
    todo = checked_entries(answer, session.name, dest)
    kept = commits_own(session, run_dir, project_root, todo)
    if len(kept) < len(todo):  # said once, as a warning: never a silent gap in what came
        result.committed = len(todo) - len(kept)
        left = {row[0] for row in kept}  # names are unique (checked_entries)
        result.warnings.append(own_files_warning(globs, [row for row in todo if row[0] not in left], session.name))
        if warn:
            warn(result.warnings[-1])
        todo = kept
    if not todo and not dest.exists():
        result.seconds = time.monotonic() - started
        return result  # nothing to bring: no empty directory beside the run's model
    _ensure_kept_root(project_root)  # .thrust/.gitignore: fetched files are never synced back as untracked
    dest = safe_dir(artifacts_dir(project_root, run_id), "artifacts")
    record_path = dest.parent / RECORD
    record = _read_record(record_path)
    said = len(result.warnings)
    try:
        fetch_changed(session, dest, todo, record, result, others)
    except KeyboardInterrupt:  # what completed is kept and recorded: the next fetch brings only the rest
        left = len(todo) - len(result.fetched) - len(result.unchanged)
        raise ThrustError(f"fetch of run {run_id}'s artifacts interrupted: {len(result.fetched)} file(s) fetched, "
                          f"{len(result.unchanged)} unchanged, {left} not fetched ({dest})",
                          f"fetch the rest with: {command_hint('fetch', run_id, host=session.host)}",
                          ExitCode.INTERRUPTED) from None
    finally:
        _write_record(record_path, record)
        result.seconds = time.monotonic() - started
        for text in result.warnings[said:]:
            if warn:
                warn(text)
    here = [(name, target, str(record[name]["sha256"])) for name, target, _ in todo if name in record]
    note_shared(result.shared, here, others or {})
    return result


def fetch_changed(session: HostSession, dest: Path, todo: list[tuple[str, Path, dict[str, Any]]],
                   record: dict[str, dict[str, Any]], result: DirFetch, others: dict[str, Twin] | None = None) -> None:
    """Skip the files whose local sha256 is the host's; link those verified here already in the other
    place (`others`: the checkpoints for the artifacts, and back); get the rest over pipelined streams
    (Runner.get_many). Every file that completed is recorded even when another one fails or Ctrl-C stops
    the fetch (the next fetch skips it). Ctrl-C cuts the transfers in flight (their temporary files go
    with them) at once."""
    changed: list[tuple[str, Path, dict[str, Any]]] = []
    made: set[Path] = set()
    umask = _umask()
    for name, target, entry in todo:
        _parent_dirs(dest, target, session.name, made)
        if local_sha256(target, record.get(name)) == entry["sha256"]:
            result.unchanged.append(name)
            _remember(record, name, target, entry, entry["sha256"])
        elif _linked(others, name, target, entry, umask):
            result.linked.append(name)
            _remember(record, name, target, entry, entry["sha256"])
        else:
            changed.append((name, target, entry))
    listed = {target for _, target, _ in todo}
    for directory in made:  # what a fetch killed outright left where this one writes
        drop_orphan_parts(directory, keep=listed)
    if not changed:
        return
    stop = threading.Event()
    outcomes: queue.Queue[tuple[Job | None, str | BaseException | None]] = queue.Queue()
    count = STREAMS if sum(int(entry["size"]) for _, _, entry in changed) >= SECOND_STREAM_BYTES else 1
    streams = [changed[i::count] for i in range(min(count, len(changed)))]
    workers = [threading.Thread(target=_stream, args=(session, jobs, stop, outcomes), daemon=True,
                                name=f"fetch-{i}") for i, jobs in enumerate(streams)]
    for worker in workers:
        worker.start()
    failed: BaseException | None = None
    try:
        ended = 0
        while ended < len(workers):
            job, outcome = outcomes.get()
            if job is None:  # a stream ended: by itself (None) or with the error that stops the fetch
                ended += 1
                failed = failed or outcome  # type: ignore[assignment]
            else:
                failed = _settle(job, outcome, session.name, record, result, umask) or failed
            if failed is not None:
                stop.set()
    except BaseException:  # Ctrl-C (KeyboardInterrupt): stop now, keep what completed
        stop.set()
        session.runner.close()  # cuts the transfers in flight: each removes its temporary file
        deadline = time.monotonic() + ABORT_WAIT_S
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        while not outcomes.empty():
            job, outcome = outcomes.get_nowait()
            if job is not None and isinstance(outcome, str):
                _settle(job, outcome, session.name, record, result, umask)
        raise
    if failed is not None:
        raise failed


def _linked(others: dict[str, Twin] | None, name: str, target: Path, entry: dict[str, Any], umask: int) -> bool:
    """Whether the file came from its twin here (`from_twin`); any failure leaves it to the fetch."""
    twin = (others or {}).get(entry["sha256"])
    if twin is None:
        return False
    try:
        return from_twin(twin, target, entry["sha256"], umask, entry["mode"]) is not None
    except OSError:
        return False


def _stream(session: HostSession, jobs: list[Job], stop: threading.Event,
            outcomes: queue.Queue[tuple[Job | None, str | BaseException | None]]) -> None:
    """One stream of the fetch (a thread): each job's outcome as it completes, then (None, why it ended)."""
    items = [(entry["abs"], target, (entry["dev"], entry["ino"])) for _, target, entry in jobs]
    ended: BaseException | None = None
    try:
        with contextlib.closing(session.runner.get_many(items, stop)) as got:  # type: ignore[arg-type]
            for job, outcome in zip(jobs, got, strict=False):
                outcomes.put((job, outcome))
    except BaseException as exc:  # noqa: BLE001 - handed to the fetch's own thread, which raises it
        ended = exc
    outcomes.put((None, ended))


def _settle(job: Job, outcome: str | BaseException | None, host: str, record: dict[str, dict[str, Any]],
            result: DirFetch, umask: int) -> BaseException | None:
    """Record one finished transfer (or say why it was not); the exception that must stop the fetch."""
    name, target, entry = job
    if isinstance(outcome, FileChangedError):
        result.warnings.append(f"artifacts: {name!r} was replaced on {host} after it was listed ({outcome.message}): "
                               "not fetched; fetch again for the new file")
        return None
    if isinstance(outcome, BaseException):
        return outcome
    if outcome is None:
        return None
    sha = outcome
    _keep_mode(target, entry["mode"], umask)
    size = target.stat().st_size
    if sha != entry["sha256"]:
        result.warnings.append(f"artifacts: {name!r} changed on {host} while it was fetched (listed {entry['size']:,} "
                               f"bytes, {entry['sha256'][:12]}; {size:,} bytes came, {sha[:12]}, verified): "
                               "fetch again once the job stops writing it")
    result.fetched.append(name)
    result.bytes += size
    _remember(record, name, target, entry, sha)
    return None


def _umask() -> int:
    mask = os.umask(0o077)  # read it (there is no other way), then put it back at once
    os.umask(mask)
    return mask


def _keep_mode(target: Path, host_mode: int, umask: int) -> None:
    """The host file's permission bits, less the umask: never more open than the host's file."""
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        os.fchmod(fd, host_mode & 0o777 & ~umask)
    finally:
        os.close(fd)


def _remember(record: dict[str, dict[str, Any]], name: str, target: Path, entry: dict[str, Any], sha: str) -> None:
    st = target.stat()
    record[name] = {"sha256": sha, "size": entry["size"], "mtime": entry["mtime"],
                    "local_size": st.st_size, "local_mtime_ns": st.st_mtime_ns}
