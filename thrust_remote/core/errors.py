"""One error type and the exit-code table (docs/architecture.md, "Exit codes") that every command shares.

Library code raises `ThrustError`; the CLI's single top-level handler turns it into a short message,
an optional hint and the exit code. Tracebacks only with `--debug`.
"""

from __future__ import annotations

import contextlib
import errno
import os
from enum import IntEnum


class ExitCode(IntEnum):
    """sysexits-based codes: what a script calling thrust-remote can branch on."""

    OK = 0
    FAILED = 1  # the job failed, or doctor found a failing check
    USAGE = 64
    UNKNOWN_HOST = 68  # not in config, DNS failure
    UNAVAILABLE = 69  # unreachable, refused, timed out; or the host lacks python/torch
    TRANSFER = 74  # transfer or checksum failure
    CONNECTION_LOST = 75  # the run goes on and can be reattached
    HOST_KEY = 76  # host key unknown or changed
    AUTH = 77  # authentication failed
    CONFIG = 78  # configuration invalid
    INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C where nothing goes on without us (optimize's second one)


class ThrustError(Exception):
    """A failure the user can act on: what happened, what to do, and the process exit code. Each kind
    names its code as a class attribute; a plain ThrustError may be given any."""

    # how the CLI labels the message; not every non-zero exit is an error (a deliberate detach is not)
    label = "error"
    code: int = ExitCode.FAILED

    def __init__(self, message: str, hint: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = int(self.code if exit_code is None else exit_code)

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class ConfigError(ThrustError):
    """thrust.yaml (or a flag / THRUST_* variable) is invalid; the message names file, line and field."""

    code = ExitCode.CONFIG


class UsageError(ThrustError):
    code = ExitCode.USAGE


class HostKeyError(ThrustError):
    code = ExitCode.HOST_KEY


class AuthError(ThrustError):
    code = ExitCode.AUTH


class UnreachableError(ThrustError):
    code = ExitCode.UNAVAILABLE


class UnknownHostError(ThrustError):
    code = ExitCode.UNKNOWN_HOST


class ConnectionLostError(ThrustError):
    code = ExitCode.CONNECTION_LOST
    offset: int | None = None  # following a log: the byte offset delivered before the link broke
    run_id: str | None = None  # following a run: the run, and its node 0's host (a retry resumes it)
    host: str | None = None


class HostAnswerError(ThrustError):
    """A host's agent answered something that is not its protocol (a malformed line on the agent link):
    the host is not usable as it stands, as for a `python:` that is no Python."""

    code = ExitCode.UNAVAILABLE


class TransferError(ThrustError):
    code = ExitCode.TRANSFER


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(TransferError):
    """No room on this machine's disk for a file being written (74); `path`: that file."""

    path: str | None = None


def disk_full(exc: OSError, path: str | os.PathLike[str] | None = None) -> DiskFullError:
    """A write on this machine that found no room (ENOSPC, a quota): 74 naming the file and what its
    filesystem has free, never "internal error" (what was written before is whole: core/files.py)."""
    where = os.fspath(path or exc.filename or "") or None
    free = ""
    with contextlib.suppress(OSError):
        st = os.statvfs(os.path.dirname(os.path.abspath(where)) if where else ".")
        free = f" ({st.f_bavail * st.f_frsize / (1 << 20):.1f} MiB free there)"
    what = "no space left on this machine's disk" if exc.errno == errno.ENOSPC else "the disk quota is used up"
    error = DiskFullError(f"{what} writing {where or 'a file'}{free}",
                          "free some space there and run the same command again: what was fetched before is kept")
    error.path = where
    return error


class Interrupted(ThrustError):
    """Ctrl-C that no command turned into something more telling (a detach, a cut fetch): 130."""

    label = "interrupted"
    code = ExitCode.INTERRUPTED


class Detached(ThrustError):
    """Ctrl-C while following: the run goes on; exit 75 so a script does not take it for success."""

    label = "detached"
    code = ExitCode.CONNECTION_LOST
    run_id: str | None = None  # following a run: the run, and its node 0's host (a retry's hint names them)
    host: str | None = None


class StillGoing(ThrustError):
    """`wait --timeout` ran out before the runs ended: they go on; 75, as a detach, so a script can
    wait again."""

    label = "timeout"
    code = ExitCode.CONNECTION_LOST
