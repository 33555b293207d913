"""The `Runner` protocol: run an argv, move files, on this machine or on a host over SSH.

Every capability (doctor, sync, train, optimize) is written against `Runner` and never knows which
implementation it holds. `LocalRunner` uses subprocess without a shell; `SSHRunner` (thrust_remote/host/ssh/)
builds the remote command line with `shlex.join`, so an argument is always exactly one argument.

The command loop is written once (`drive`), as invoke's Runner does: each runner only starts its
command and supplies the `Process` hooks (read what arrived, exit status, liveness, kill).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import os
import queue
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol, runtime_checkable

from thrust_remote.core.errors import ConnectionLostError, ThrustError, TransferError, UsageError
from thrust_remote.core.names import valid_env_key
from thrust_remote.host.pipe import LOCAL_CARRIER, ProcessPipe

# A stream callback receives ("out" | "err", one line without its newline).
StreamCallback = Callable[[str, str], None]
# A byte callback receives ("out" | "err", a chunk exactly as it arrived): for byte-exact copies.
BytesCallback = Callable[[str, bytes], None]

TIMEOUT_EXIT = 124  # what coreutils' timeout(1) returns; scripts already know it


@dataclass
class RunResult:
    """What a command did. A non-zero exit is data, not an exception: callers decide."""

    argv: list[str]
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def check(self, what: str | None = None) -> RunResult:
        """Raise a ThrustError (exit 1) carrying stderr's tail unless the command succeeded."""
        if not self.ok:
            label = what or shlex.join(self.argv[:3])
            tail = (self.stderr or self.stdout).strip().splitlines()[-5:]
            detail = ("\n" + "\n".join(tail)) if tail else ""
            raise ThrustError(f"{label} failed with exit code {self.exit_code}{detail}")
        return self


# A file as a listing saw it on its host: (st_dev, st_ino).
FileId = tuple[int, int]


class FileChangedError(TransferError):
    """The path no longer names the file a listing saw (replaced, or a symlink now): nothing was copied."""


# A file to get: (its path on the host, where it goes here, the (dev, ino) a listing saw or None).
GetItem = tuple[str, Path, "FileId | None"]
# A file to put: (the file here, its path on the host[, the (dev, ino) the laptop checked, or None]).
PutItem = tuple[str | os.PathLike[str], str] | tuple[str | os.PathLike[str], str, FileId | None]


def put_items(items: Sequence[PutItem]) -> list[tuple[Path, str, FileId | None]]:
    """put_many's items, each as (local path, host path, identity or None)."""
    return [(Path(item[0]), item[1], item[2] if len(item) > 2 else None) for item in items]  # type: ignore[misc]


SEND_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def open_to_send(src: Path, identity: FileId | None) -> IO[bytes]:
    """The local file `src` opened for a put, nothing read yet. With `identity` (the (dev, ino) a check
    saw: `files:`), opened without following a link and only while it is still that regular file:
    a file swapped for a link (to ~/.ssh/id_ed25519, say), or reached through a directory swapped for
    one, since that check is refused (FileChangedError, 74, naming it) before a byte of it is read or
    a request for it goes to the host. Without, it must be a regular file (a FIFO never blocks a put)."""
    flags = SEND_FLAGS | (getattr(os, "O_NOFOLLOW", 0) if identity is not None else 0)
    try:
        fd = os.open(src, flags)
    except FileNotFoundError:
        raise TransferError(f"{src}: no such file") from None
    except OSError as exc:
        if identity is not None and os.path.islink(src):
            raise _not_sent(src, f"it is now a link to {_link_text(src)}") from None
        raise TransferError(f"cannot read {src}: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (identity is not None and (st.st_dev, st.st_ino) != tuple(identity)):
        os.close(fd)
        if identity is None:
            raise TransferError(f"{src}: not a regular file")
        raise _not_sent(src, "it is another file now")
    return os.fdopen(fd, "rb")


def _link_text(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"


def _not_sent(src: Path, why: str) -> FileChangedError:
    return FileChangedError(f"{src} was replaced since it was checked ({why}): nothing of it was sent",
                            "send it again once it is written")


def one_by_one(get: Callable[[str, Path, FileId | None], str], items: Sequence[GetItem],
               stop: threading.Event) -> Iterator[str | FileChangedError]:
    """`get_many` for a transfer that cannot pipeline: each item's get in turn, until `stop`."""
    for source, dst, identity in items:
        if stop.is_set():
            return
        try:
            yield get(source, dst, identity)
        except FileChangedError as exc:
            yield exc


_PART_IDS = itertools.count()
PART_FLAGS = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
              | getattr(os, "O_BINARY", 0))


def open_part(dst: Path) -> tuple[IO[bytes], Path]:
    """A new temporary file beside `dst` for a download: a short name (a 255-byte `dst` still fits),
    created exclusively, owner-only, never through a symlink (O_EXCL | O_NOFOLLOW, as mkstemp does;
    named by pid and a counter rather than mkstemp's random letters: a thousand-file fetch opens a
    thousand of them)."""
    for _ in range(1000):
        part = dst.parent / f".{dst.name[:24]}.{os.getpid()}-{next(_PART_IDS)}.part"
        try:
            fd = os.open(part, PART_FLAGS, 0o600)
        except FileExistsError:  # left by an earlier process with this pid: the next name
            continue
        return os.fdopen(fd, "wb"), part
    raise FileExistsError(f"no free temporary name beside {dst}")


def drop_part(part: Path) -> None:
    with contextlib.suppress(OSError):
        part.unlink()


def drop_orphan_parts(directory: Path, keep: Collection[Path] = ()) -> None:
    """Remove the temporary files (`open_part`'s names) in `directory` whose process is gone: a fetch
    or pull killed outright (SIGKILL, a laptop that slept and rebooted) leaves them, and nothing else
    ever would (a checkpoint's is GBs). A part of a process still running (another fetch) stays, and
    so does a path in `keep` (a host file that happens to have such a name, about to be fetched)."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            pid = _part_pid(entry.name)
            if pid is None or pid == os.getpid() or pid_alive(pid) or Path(entry.path) in keep:
                continue
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)


def _part_pid(name: str) -> int | None:
    """The pid in an `open_part` name (`.NAME.PID-N.part`), or None for any other name."""
    if not (name.startswith(".") and name.endswith(".part")):
        return None
    pid, dash, count = name[:-len(".part")].rpartition(".")[2].partition("-")
    return int(pid) if dash and pid.isdigit() and count.isdigit() else None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs here (another account's counts: signal 0 is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


LANDING_FILES = 256  # verified downloads held before one sync places them all
LANDING_BYTES = 64 << 20  # ...or this many of their bytes: a big file is placed about as soon as it lands


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """libc's syncfs(2) (Linux), or None. One call makes every file written on a filesystem durable;
    Python's os module has no binding for it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # only here: a few ms of import that nothing else needs

    try:
        func = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int]
    return func


class Landing:
    """Verified downloads (`.part` files) waiting for their final names, each outcome yielded in order.

    A file must be on disk before its final name points at it (a crash never leaves a short file under
    it), but an fsync per file costs 0.4-1 ms on ext4 here: a 1,000-file fetch spent up to a second
    in them. So a get of many files writes the parts without one, and `place` makes them durable with
    one syncfs of their filesystem (an fsync of each where there is none), then renames them.
    FileChangedError outcomes keep their place in the order; they have no file. A transfer stopped
    by an error places what it verified and yields those outcomes before raising; one its consumer
    stops `settle`s: what it verified lands all the same, unsaid.
    """

    def __init__(self) -> None:
        self.held: list[tuple[Path, Path, str] | FileChangedError] = []
        self.bytes = 0

    def add(self, outcome: tuple[Path, Path, str] | FileChangedError, size: int = 0) -> bool:
        """Hold one outcome ((part, dst, sha256) or the FileChangedError); True when it is time to place."""
        self.held.append(outcome)
        self.bytes += size
        return len(self.held) >= LANDING_FILES or self.bytes >= LANDING_BYTES

    def place(self) -> Iterator[str | FileChangedError]:
        """Sync the held parts, rename each over its destination, and yield each outcome in order."""
        held, self.held, self.bytes = self.held, [], 0
        parts = [h for h in held if not isinstance(h, FileChangedError)]
        try:
            _make_durable([part for part, _, _ in parts])
            for part, dst, _ in parts:
                os.replace(part, dst)
        except OSError as exc:
            for part, _, _ in parts:
                drop_part(part)
            raise TransferError(f"cannot place the fetched files in {parts[0][1].parent}: {exc}",
                                "the files already there are untouched; run the command again") from None
        for h in held:
            yield h if isinstance(h, FileChangedError) else h[2]

    def settle(self) -> None:
        """Place the held parts without yielding their outcomes (a transfer its consumer stopped: what
        was verified still lands, unrecorded, and a later fetch finds it by its hash); a part that
        cannot be placed is removed."""
        with contextlib.suppress(TransferError):
            for _ in self.place():
                pass


def _make_durable(parts: Sequence[Path]) -> None:
    """Every part's data on disk: one syncfs per filesystem they are on, else an fsync each."""
    syncfs = _syncfs() if parts else None
    if syncfs is not None:
        filesystems: dict[int, Path] = {}
        for parent in {part.parent for part in parts}:
            filesystems.setdefault(os.stat(parent).st_dev, parent)
        synced = True
        for parent in filesystems.values():
            fd = os.open(parent, os.O_RDONLY)
            try:
                synced = syncfs(fd) == 0 and synced
            finally:
                os.close(fd)
        if synced:
            return
    for part in parts:  # no syncfs (or it failed): each file on its own
        fd = os.open(part, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@runtime_checkable
class Runner(Protocol):
    """Where commands run. `name` is the host's name as the user wrote it (`local` for this machine)."""

    name: str

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stream: StreamCallback | None = None,
        stdin: bytes | None = None,
        on_bytes: BytesCallback | None = None,
    ) -> RunResult:
        """Run argv (never through a shell). `stream` gets lines as they arrive; `on_bytes` gets raw
        chunks instead (then stdout/stderr are not kept in the result)."""
        ...

    def put(self, local: str | os.PathLike[str], remote: str, *, identity: FileId | None = None) -> str:
        """Copy a local file to `remote` (verified, atomic); returns its sha256. With `identity` (what a
        check saw), `local` is opened without following a symlink and must still be that file, else
        FileChangedError before anything is sent (open_to_send)."""
        ...

    def put_many(self, items: Sequence[PutItem]) -> list[str]:
        """`put` of each (local, remote[, identity]), as fast as the runner can (SSH: streamed back to back
        on one channel); their sha256s in order. The first failure is raised once the puts under way are
        done: those before it are in place, some after it may be, and none is started once it is known
        (each is atomic: a remote path is the whole new file or untouched). An item with an identity is
        sent only while its file is still that one (a FileChangedError, none of its bytes sent)."""
        ...

    def get(self, remote: str, local: str | os.PathLike[str], *, identity: FileId | None = None) -> str:
        """Copy `remote` to a local file (verified, atomic); returns its sha256. With `identity` (what a
        listing saw), `remote` is opened without following a symlink and must still be that file, else
        FileChangedError."""
        ...

    def get_many(self, items: Sequence[GetItem], stop: threading.Event) -> Iterator[str | FileChangedError]:
        """`get` of each item, in order, as fast as the runner can (SSH: pipelined on one channel): each
        file's sha256, or the FileChangedError of a file replaced since it was listed; any other failure
        is raised. Asks nothing more once `stop` is set."""
        ...

    def warm_transfers(self, count: int) -> None:
        """Start up to `count` transfers' helpers now, in the background, for gets about to come (SSH:
        each costs a login shell and a python on the host, paid beside whatever runs meanwhile)."""
        ...

    def exists(self, path: str) -> bool: ...

    def home(self) -> str:
        """The home directory where `~` in a path points."""
        ...

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str | None:
        """A file's text, or None when it does not exist; TransferError (74) naming the host and the
        file when it is larger than `max_bytes` (only that much is read)."""
        ...

    def write_text(self, path: str, text: str) -> None:
        """Write a file atomically (verified copy, then rename), owner-only, parents made as needed."""
        ...

    def makedirs(self, path: str) -> None:
        """`mkdir -p` on the runner's side."""
        ...

    def close(self) -> None: ...


class FileOps:
    """The file operations every capability needs, written once on top of `run` and `put`.

    write_text goes through `put`, so it is atomic and verified on both runners and needs no shell
    snippet on the host; the temporary file is 0600, and put keeps that mode.
    """

    name: str

    if TYPE_CHECKING:  # provided by the runner itself
        def run(self, argv: Sequence[str], **kwargs: object) -> RunResult: ...
        def put(self, local: str | os.PathLike[str], remote: str, *, identity: FileId | None = None) -> str: ...

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str | None:
        result = self.run(["cat", "--", path] if max_bytes is None else ["head", "-c", str(max_bytes + 1), "--", path])
        if result.ok:
            return too_large(result.stdout, path, self.name, max_bytes)
        if "No such file" in result.stderr:
            return None
        result.check(f"read {path} on {self.name}")
        return None

    def write_text(self, path: str, text: str) -> None:
        with tempfile.TemporaryDirectory(prefix="thrust-write-") as tmp:
            local = os.path.join(tmp, "data")
            fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            self.put(local, path)

    def makedirs(self, path: str) -> None:
        self.run(["mkdir", "-p", "--", path]).check(f"mkdir -p {path} on {self.name}")

    def warm_transfers(self, count: int) -> None:
        return None  # nothing to start: a copy here is the copy itself

    def put_many(self, items: Sequence[PutItem]) -> list[str]:
        return [self.put(local, remote, identity=identity) for local, remote, identity in put_items(items)]

    def get_many(self, items: Sequence[GetItem], stop: threading.Event) -> Iterator[str | FileChangedError]:
        return one_by_one(lambda source, dst, identity: self.get(source, dst, identity=identity), items, stop)


def too_large(text: str, path: str, host: str, max_bytes: int | None, *, size: int | None = None) -> str:
    """`text` when it is within `max_bytes` (`size`: its bytes, when known before decoding), else the
    TransferError that names the file and its host: a host's file read with a limit is never taken in part."""
    size = len(text.encode("utf-8", "surrogateescape")) if size is None and max_bytes is not None else size
    if max_bytes is not None and size is not None and size > max_bytes:
        raise TransferError(f"{path} on {host} is larger than {max_bytes:,} bytes: not read",
                            f"a file of this kind is a few KB; look at it there (ls -l {path}): something other "
                            "than thrust-remote wrote it")
    return text


def check_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """Env keys must be plain identifiers; values may be anything (they are always quoted)."""
    out: dict[str, str] = {}
    for key, value in (env or {}).items():
        if not valid_env_key(key):
            raise UsageError(f"environment variable name {key!r} is not a valid identifier")
        if "\0" in str(value):
            raise UsageError(f"environment variable {key} contains a NUL byte")
        out[key] = str(value)
    return out


def check_argv(argv: Sequence[str]) -> list[str]:
    args = [str(a) for a in argv]
    if not args:
        raise UsageError("empty command")
    if any("\0" in a for a in args):
        raise UsageError("a command argument contains a NUL byte")
    return args


def expand_home(path: str, home: str) -> str:
    """`~` and `~/x` relative to the runner's home (no `~user`: that is a name we would not validate)."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class _LineSplitter:
    """Turns chunks into lines for a StreamCallback, keeping the partial line until it completes."""

    def __init__(self, name: str, callback: StreamCallback | None, raw: BytesCallback | None = None) -> None:
        self.name = name
        self.callback = callback
        self.raw = raw
        self.pending = b""
        self.chunks: list[bytes] = []

    def feed(self, data: bytes) -> None:
        if self.raw is not None:
            self.raw(self.name, data)
            return  # a byte consumer keeps what it needs; do not hold a copy of a long log
        self.chunks.append(data)
        if self.callback is None:
            return
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self.callback(self.name, line.decode("utf-8", "replace"))

    def close(self) -> str:
        if self.callback is not None and self.pending:
            self.callback(self.name, self.pending.decode("utf-8", "replace"))
            self.pending = b""
        return b"".join(self.chunks).decode("utf-8", "replace")


class LinkUnavailable(Exception):  # noqa: N818 - not the user's error: the caller runs commands instead
    """An agent link (AgentLink.open) did not come up; `text` is what the host said meanwhile."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class LinkLost(Exception):  # noqa: N818 - an event the loop turns into ConnectionLostError
    """Raised by a Process hook: the link died under the command, no exit status will come. `error`: what
    to tell the user when the hook knows the cause better than "connection lost" (StalledError)."""

    def __init__(self, error: ConnectionLostError | None = None) -> None:
        super().__init__(error.message if error is not None else "")
        self.error = error


class StalledError(ConnectionLostError):
    """A process on the host that the laptop talks to (`agent serve`) stopped answering while its
    connection still does: stopped (SIGSTOP, a debugger) or frozen. Only that process is given up; a
    request that only reads may be asked again of a fresh one (host/session.py)."""


class Process(Protocol):
    """One started command, as `drive` sees it: the hooks each runner writes (docs/architecture.md,
    "Runners and the SSH layer"). The loop itself (timeouts, line splitting, liveness, the result) is `drive`."""

    # True when the command runs under the host's timeout(1): the loop waits a grace period past
    # the deadline for it, and exit 124 under a timeout means "timed out". Else the loop kills.
    host_enforces_timeout: bool

    def read(self, wait: float) -> list[tuple[str, bytes]]:
        """The output that arrived, as ("out" | "err", chunk) in order; waits up to `wait` s for some."""
        ...

    def exit_code(self) -> int | None:
        """The exit status once the command ended and its output was read; else None. LinkLost if none
        will ever come."""
        ...

    def alive(self) -> bool:
        """After `liveness_timeout` s of silence: does the other end still answer? (LinkLost with its
        error when the hook can say more than "no": StalledError.)"""
        ...

    def kill(self) -> None:
        """The deadline passed: end the command (what it printed so far is still read once)."""
        ...

    def lost(self) -> None:
        """The link died (LinkLost): forget it, so the next command starts afresh."""
        ...


TIMEOUT_GRACE_S = 15.0  # past the deadline, how long the host's timeout(1) gets to end a command
POLL_S = 0.5


def drive(
    process: Process,
    args: list[str],
    *,
    name: str,
    started: float,
    timeout: float | None,
    stream: StreamCallback | None,
    on_bytes: BytesCallback | None,
    liveness_timeout: float | None,
) -> RunResult:
    """Run the command loop over a started process: read and split output until it ends, enforce the
    timeout (exit 124), probe a silent link, and raise ConnectionLostError (75) if it dies."""
    splitters = {"out": _LineSplitter("out", stream, on_bytes), "err": _LineSplitter("err", stream, on_bytes)}
    grace = TIMEOUT_GRACE_S if process.host_enforces_timeout else 0.0
    deadline = None if timeout is None else started + timeout + grace
    quiet_since = time.monotonic()
    try:
        while True:
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            chunks = process.read(wait)
            for which, data in chunks:
                splitters[which].feed(data)
            code = process.exit_code()
            if code is not None:
                # output that came with the end after the read above (data, EOF, status and close in one
                # burst: a closed channel ends the command) is still buffered; unread, a short command's
                # whole answer was lost (`logs` of a finished run printed nothing, once in a suite)
                for which, data in process.read(0):
                    splitters[which].feed(data)
                break
            now = time.monotonic()
            if chunks:
                quiet_since = now
            elif liveness_timeout is not None and now - quiet_since > liveness_timeout:
                if not process.alive():
                    raise LinkLost
                quiet_since = time.monotonic()
            if deadline is not None and now >= deadline:
                process.kill()
                for which, data in process.read(0):
                    splitters[which].feed(data)
                out, err = (s.close() for s in splitters.values())
                return RunResult(args, TIMEOUT_EXIT, out, err, now - started, True)
    except LinkLost as lost:
        process.lost()
        out, _err = (s.close() for s in splitters.values())
        exc = lost.error or ConnectionLostError(
            f"connection to {name} lost while running {shlex.join(args[:3])}",
            "the command may still be running on the host",
        )
        exc.partial_stdout = out  # type: ignore[attr-defined]
        raise exc from None
    except BaseException:
        # Ctrl-C (or a callback's error) stops the command too, not only the wait for it: over SSH
        # closing the channel is what ends it on the host (agent/envexec.py's watch)
        with contextlib.suppress(Exception):
            process.kill()
        raise
    out, err = (s.close() for s in splitters.values())
    timed_out = process.host_enforces_timeout and timeout is not None and code == TIMEOUT_EXIT
    return RunResult(args, code, out, err, time.monotonic() - started, timed_out)


class _LocalProcess:
    """A subprocess: two threads pump its pipes into a queue that `read` empties."""

    host_enforces_timeout = False
    PIPE_GRACE_S = 5.0  # after the process exits, how long a child that kept its pipes gets

    def __init__(self, args: list[str], env: dict[str, str], cwd: str | None, stdin: bytes | None) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - argv, no shell
            args,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # so a timeout can kill the whole group
        )
        self.queue: queue.SimpleQueue[tuple[str, bytes | None]] = queue.SimpleQueue()
        self.open_pipes = 2
        self.exited_at: float | None = None
        self.pumps = [threading.Thread(target=self._pump, args=(pipe, which), daemon=True)
                      for pipe, which in ((self.proc.stdout, "out"), (self.proc.stderr, "err"))]
        for t in self.pumps:
            t.start()
        if stdin is not None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.write(stdin)
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def _pump(self, pipe: IO[bytes], which: str) -> None:
        for chunk in iter(lambda: pipe.read1(65536), b""):  # type: ignore[attr-defined]
            self.queue.put((which, chunk))
        self.queue.put((which, None))  # this pipe is at EOF

    def read(self, wait: float) -> list[tuple[str, bytes]]:
        if self.open_pipes == 0:  # nothing more will come: wait for the exit instead
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
            return []
        chunks: list[tuple[str, bytes]] = []
        try:
            item = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
            while True:
                which, data = item
                if data is None:
                    self.open_pipes -= 1
                else:
                    chunks.append((which, data))
                item = self.queue.get_nowait()
        except queue.Empty:
            return chunks

    def exit_code(self) -> int | None:
        returncode = self.proc.poll()
        if returncode is None:
            return None
        now = time.monotonic()
        self.exited_at = self.exited_at or now
        if not self.queue.empty() or (self.open_pipes and now - self.exited_at < self.PIPE_GRACE_S):
            return None
        return _exit_code(returncode)

    def alive(self) -> bool:
        return True

    def kill(self) -> None:
        _kill_group(self.proc)
        self.proc.wait()
        for t in self.pumps:
            t.join(timeout=self.PIPE_GRACE_S)

    def lost(self) -> None:
        """A local process has no link to lose."""


@dataclass
class LocalRunner(FileOps):
    """Runs on this machine with subprocess, never through a shell."""

    name: str = "local"
    # PipeHost's: a local process's pipe has no link to lose, so a silent one is never probed
    liveness_timeout: float | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        stream: StreamCallback | None = None,
        stdin: bytes | None = None,
        on_bytes: BytesCallback | None = None,
    ) -> RunResult:
        args = check_argv(argv)
        full_env = {**os.environ, **check_env(env)}
        if cwd is not None:
            cwd = expand_home(cwd, self.home())
        started = time.monotonic()
        if cwd is not None and not os.path.isdir(cwd):
            # what `cd DIR && cmd` says over SSH, so both runners report it alike
            return RunResult(args, 1, "", f"cd: {cwd}: No such file or directory", time.monotonic() - started)
        try:
            process = _LocalProcess(args, full_env, cwd, stdin)
        except FileNotFoundError:
            return RunResult(args, 127, "", f"{args[0]}: command not found", time.monotonic() - started)
        except PermissionError as exc:
            return RunResult(args, 126, "", f"{args[0]}: {exc}", time.monotonic() - started)
        except NotADirectoryError as exc:
            return RunResult(args, 1, "", f"cd {cwd}: {exc}", time.monotonic() - started)
        return drive(process, args, name=self.name, started=started, timeout=timeout, stream=stream,
                     on_bytes=on_bytes, liveness_timeout=None)

    def put(self, local: str | os.PathLike[str], remote: str, *, identity: FileId | None = None) -> str:
        src = Path(local)
        return _copy_verified(src, Path(expand_home(remote, self.home())), opened=open_to_send(src, identity))

    def get(self, remote: str, local: str | os.PathLike[str], *, identity: FileId | None = None) -> str:
        return _copy_verified(Path(expand_home(remote, self.home())), Path(local), identity)

    def exists(self, path: str) -> bool:
        return Path(expand_home(path, self.home())).exists()

    def home(self) -> str:
        return os.path.expanduser("~")

    def read_text(self, path: str, *, max_bytes: int | None = None) -> str | None:
        try:
            with Path(expand_home(path, self.home())).open("rb") as fh:
                data = fh.read(-1 if max_bytes is None else max_bytes + 1)
        except FileNotFoundError:
            return None
        return too_large(data.decode("utf-8", "replace"), path, self.name, max_bytes, size=len(data))

    def makedirs(self, path: str) -> None:
        Path(expand_home(path, self.home())).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ pipes (host/pipe.py's PipeHost)

    def carrier(self) -> object:
        return LOCAL_CARRIER

    def open_pipe(self, argv: Sequence[str], *, stderr_too: bool = False, reconnect: bool = True) -> ProcessPipe:
        """argv as a subprocess of this machine, with a pipe to its stdin and stdout (an OSError, one of
        PIPE_ERRORS, when it cannot start)."""
        return ProcessPipe(check_argv(argv), stderr_too=stderr_too)

    def alive(self, timeout: float | None = None) -> bool:
        return True  # nothing between here and the process to lose

    def drop(self) -> None:
        """Nothing carries a local pipe: nothing to forget."""

    def close(self) -> None:
        self._closed = True


def _exit_code(returncode: int) -> int:
    # subprocess reports death by signal N as -N; the shell convention (docs/architecture.md, "Exit codes") is 128+N.
    return 128 - returncode if returncode < 0 else returncode


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def _open_source(src: Path, identity: FileId | None) -> IO[bytes]:
    if identity is None:
        if not src.is_file():
            raise TransferError(f"{src}: no such file")
        return open(src, "rb")  # noqa: SIM115 - the caller closes it
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise TransferError(f"{src}: no such file") from None
    except OSError as exc:
        if src.is_symlink():
            raise FileChangedError(f"{src} is now a symlink") from None
        raise TransferError(f"cannot read {src}: {exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != tuple(identity):
        os.close(fd)
        raise FileChangedError(f"{src} is no longer the file that was listed")
    return os.fdopen(fd, "rb")


def _copy_verified(src: Path, dst: Path, identity: FileId | None = None, *, opened: IO[bytes] | None = None) -> str:
    """Copy through a temporary file beside dst (open_part), hashing while copying; rename only when
    the copy's hash matches. A failure (or Ctrl-C) removes the temporary file. `opened`: `src` opened
    already (a put: open_to_send)."""
    digest = hashlib.sha256()
    with (opened if opened is not None else _open_source(src, identity)) as fin:
        dst.parent.mkdir(parents=True, exist_ok=True)
        fout, part = open_part(dst)
        try:
            try:
                with fout:
                    while block := fin.read(1 << 20):
                        digest.update(block)
                        fout.write(block)
                    fout.flush()
                    os.fsync(fout.fileno())
            except OSError as exc:
                raise TransferError(f"copy {src} -> {dst} failed: {exc}") from exc
            expected = digest.hexdigest()
            if sha256_file(part) != expected:
                raise TransferError(f"checksum mismatch copying {src} -> {dst}", "retry the command")
            os.chmod(part, os.fstat(fin.fileno()).st_mode & 0o777)
            os.replace(part, dst)
        except BaseException:
            drop_part(part)
            raise
    return expected
