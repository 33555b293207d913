"""A run's JSON files read up to `protocol.RUN_JSON_MAX`: the agent's one reader of them.

run.json, a node's run.json, `exit_code`'s neighbours (`peer-failed.json`, a scheduler's kept answers): ours
are a few KB, and one far larger (a hostile or broken host) is refused, never read whole into memory
(docs/architecture.md, "Security"). Every module of the agent that reads one reads it here, a cluster's
run's as any other's, so the cap is kept in one place. run.json itself is read as a protocol.RunRecord
(`read_record`) and written whole from one (`write_record`, a record protocol.run_record made). Imports
nothing of the agent but the protocol and files.py: every other module may import it.
"""

from __future__ import annotations

import errno
import json
import os
from typing import cast

from .files import write_atomic
from .protocol import RUN_JSON, RUN_JSON_MAX, RunRecord


def load(path: str) -> object:
    """The JSON value of `path`, read up to RUN_JSON_MAX bytes; past it a ValueError, never read whole.
    OSError, ValueError (not JSON) and RecursionError (nested too deep) are the caller's to report."""
    with open(path, "rb") as fh:
        data = fh.read(RUN_JSON_MAX + 1)
    if len(data) > RUN_JSON_MAX:
        raise ValueError(f"larger than {RUN_JSON_MAX} bytes: not read")
    return json.loads(data)


def read_json(path: str) -> dict | None:
    """A run's JSON object; None when absent, not a JSON object, or larger than RUN_JSON_MAX."""
    try:
        data = load(path)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def oversize(path: str) -> bool:
    """Whether `path` is larger than RUN_JSON_MAX: read as nothing, and said so (status's `oversize`)."""
    try:
        return os.stat(path).st_size > RUN_JSON_MAX
    except OSError:
        return False


def read_for_update(path: str) -> dict:
    """The JSON object a writer will change and write back whole: {} when absent or not one; an
    oversize file is refused (OSError EFBIG) rather than read whole or written over as if empty."""
    if oversize(path):
        raise OSError(errno.EFBIG, f"larger than {RUN_JSON_MAX} bytes: not read", path)
    return read_json(path) or {}


def read_record(run_dir: str) -> RunRecord:
    """`run_dir`'s run.json (a run's, or a node's own directory's) as its record: {} when absent, not a
    JSON object, or larger than RUN_JSON_MAX (`oversize` says which)."""
    return cast(RunRecord, read_json(os.path.join(run_dir, RUN_JSON)) or {})


def record_for_update(run_dir: str) -> RunRecord:
    """`run_dir`'s record a writer will change and write back whole (`read_for_update`: an oversize one
    is refused, OSError EFBIG)."""
    return cast(RunRecord, read_for_update(os.path.join(run_dir, RUN_JSON)))


def write_record(run_dir: str, record: RunRecord) -> None:
    """`run_dir`'s run.json, written whole and atomically (0600: it names the job's env keys)."""
    write_atomic(os.path.join(run_dir, RUN_JSON), json.dumps(record, indent=1).encode())
