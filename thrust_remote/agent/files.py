"""`agent write-file PATH [--mode OCTAL]`: stdin to PATH atomically, owner-only by default.

For writes that `Runner.write_text` (a verified upload) does not fit: content produced next to a
command that runs anyway. Parents are made (0700); the file is written to a temporary name in the
same directory, fsynced, then renamed, so a reader sees the old content or the new, never half.
Answer: {"path", "bytes", "sha256"}.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import sys
import time


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # the umask may have taken bits from the mode asked for
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def lock_within(fd: int, seconds: float, poll: float = 0.05) -> bool:
    """An exclusive flock on `fd`, waited for at most `seconds`: False when its holder never let go (a
    process stopped while it held it), never a wait without end."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)


def locked(path: str) -> int:
    """`path` opened (made 0600 if need be) and exclusively flocked, waited for as long as it takes: the fd,
    whose close lets go. For a lock held well under a second (the launch lock, by a launch or a stop)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def unreadable(directory: str, names: tuple[str, ...]) -> str | None:
    """The first of `directory` and its files `names` that this account may not read (permission denied),
    or None. A file that is not there is not unreadable: it only says nothing."""
    if os.path.isdir(directory) and not os.access(directory, os.R_OK | os.X_OK):
        return directory
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, "rb"):
                pass
        except PermissionError:
            return path
        except OSError:
            continue
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent write-file")
    parser.add_argument("path")
    parser.add_argument("--mode", default="600", help="octal file mode (default 600: owner only)")
    args = parser.parse_args(argv)
    data = sys.stdin.buffer.read()
    try:
        write_atomic(args.path, data, int(args.mode, 8))
    except OSError as exc:
        sys.stderr.write(f"write-file {args.path}: {exc}\n")
        return 1
    print(json.dumps({"path": args.path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}))
    return 0
