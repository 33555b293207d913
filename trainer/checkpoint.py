"""Checkpoints that survive being killed mid-write.

`save_checkpoint` writes `<dir>/ckpt-<step>.pt` as a temp file in the same directory, flushes and
fsyncs it, `os.replace`s it into place (atomic on POSIX) and fsyncs the directory, so a reader sees
either the previous set of checkpoints or the new one, never a torn file. Older ones beyond `keep`
are removed only after the new one is in place. `load_latest` returns the newest that loads.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^ckpt-(\d+)\.pt$")


def checkpoint_paths(directory: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of finished checkpoints, newest first. Temp files are ignored."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = []
    for p in d.iterdir():
        m = _NAME.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomically(path: Path, state: dict[str, Any]) -> None:
    """`torch.save(state)` at `path`, whole or not at all: a temp file beside it (a dot name ending
    in .tmp), flushed and fsynced, renamed into place, and the directory fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def save_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any], step: int, keep: int = 3) -> Path:
    """Atomically write `state` as the checkpoint for `step`; returns its path."""
    d = Path(directory)
    final = d / f"ckpt-{step:012d}.pt"
    save_atomically(final, state)
    for _, old in checkpoint_paths(d)[keep:]:
        with contextlib.suppress(FileNotFoundError):
            old.unlink()
    return final


def load_latest(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], Path] | None:
    """The newest checkpoint that loads, with its path; None when there is none."""
    for _, path in checkpoint_paths(directory):
        try:
            return torch.load(path, map_location="cpu", weights_only=True), path
        except Exception:  # noqa: BLE001 - a damaged file (e.g. disk full) falls back to the previous one
            continue
    return None


def load_start(directory: str | os.PathLike[str], resume_from: str | None) -> tuple[dict[str, Any], Path] | str | None:
    """Where a run starts from: its own newest checkpoint (a restart, `--resume`), else `resume_from`'s
    file (`--resume-from`: a run continued elsewhere); a string says why that file cannot be used."""
    own = load_latest(directory)
    if own is not None or not resume_from:
        return own
    path = Path(resume_from)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same usage error
        why = (str(exc).strip().splitlines() or [""])[0][:200]  # torch's own text runs to many lines
        return f"--resume-from {path}: not a checkpoint this trainer can read ({type(exc).__name__}: {why})"
    if not isinstance(state, dict) or not {"model", "optimizer", "step", "config"} <= set(state):
        return f"--resume-from {path}: not a checkpoint of this trainer (no model, optimizer, step and config)"
    return state, path
