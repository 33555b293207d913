"""A run's artifacts brought home: `.thrust/fetched/<run-id>/artifacts/` (docs/architecture.md, "Artifacts").

The host lists what the job's `artifacts:` globs match (agent `list-files`: size, mtime, sha256 of
each file), and each file whose sha256 differs from the local copy's is fetched with the runner's
verified `get` (sha256 on both ends, written to `.part` and renamed only when they agree). So a
second fetch transfers nothing, a file changed on the host comes again (a TensorBoard dir comes
incrementally), and a cut fetch leaves no half file under its final name: fetching again resumes
with the files still missing. What was fetched is recorded in `.thrust/fetched/<run-id>/artifacts.json`
(host sha256 plus the local size and mtime), so an unchanged local file is not hashed again.

Paths keep their place: a glob under the run's cwd lands in `artifacts/<path>`, one under
`$THRUST_RUN_DIR/` in `artifacts/THRUST_RUN_DIR/<path>`. A glob that matches nothing is a warning.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import CHECKPOINTS, RUN_DIR_ENV, RUN_DIR_PREFIX
from thrust_remote.core.config import JobConfig
from thrust_remote.core.errors import ThrustError, TransferError
from thrust_remote.core.files import write_atomic
from thrust_remote.fetch.models import _ensure_kept_root, kept_root
from thrust_remote.host.runner import sha256_file
from thrust_remote.host.session import HostSession, parse_json

ARTIFACTS_DIR = "artifacts"
RECORD = "artifacts.json"
RUN_PREFIX = RUN_DIR_PREFIX  # a glob under the run directory (agent/listing.py reads the same)
RUN_LOCAL = RUN_DIR_ENV  # where the run dir's files land under artifacts/
# The built-in trainer's default `artifacts:`: its checkpoints (weights, optimizer state and step),
# which resume or re-export a run; model.onnx is inference only, and metrics.jsonl already comes
# with the model (fetch/models.py).
TRAINER_DEFAULT = (f"{RUN_PREFIX}{CHECKPOINTS}/**",)
# Files in flight at once: each is one transfer helper's channel on the host (sshd's default
# MaxSessions is 10 per connection), and many small files are latency-bound, not bandwidth-bound.
WORKERS = 4


@dataclass
class DirFetch:
    """What one artifacts fetch did: `fetched` came over the link, `unchanged` were already here."""

    dest: Path  # .thrust/fetched/<run-id>/artifacts/
    fetched: list[str] = field(default_factory=list)  # paths relative to dest
    unchanged: list[str] = field(default_factory=list)
    bytes: int = 0  # bytes transferred
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def files(self) -> int:
        return len(self.fetched) + len(self.unchanged)

    def as_json(self) -> dict[str, Any]:
        return {"dir": str(self.dest), "files": self.files, "fetched": len(self.fetched),
                "unchanged": len(self.unchanged), "bytes": self.bytes, "warnings": self.warnings}

    def summary(self, root: Path) -> str:
        if not self.files and not self.dest.exists():
            return "artifacts: nothing matched on the host, nothing fetched"
        try:
            where = f"{self.dest.relative_to(root)}/"
        except ValueError:
            where = f"{self.dest}/"
        return (f"artifacts: {self.files} file(s) in {where} ({len(self.fetched)} fetched, {self.bytes:,} bytes; "
                f"{len(self.unchanged)} unchanged), verified by sha256")


def artifact_globs(job: JobConfig) -> tuple[str, ...]:
    """The job's `artifacts:`, else the trainer's default (TRAINER_DEFAULT); none for the other kinds."""
    if job.artifacts:
        return tuple(job.artifacts)
    return TRAINER_DEFAULT if job.kind == "trainer" else ()


def artifacts_dir(project_root: Path, run_id: str) -> Path:
    return kept_root(project_root) / run_id / ARTIFACTS_DIR


def local_name(entry: dict[str, Any]) -> str:
    return f"{RUN_LOCAL}/{entry['path']}" if entry.get("base") == "run" else str(entry["path"])


def list_remote(session: HostSession, run_dir: str, globs: Sequence[str]) -> dict[str, Any]:
    """The host's answer to `list-files`: files (with sha256), unmatched globs, refused paths."""
    result = session.agent("list-files", "--run-dir", run_dir, "--", *globs, timeout=600)
    answer = parse_json(result, "list-files", check=False)
    if not result.ok or not isinstance(answer, dict) or "files" not in answer:
        why = answer.get("error") if isinstance(answer, dict) else None
        raise ThrustError(f"cannot list the artifacts of {run_dir} on {session.name}: {why or result.stderr[-200:]}")
    return answer


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
    """The local file's sha256: the recorded one while its size and mtime are as recorded, else hashed."""
    try:
        st = path.stat()
    except OSError:
        return None
    if recorded and recorded.get("local_size") == st.st_size and recorded.get("local_mtime_ns") == st.st_mtime_ns:
        return str(recorded.get("sha256"))
    return sha256_file(path)


def _target(dest: Path, name: str) -> Path | None:
    """dest/name, or None when name would leave dest (absolute, or a `..` part)."""
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    return dest.joinpath(*parts)


def fetch_artifacts(session: HostSession, run_dir: str, run_id: str, project_root: Path, globs: Sequence[str], *,
                    warn: Callable[[str], None] | None = None) -> DirFetch:
    """Fetch what `globs` match for the run into .thrust/fetched/<run-id>/artifacts/, only what changed."""
    started = time.monotonic()
    dest = artifacts_dir(project_root, run_id)
    result = DirFetch(dest)
    answer = list_remote(session, run_dir, globs)
    for pattern in answer.get("unmatched", []):
        under = run_dir if pattern.startswith(RUN_DIR_PREFIX) else answer.get("cwd")
        result.warnings.append(f"artifacts: {pattern!r} matches nothing on {session.name} (under {under})")
    if answer.get("older"):
        result.warnings.append(f"artifacts: {answer['older']} matching file(s) under {answer.get('cwd')} on "
                               f"{session.name} are older than this run (an earlier run's): not fetched")
    if answer.get("newer"):
        result.warnings.append(f"artifacts: {answer['newer']} matching file(s) under {answer.get('cwd')} on "
                               f"{session.name} are newer than this run's end (a later run's): not fetched")
    for path in answer.get("refused", []):
        result.warnings.append(f"artifacts: {path!r} is outside the run's directories on {session.name}: not fetched")
    for text in result.warnings:
        if warn:
            warn(text)
    if not answer["files"] and not dest.exists():
        result.seconds = time.monotonic() - started
        return result  # nothing to bring: no empty directory beside the run's model
    _ensure_kept_root(project_root)  # .thrust/.gitignore: fetched files are never synced back as untracked
    dest.mkdir(parents=True, exist_ok=True)
    record_path = dest.parent / RECORD
    record = _read_record(record_path)
    try:
        _fetch_changed(session, dest, answer["files"], record, result)
    finally:
        _write_record(record_path, record)
        result.seconds = time.monotonic() - started
    return result


def _fetch_changed(session: HostSession, dest: Path, entries: list[dict[str, Any]],
                   record: dict[str, dict[str, Any]], result: DirFetch) -> None:
    """Skip the files whose local sha256 is the host's; get the others, WORKERS at a time. Every file
    that completed is recorded even when another one fails (the next fetch skips it)."""
    todo: list[tuple[str, Path, dict[str, Any]]] = []
    for entry in entries:
        name = local_name(entry)
        target = _target(dest, name)
        if target is None:
            raise TransferError(f"artifacts: the host named {name!r}, which is outside {dest}")
        if local_sha256(target, record.get(name)) == entry["sha256"]:
            result.unchanged.append(name)
            _remember(record, name, target, entry, entry["sha256"])
        else:
            todo.append((name, target, entry))
    if not todo:
        return
    with ThreadPoolExecutor(max_workers=min(WORKERS, len(todo))) as pool:
        futures = {pool.submit(session.runner.get, entry["abs"], target): (name, target, entry)
                   for name, target, entry in todo}
        failed: BaseException | None = None
        for future in as_completed(futures):
            name, target, entry = futures[future]
            try:
                sha = future.result()  # verified: .part until both ends agree
            except BaseException as exc:  # noqa: BLE001 - the first failure is raised once all stopped
                if failed is None:
                    failed = exc
                    for other in futures:
                        other.cancel()
                continue
            result.fetched.append(name)
            result.bytes += target.stat().st_size
            _remember(record, name, target, entry, sha)
    if failed is not None:
        raise failed


def _remember(record: dict[str, dict[str, Any]], name: str, target: Path, entry: dict[str, Any], sha: str) -> None:
    st = target.stat()
    record[name] = {"sha256": sha, "size": entry["size"], "mtime": entry["mtime"],
                    "local_size": st.st_size, "local_mtime_ns": st.st_mtime_ns}
