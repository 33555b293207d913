"""The project's local index of the runs it started: run id -> host, job, commit, start, run dir.

One small JSON file per run, `<project root>/.thrust/index/<run-id>.json`, written atomically when
`train` launches (docs/architecture.md, "The local run index"). `status/logs/stop/fetch RUN_ID`
without `--host` read it to find the host. It lives on the laptop only: `.thrust/runs/` is the
`local` host's own run directory and `.thrust/fetched/` holds fetched models, so neither is used.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from thrust_remote.core.config import CONFIG_NAME, Config
from thrust_remote.core.errors import UnknownHostError
from thrust_remote.core.files import tool_dir, write_atomic
from thrust_remote.core.names import valid_id

INDEX_DIR = Path(".thrust") / "index"


@dataclass(frozen=True)
class IndexEntry:
    run_id: str
    host: str
    job: str
    commit: str | None
    started_at: str
    run_dir: str
    config: str | None = None  # the thrust.yaml that named the host, when there was one
    nodes: tuple[str, ...] = ()  # a run over several hosts: every node's host, node 0 (`host`) first
    # what `resume` needs to run the same job again at the same code (docs/architecture.md, "Checkpoints
    # and resume"): the --set words and parameters it was given, its patch's sha256 (the patch itself is
    # <run-id>.patch beside this file), and the run it continued
    sets: tuple[str, ...] = ()
    params: dict[str, Any] | None = None
    patch_sha256: str | None = None
    resumed_from: str | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def now() -> str:
    """The same UTC timestamp format as the agent's `started_at`."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def index_dir(root: Path) -> Path:
    return root / INDEX_DIR


def _path(root: Path, run_id: str) -> Path:
    if not valid_id(run_id):  # the id becomes a file name: never a path
        raise ValueError(f"run id {run_id!r} is not valid")
    return index_dir(root) / f"{run_id}.json"


def record(root: Path, entry: IndexEntry) -> Path:
    """Write the entry atomically (temp file, fsync, rename) and owner-only; returns its path."""
    tool_dir(root, *INDEX_DIR.parts[1:])  # .thrust/ with its .gitignore: a train that fetched nothing too
    return write_atomic(_path(root, entry.run_id), json.dumps(entry.as_json(), indent=1) + "\n")


def lookup(root: Path, run_id: str) -> IndexEntry | None:
    """The entry of a run this project started, or None (unknown id, unreadable or damaged file)."""
    try:
        data = json.loads(_path(root, run_id).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("run_id") != run_id or not isinstance(data.get("host"), str):
        return None
    return IndexEntry(
        run_id=run_id,
        host=data["host"],
        job=str(data.get("job") or ""),
        commit=data.get("commit"),
        started_at=str(data.get("started_at") or ""),
        run_dir=str(data.get("run_dir") or ""),
        config=data.get("config"),
        nodes=tuple(str(n) for n in data.get("nodes") or () if isinstance(n, str)),
        sets=tuple(str(w) for w in data.get("sets") or () if isinstance(w, str)),
        params=data.get("params") if isinstance(data.get("params"), dict) else None,
        patch_sha256=data.get("patch_sha256") if isinstance(data.get("patch_sha256"), str) else None,
        resumed_from=data.get("resumed_from") if isinstance(data.get("resumed_from"), str) else None,
    )


def continued_by(root: Path, run_id: str) -> list[IndexEntry]:
    """The runs this project started that continue `run_id` (`resume`, a retry), oldest first: what
    `status` of a run that was resumed elsewhere points at. A scan of the index (a file per run)."""
    try:
        names = [p.stem for p in index_dir(root).glob("*.json")]
    except OSError:
        return []
    entries = [e for name in names if valid_id(name) and (e := lookup(root, name)) and e.resumed_from == run_id]
    return sorted(entries, key=lambda e: (e.started_at, e.run_id))


PATCH_SUFFIX = ".patch"


def record_patch(root: Path, run_id: str, patch: bytes) -> Path:
    """The uncommitted patch a run ran with, kept beside its entry (0600): `resume` syncs the same code
    even when the run's host is gone and the laptop's tree has moved on."""
    return write_atomic(_path(root, run_id).with_suffix(PATCH_SUFFIX), patch)


def read_patch(root: Path, run_id: str) -> bytes | None:
    try:
        return _path(root, run_id).with_suffix(PATCH_SUFFIX).read_bytes()
    except OSError:
        return None


def resolve_host(config: Config, run_id: str, explicit: str | None) -> str | None:
    """The host a command about `run_id` goes to: `--host` when given, else the host this project
    started the run on (the index), else None (the default host, as before the index existed)."""
    if explicit:
        return explicit
    entry = lookup(config.root, run_id)
    if entry is None:
        return None
    if entry.host not in config.hosts:
        where = f"{config.path}" if config.path else "the configuration (no thrust.yaml found)"
        hint = (f"run the command with the config that defines it: thrust-remote --config {entry.config} ..."
                if entry.config and entry.config != str(config.path.resolve() if config.path else "")
                else f"add {entry.host!r} under `hosts:` in {config.path or CONFIG_NAME}, or give --host")
        raise UnknownHostError(f"run {run_id} was started on host {entry.host!r}, which {where} does not define",
                               hint)
    return entry.host
