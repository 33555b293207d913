"""The first lines of every payload's `__main__.py` (payload.build_zipapp embeds this file's text): run
the zipapp from a copy of it unpacked beside it, its modules compiled.

Python compiles a zipapp's modules from source at every start (zipimport keeps no .pyc), and that was
about half of an agent command's CPU time (bench/bench_agent_start.py: 129 ms from the zip, 67 ms from
compiled modules, 9 ms for python alone). The first start of `NAME-<sha>.pyz` on a host unpacks it to
`NAME-<sha>/` beside it and compiles it there for the python that runs it, whatever
PYTHONDONTWRITEBYTECODE says (the directory is thrust-remote's own cache); every later start puts that
directory first on sys.path in place of the zip. The unpacking happens in a temporary directory renamed
into place, so the directory exists only whole, and several first starts at once (torchrun's ranks, the
nodes of a cluster scheduler's step) leave one. When it cannot be made (a read-only or full disk), the zip
runs as it always did.

Standard library only, Python 3.8+ (the hosts' floor), and nothing at module level but definitions:
build_zipapp appends the call to `start()`, which runs before the payload's own package is importable.
"""

from __future__ import annotations

import os
import sys

PART = ".part-"  # an unpacking under way (or cut): NAME-<sha>.part-XXXX, never imported from
STALE_PART_S = 600  # a part this old was cut (a first start is a second's work): the next unpacking removes it


def unpacked(pyz: str) -> str | None:
    """The directory to import the payload from instead of `pyz`, made on first use; None: use the zip."""
    if not pyz.endswith(".pyz"):
        return None
    target = pyz[: -len(".pyz")]
    if os.path.isdir(target):
        return target
    try:
        return _unpack(pyz, target)
    except Exception:  # a disk that is full or read-only, a zip cut short: the zip still runs
        return None


def _unpack(pyz: str, target: str) -> str | None:
    import compileall
    import contextlib
    import shutil
    import tempfile
    import zipfile

    part = tempfile.mkdtemp(prefix=os.path.basename(target) + PART, dir=os.path.dirname(target) or ".")
    try:
        with zipfile.ZipFile(pyz) as archive:
            archive.extractall(part)
        # ddir: compiled code names the final path, so a traceback shows a file that exists
        compileall.compile_dir(part, ddir=target, quiet=2, workers=1)
        with contextlib.suppress(OSError):  # another start put its copy there first
            os.rename(part, target)
        _remove_stale_parts(target)
        return target if os.path.isdir(target) else None
    finally:
        shutil.rmtree(part, ignore_errors=True)


def _remove_stale_parts(target: str) -> None:
    import glob
    import shutil
    import time

    for stale in glob.glob(glob.escape(target) + PART + "*"):
        try:
            if time.time() - os.stat(stale).st_mtime > STALE_PART_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            continue


def start() -> None:
    """Put the unpacked copy of the running zipapp (sys.path[0]) in its place on sys.path."""
    if sys.path and sys.path[0].endswith(".pyz"):
        found = unpacked(sys.path[0])
        if found is not None:
            sys.path[0] = found
