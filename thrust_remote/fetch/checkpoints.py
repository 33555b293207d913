"""A run's checkpoints brought home, while it runs and after: `.thrust/fetched/<run-id>/checkpoints/`
(docs/architecture.md, "Checkpoints and resume").

A job's checkpoints are the files its `checkpoints:` glob matches (the built-in trainer's are known:
TRAINER_GLOB). A pull lists them on the host (agent `list-files`, sha256 of each), takes the newest by
mtime (every one with `every`), and gets each one whose local copy differs with the artifacts' verified
transfer (a temporary file, sha256 on both ends, renamed only when they agree): a cut pull leaves no
partial file under a final name, and a second pull of an unchanged checkpoint moves no byte. A
checkpoint that changed while it came (a job that writes in place) is dropped, never kept as the
newest. `checkpoints.json` beside the directory records each file's host sha256 and which one is the
newest; `newest_verified` hashes that file again before anything resumes from it. A checkpoint the
job's `artifacts:` name too is in both places: one pull links what the other brought (`kept_twins`,
fetch/artifacts.py `fetch_changed`), and the summary names the other.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import CHECKPOINTS, RUN_DIR_PREFIX
from thrust_remote.core.config import JobConfig
from thrust_remote.core.errors import ExitCode, ThrustError, TransferError
from thrust_remote.core.files import write_atomic
from thrust_remote.core.hints import command_hint
from thrust_remote.fetch import artifacts
from thrust_remote.fetch.models import _ensure_kept_root, kept_root
from thrust_remote.host.runner import sha256_file
from thrust_remote.host.session import HostSession

RECORD = "checkpoints.json"
# The built-in trainer's checkpoints (trainer/checkpoint.py: written whole, then renamed into place).
TRAINER_GLOB = f"{RUN_DIR_PREFIX}{CHECKPOINTS}/ckpt-*.pt"


def checkpoint_glob(job: JobConfig) -> str | None:
    """The job's `checkpoints:`, else the built-in trainer's; None: the job declares none."""
    if job.checkpoints:
        return job.checkpoints
    return TRAINER_GLOB if job.kind == "trainer" else None


def checkpoints_dir(project_root: Path, run_id: str) -> Path:
    return kept_root(project_root) / run_id / CHECKPOINTS


@dataclass
class CheckpointPull:
    """What one pull did: `newest` is the newest checkpoint here now (its name under `dest`)."""

    dest: Path
    newest: str | None = None
    fetched: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    on_host: int = 0  # checkpoints the host listed
    newest_on_host: str | None = None  # the newest one's path on the host (when it came or was here)
    linked: list[str] = field(default_factory=list)  # came from the artifacts here, not over the link
    shared: dict[str, tuple[str, str]] = field(default_factory=dict)  # also an artifact: its name there, how
    tree_removed: str | None = None  # the glob's tree is gone (prune, keep:): said in these words
    glob: str = ""  # the job's checkpoints: glob, as the pull listed it
    ended: bool = False  # the run had ended: a checkpoint not there now never comes (said so, never "yet")

    @property
    def came(self) -> bool:
        """Something of the host's was brought or found the same here by this pull (not only an earlier copy)."""
        return bool(self.fetched or self.unchanged or self.linked)

    def as_json(self) -> dict[str, Any]:
        return {"dir": str(self.dest), "newest": self.newest, "fetched": len(self.fetched),
                "unchanged": len(self.unchanged), "linked": len(self.linked), "bytes": self.bytes,
                "on_host": self.on_host, "warnings": self.warnings, "tree_removed": self.tree_removed,
                "also_artifacts": {name: other for name, (other, _how) in self.shared.items()}}

    def summary(self, root: Path) -> str:
        if self.tree_removed and not self.came:  # the why comes once, as the error (run/fetching.py)
            return "checkpoints: none fetched: the run's tree was removed"
        if self.newest is None:
            return (f"checkpoints: none (the run wrote none matching {self.glob})" if self.ended
                    else "checkpoints: none on the host yet")
        try:
            where = f"{self.dest.relative_to(root)}/"
        except ValueError:
            where = f"{self.dest}/"
        many = len(self.fetched) + len(self.unchanged) + len(self.linked)
        also = artifacts.shared_text(self.shared, artifacts.ARTIFACTS_DIR)
        if many > 1:  # --all-checkpoints
            linked = f"; {len(self.linked)} from the artifacts here" if self.linked else ""
            return (f"checkpoints: {many} in {where} ({len(self.fetched)} fetched, {self.bytes:,} bytes; "
                    f"{len(self.unchanged)} unchanged{linked}; newest {self.newest}), verified by sha256{also}")
        how = (f"fetched, {self.bytes:,} bytes" if self.fetched else
               "from the artifacts here" if self.linked else "unchanged")
        return f"checkpoint: {where}{self.newest} ({how}), verified by sha256{also}"


def kept_twins(project_root: Path, run_id: str) -> dict[str, artifacts.Twin]:
    """The run's checkpoints here, by sha256 (for its artifacts' fetch)."""
    return artifacts.twins(checkpoints_dir(project_root, run_id), read_record(project_root, run_id).get("files") or {})


def read_record(project_root: Path, run_id: str) -> dict[str, Any]:
    try:
        data = json.loads((kept_root(project_root) / run_id / RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("files"), dict) else {}


TRIES = 3  # a checkpoint replaced between the listing and its transfer is listed again, this often


def pull(session: HostSession, run_dir: str, run_id: str, project_root: Path, glob: str, *,
         every: bool = False) -> CheckpointPull:
    """Bring the run's newest checkpoint (`every`: all of them) home, verified; only what changed. A job
    that replaces its checkpoint while it came (the same name, a new file) has it listed again."""
    started = time.monotonic()
    result = CheckpointPull(checkpoints_dir(project_root, run_id), glob=glob)
    record = read_record(project_root, run_id)
    files: dict[str, dict[str, Any]] = dict(record.get("files") or {})
    good: list[tuple[str, dict[str, Any]]] = []
    for attempt in range(TRIES):
        answer = artifacts.list_remote(session, run_dir, [glob])
        listed = artifacts.checked_entries(answer, session.name, result.dest)  # the whole answer checked first
        if attempt == 0:  # a checkpoint linked to outside the run's directories: said, as the artifacts' are
            result.warnings += artifacts.left_out(answer, session.name, "checkpoints")
            if not listed:  # none because the tree they were in is gone (prune, keep:), never "none yet"
                result.tree_removed = artifacts.tree_removed(session, run_dir, run_id, answer, result.dest.parent)
        result.on_host = len(listed)
        chosen = _choose(listed, result.dest, every, session.name, result.warnings)
        if not chosen:
            break
        _bring(session, result, chosen, files, project_root, run_id, record)
        good = [(name, entry) for name, _t, entry in chosen
                if name in files and files[name]["sha256"] == entry["sha256"]]
        if good and good[-1][0] == chosen[-1][0]:
            break
    newest = good[-1][0] if good else _still_here(record, files, result.dest)
    result.newest_on_host = str(good[-1][1]["abs"]) if good else None
    if not every and newest is not None:
        _prune(result.dest, files, keep=newest)
    result.shared = {name: twin for name, twin in result.shared.items() if name in files}  # the pruned went
    result.newest = newest
    # the step noted for the newest checkpoint stays with it while it stays the newest
    seen = record.get(STEP_SEEN) if newest == record.get("newest") else None
    _write(project_root, run_id, files, newest, session.name, seen)
    result.seconds = time.monotonic() - started
    return result


def _bring(session: HostSession, result: CheckpointPull, chosen: list[tuple[str, Path, dict[str, Any]]],
           files: dict[str, dict[str, Any]], project_root: Path, run_id: str, record: dict[str, Any]) -> None:
    """The chosen checkpoints fetched (only what differs), counted into `result`; a torn one dropped."""
    _ensure_kept_root(project_root)
    artifacts.safe_dir(result.dest, "checkpoints")
    got = artifacts.DirFetch(result.dest)
    others = artifacts.kept_twins(project_root, run_id)
    try:
        artifacts.fetch_changed(session, result.dest, chosen, files, got, others)
    except KeyboardInterrupt:
        _write(project_root, run_id, files, record.get("newest"), session.name)
        raise ThrustError(f"pulling run {run_id}'s checkpoint interrupted: nothing partial was kept",
                          f"pull it again with: {command_hint('fetch', run_id, host=session.host)}",
                          ExitCode.INTERRUPTED) from None
    result.fetched += got.fetched
    result.unchanged += got.unchanged
    result.linked += got.linked
    result.bytes += got.bytes
    result.warnings += _drop_torn(chosen, files, session.name)
    artifacts.note_shared(result.shared, [(name, target, files[name]["sha256"]) for name, target, _ in chosen
                                          if name in files], others)


def _choose(listed: list[tuple[str, Path, dict[str, Any]]], dest: Path, every: bool, host: str,
            warnings: list[str]) -> list[tuple[str, Path, dict[str, Any]]]:
    """The checkpoints to bring, oldest first: the newest (by mtime, then name) or all; each lands under
    its own file name in `dest`, so two of the same name in different directories keep the newer one."""
    by_name: dict[str, dict[str, Any]] = {}
    for name, _target, entry in sorted(listed, key=lambda item: (item[2]["mtime"], item[0])):
        base = name.rsplit("/", 1)[-1]
        if base in by_name:
            warnings.append(f"checkpoints: two checkpoints on {host} are named {base!r}: only the newer comes")
        by_name[base] = entry
    picked = sorted(((base, dest / base, entry) for base, entry in by_name.items()),
                    key=lambda item: (item[2]["mtime"], item[0]))
    return picked if every else picked[-1:]


def _drop_torn(chosen: list[tuple[str, Path, dict[str, Any]]], files: dict[str, dict[str, Any]],
               host: str) -> list[str]:
    """A checkpoint whose bytes on arrival are not the listed ones was being written while it came: it
    is removed here (a resume must never start from it); the next pull brings it whole."""
    out = []
    for name, target, entry in chosen:
        row = files.get(name)
        if row is not None and row["sha256"] != entry["sha256"]:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            files.pop(name, None)
            out.append(f"checkpoints: {name!r} changed on {host} while it came: not kept (the next pull brings "
                       "it whole)")
    return out


def _still_here(record: dict[str, Any], files: dict[str, dict[str, Any]], dest: Path) -> str | None:
    """The newest checkpoint pulled before, while its file is still here (nothing new came)."""
    newest = record.get("newest")
    return newest if isinstance(newest, str) and newest in files and (dest / newest).is_file() else None


def _prune(dest: Path, files: dict[str, dict[str, Any]], keep: str) -> None:
    """Only the newest stays (its verified copy is in place first): a run pulled every few minutes
    for hours does not fill the laptop's disk with checkpoints (`--all-checkpoints` keeps them all)."""
    for name in list(files):
        if name != keep:
            with contextlib.suppress(FileNotFoundError):
                (dest / name).unlink()
            files.pop(name)


def _write(project_root: Path, run_id: str, files: dict[str, dict[str, Any]], newest: str | None, host: str,
           seen: object = None) -> None:
    path = kept_root(project_root) / run_id / RECORD
    if not files and not path.exists():
        return
    record = {"files": files, "newest": newest, "host": host,
              "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_atomic(path, json.dumps({**record, **({STEP_SEEN: seen} if seen is not None else {})}) + "\n")


_STEP = re.compile(r"(\d+)(?!.*\d)")  # the last number in a checkpoint's name: ckpt-500.pt, step_500/model.pt


def describe(project_root: Path, run_id: str, now: float | None = None) -> str | None:
    """The newest pulled checkpoint as a next step names it: `ckpt-500.pt (step 500, written 4m10s ago on
    gpu, pulled 3m02s ago)`; None when none was pulled. The step is the last number in its name (a
    checkpoint's contents are the job's own); the ages are the host's mtime and the pull's time."""
    record = read_record(project_root, run_id)
    newest = record.get("newest")
    if not isinstance(newest, str):
        return None
    now = time.time() if now is None else now
    row = record["files"].get(newest) or {}
    facts = []
    step = _STEP.search(newest)
    if step:
        facts.append(f"step {int(step.group(1)):,}")
    if isinstance(row.get("mtime"), int | float):
        facts.append(f"written {age(now - row['mtime'])} ago on {record.get('host') or 'its host'}")
    pulled = _parse_time(record.get("pulled_at"))
    if pulled is not None:
        facts.append(f"pulled {age(now - pulled)} ago")
    seen = record.get(STEP_SEEN)
    if isinstance(seen, int) and (not step or seen > int(step.group(1))):
        facts.append(f"when the run had reached step {seen:,}")
    return f"{newest} ({', '.join(facts)})" if facts else newest


STEP_SEEN = "step_seen"  # in checkpoints.json: the followed run's step when its newest checkpoint came


def note_step(project_root: Path, run_id: str, step: object) -> None:
    """Remember the step the followed run had reached when its newest checkpoint came: a file's contents
    are the job's own, so this is what says how far it is (at most that step) when its name does not."""
    record = read_record(project_root, run_id)
    if not record or not isinstance(step, int) or isinstance(step, bool):
        return
    record[STEP_SEEN] = step
    write_atomic(kept_root(project_root) / run_id / RECORD, json.dumps(record) + "\n")


def age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _parse_time(text: object) -> float | None:
    try:
        return calendar.timegm(time.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


@dataclass(frozen=True)
class LocalCheckpoint:
    path: Path
    sha256: str
    host: str | None  # where it was pulled from


def newest_verified(project_root: Path, run_id: str) -> LocalCheckpoint | None:
    """The newest checkpoint pulled for a run, hashed again now and matching the sha256 it came with;
    None when none was pulled. A file that is gone or does not match is a ThrustError saying so: a
    resume never starts from a checkpoint it cannot vouch for."""
    record = read_record(project_root, run_id)
    newest = record.get("newest")
    if not isinstance(newest, str):
        return None
    row = record["files"].get(newest) or {}
    path = checkpoints_dir(project_root, run_id) / newest
    host = record.get("host") if isinstance(record.get("host"), str) else None
    again = (f"pull it again once {host} answers: {command_hint('fetch', run_id, host=host)}, or resume on it, "
             f"where the run's own checkpoints are: {command_hint('resume', run_id, host=host)}")
    if not path.is_file():
        raise ThrustError(f"run {run_id}'s checkpoint {newest} was pulled, but {path} is gone", again, ExitCode.USAGE)
    sha = sha256_file(path)
    if sha != row.get("sha256"):
        raise TransferError(f"run {run_id}'s checkpoint {path} does not match the sha256 it was pulled with "
                            f"({sha[:12]} here, {str(row.get('sha256'))[:12]} on the host): not resumed from",
                            f"never edit the pulled copy; {again}")
    return LocalCheckpoint(path, sha, host)
