"""The one way the laptop writes a file that must be whole: a temp file beside it (owner-only),
flushed to disk, then renamed over the final name. A crash or a full disk leaves the old file or the
new one, never half of one under the final name, and no temp file behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from thrust_remote.core.errors import DISK_FULL, disk_full


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o600) -> Path:
    """`data` as the whole of `path` (parents made); `mode` 0600 unless said otherwise."""
    body = data.encode() if isinstance(data, str) else data
    return _replace(path, mode, lambda out: out.write(body))


def copy_atomic(src: Path, dst: Path, *, mode: int = 0o644) -> Path:
    """A copy of `src` as the whole of `dst`, with write_atomic's guarantees (read by `play`'s page: 0644)."""
    with open(src, "rb") as inp:
        return _replace(dst, mode, lambda out: shutil.copyfileobj(inp, out, 1 << 20))


def _replace(path: Path, mode: int, fill: Callable[[BinaryIO], object]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as out:
            fill(out)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno in DISK_FULL:
            raise disk_full(exc, path) from None
        raise
    return path


def tool_dir(project_root: Path, *parts: str) -> Path:
    """`<project>/.thrust/PARTS...`, made; .thrust/ is thrust-remote's own, so the first of its folders
    made also writes `.thrust/.gitignore` (`*`): out of `git status` and out of sync's untracked list."""
    where = project_root / ".thrust" / Path(*parts) if parts else project_root / ".thrust"
    where.mkdir(parents=True, exist_ok=True)
    ignore = project_root / ".thrust" / ".gitignore"
    if not ignore.exists():
        with contextlib.suppress(OSError):
            ignore.write_text("*\n")
    return where
