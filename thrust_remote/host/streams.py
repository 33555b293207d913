"""Verified transfers through the streaming helper (agent/xfer.py), over byte pipes (host/pipe.py).

The promise (docs/architecture.md, "Transfers"): the bytes go to a `.part` file, are hashed with sha256
on both ends while they move, and the `.part` is renamed over the destination only when both hashes
agree. A cut transfer leaves the destination untouched (exit 74); the helper removes an upload's `.part`
when it fails or is cut.

`StreamTransfer`: one python process on the host per concurrent transfer, started on the first transfer
and reused, reached over a byte pipe that the host's transport opens (over SSH an exec channel). It runs
the source of thrust_remote/agent/xfer.py (`serve`; the protocol is in that file's docstring), which
reads or writes the file and hashes the same bytes as they pass. No second read of the file, no SFTP
request per 32 KiB (paramiko's SFTP costs ~2x the CPU), no login shell + python start-up per file
(root's ~/.bashrc here costs 90-300 ms a command). Concurrent transfers each take their own helper. When
the host cannot run the helper, its `fallback` (SSH: SFTP, host/ssh/transfer.py) moves the bytes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from thrust_remote.agent import xfer
from thrust_remote.agent.xfer import MAGIC
from thrust_remote.core.errors import TransferError
from thrust_remote.host.pipe import PIPE_ERRORS, BytePipe, PipeHost
from thrust_remote.host.runner import (
    FileChangedError,
    FileId,
    GetItem,
    Landing,
    drop_part,
    one_by_one,
    open_part,
    open_to_send,
)

CHUNK = 1 << 20
STREAM_RECV = 1 << 22  # more than an SSH channel's window: paramiko's BufferedPipe hands over all it holds


@functools.cache
def xfer_source() -> str:
    """The host side's program: agent/xfer.py as installed with this package, run with `python -c`."""
    return Path(xfer.__file__).read_text(encoding="utf-8")


def xfer_argv(python: str, *args: str) -> list[str]:
    """`xfer` without uploading anything first: the agent is itself uploaded by a transfer."""
    return [python, "-S", "-c", xfer_source(), *args]


class Transfer(ABC):
    """Copy one file each way, verified and atomic; both return the file's sha256."""

    @abstractmethod
    def put(self, src: Path, target: str, identity: FileId | None = None) -> str:
        """Upload the local file `src` to the absolute host path `target`; with `identity`, only while
        `src` is still that file (open_to_send: refused before a byte goes)."""

    @abstractmethod
    def get(self, source: str, dst: Path, identity: FileId | None = None) -> str:
        """Download the absolute host path `source` to `dst` (whose parent exists); with `identity`,
        only while `source` is still that file (Runner.get)."""

    def put_many(self, items: Sequence[tuple[Path, str, FileId | None]]) -> list[str]:
        """Runner.put_many: here one put after another."""
        return [self.put(src, target, identity) for src, target, identity in items]


class Named(Protocol):
    name: str


class Link(PipeHost, Protocol):
    """What a transfer needs from the runner that reaches the host: its pipes (PipeHost), the python
    that runs the helper, and whether a carrier is open now (a warm never opens one)."""

    python: str
    liveness_timeout: float

    def connected(self, wait: bool = False) -> bool: ...


def upload_part(target: str) -> str:
    """The temporary name an upload writes beside `target` until both hashes agree: short (a 255-byte
    name still fits), hidden, and its own (a random token), so two uploads of one path at once (two
    commands sending the same payload to a fresh host) never write into each other's file."""
    parent, name = os.path.split(target)
    return os.path.join(parent, f".{name[:24]}.{secrets.token_hex(6)}.part")


UPLOAD_HINT = "the destination is untouched; run the command again"


def mismatch_upload(link: Named, src: Path, target: str, expected: str, actual: str) -> TransferError:
    return TransferError(
        f"checksum mismatch uploading {src} to {link.name}:{target}: sent {expected[:16]}…, host has {actual[:16]}…",
        UPLOAD_HINT,
    )


def mismatch_download(link: Named, source: str, dst: Path, theirs: str, ours: str) -> TransferError:
    return TransferError(
        f"checksum mismatch downloading {link.name}:{source}: host {theirs[:16]}…, received {ours[:16]}…",
        f"{dst} is untouched; run the command again",
    )


def _close_quietly(chan: BytePipe) -> None:
    with contextlib.suppress(Exception):  # closing on a dead link may raise anything
        chan.close()


WINDOW = 32  # gets asked ahead of their answers on one helper: ~5 KB of requests, never a full window
# A put_many stops sending while this much is unanswered: a host that refuses a file (its disk full)
# is heard before gigabytes more go out for nothing.
SEND_AHEAD_BYTES = 64 << 20


@dataclass(frozen=True)
class _Sent:
    """A `send` on its way: what its answer is checked against."""

    index: int
    src: Path
    target: str
    sha: str  # what was sent (zeros when the local file failed: `problem`)
    size: int
    problem: Exception | None


READY_S = 60.0  # how long a helper gets to say it is ready (a login shell and a python start on a slow box)


class _Helper:
    """One helper's channel (a BytePipe), the bytes read from it but not used yet, and how to talk to it.

    A keepalive proves the connection, not the helper: one stopped (SIGSTOP) or frozen leaves the
    connection answering and a transfer waiting forever. So a helper that neither sends nor reads for
    `stall_s` while a request is outstanding is given up (`stalled` says what it stopped doing)."""

    def __init__(self, chan: BytePipe, alive: Callable[[], bool], stall_s: float) -> None:
        self.chan = chan
        self.alive = alive
        self.stall_s = stall_s
        self.stalled: str | None = None
        self.buf = bytearray()
        self.in_step = False  # True once an operation ended cleanly: safe to reuse

    def recv(self, patience: float | None = None) -> bytes | None:
        """The next stdout block; b"" at EOF, None when the link is dead (no reply to a probe) or the
        helper sent nothing for `patience` (stall_s by default) s while the connection answered."""
        since = time.monotonic()
        while True:
            try:
                return self.chan.recv(STREAM_RECV)
            except TimeoutError:
                if not self.alive() or self._stuck("sending", since, patience):
                    return None
            except PIPE_ERRORS:  # over SSH recv may send a window adjust on a dead link
                return None

    def send(self, data: bytes) -> bool:
        """Send all of data; False if the host stopped reading (ended, or stalled) or the link is dead."""
        view = memoryview(data)  # slicing a view copies nothing; every pipe accepts it
        since = time.monotonic()
        while view:
            try:
                sent = self.chan.send(view)
            except TimeoutError:
                if not self.alive() or self._stuck("reading", since):
                    return False
                continue
            except PIPE_ERRORS:
                return False
            if sent <= 0:
                return False
            view, since = view[sent:], time.monotonic()
        return True

    def _stuck(self, doing: str, since: float, patience: float | None = None) -> bool:
        """True (and `stalled` set) once the helper did nothing for `patience` s though the connection
        answers: its process is stopped or frozen, and nothing more will come from it."""
        idle = time.monotonic() - since
        if idle < (patience or self.stall_s):
            return False
        self.stalled = f"stopped {doing} for {idle:.0f} s (its process is stopped or frozen; the connection answers)"
        return True

    def line(self) -> list[str] | None:
        """The helper's next reply in words; None if its channel ended (or it is out of step)."""
        while (nl := self.buf.find(b"\n")) < 0:
            block = self.recv()
            if not block:
                return None
            self.buf += block
        line = bytes(self.buf[:nl])
        del self.buf[:nl + 1]
        if not line.startswith(MAGIC):
            return None
        return line[len(MAGIC):].decode("utf-8", "replace").split() or None

    def ask(self, request: str) -> list[str] | None:
        return self.line() if self.send(request.encode()) else None

    def copy_to(self, n: int, digest: hashlib._Hash, fout: IO[bytes]) -> bool:
        """Hash and write the helper's next n bytes; False if its channel ended first."""
        while n > 0:
            if self.buf:
                block = bytes(self.buf[:n])
                del self.buf[:n]
            else:
                block = self.recv()
                if not block:
                    return False
                if len(block) > n:
                    self.buf += block[n:]
                    block = block[:n]
            digest.update(block)
            fout.write(block)
            n -= len(block)
        return True

    def wait_ready(self) -> bool | None:
        """Skip what an rc file printed before the helper: True when it is ready, False when the
        host could not run it (the channel ended), None when the link is dead."""
        ready = MAGIC + b"ready\n"
        while (at := self.buf.find(ready)) < 0:
            block = self.recv(READY_S) if len(self.buf) <= 1 << 16 else b""
            if block is None or (not block and not self.chan.carrier_alive()):
                return None
            if not block:
                return False
            self.buf += block
        del self.buf[:at + len(ready)]
        return True


def _hex(path: str) -> str:
    return "x" + path.encode("utf-8", "surrogateescape").hex()


def _err_text(reply: list[str]) -> str:
    return bytes.fromhex(reply[2]).decode("utf-8", "replace") if len(reply) > 2 else "?"


class StreamTransfer(Transfer):
    """Transfers through pooled `xfer serve` helpers; `fallback` when the host cannot run one."""

    def __init__(self, link: Link, fallback: Transfer) -> None:
        self.link = link
        self.fallback = fallback
        self._lock = threading.Condition()  # this runner's pool only, held to take or give one helper
        self._idle: list[_Helper] = []
        self._warming = 0  # helpers being started by warm(): a get waits for one of them
        self._unusable: object = None  # the carrier on which no helper could start (no python there)

    def _take(self, *, fresh: bool = False) -> _Helper | None:
        """An idle helper on the current connection, or a new one; None if the host cannot run it.
        `fresh` (a background warm): always a new one, on the connection open now, else None: a warm
        never opens a connection, and a failure of its own drops none."""
        if fresh and not self.link.connected():
            return None
        carrier = self.link.carrier()
        with self._lock:
            if not fresh:
                self._lock.wait_for(lambda: self._idle or not self._warming)
            self._idle = [h for h in self._idle if h.chan.carrier() is carrier and not h.chan.ended()]
            if self._idle and not fresh:
                return self._idle.pop()
            if self._unusable is carrier:
                return None
        name = self.link.name
        try:
            chan = self.link.open_pipe(xfer_argv(self.link.python, "serve"), reconnect=not fresh)
            chan.settimeout(self.link.liveness_timeout)
        except PIPE_ERRORS as exc:
            if not fresh:
                self.link.drop()
            raise TransferError(f"cannot start a transfer on {name}: {exc}", "run the command again") from None
        # as long a silence as a dead link takes to be noticed: a silent stretch, then a probe's wait
        helper = _Helper(chan, self.link.alive, 2 * self.link.liveness_timeout)
        ready = helper.wait_ready()
        if not ready:
            _close_quietly(chan)
            if helper.stalled is not None:
                raise TransferError(f"the transfer helper on {name} {helper.stalled} as it started",
                                    "run the command again")
            if ready is None:
                if not fresh:
                    self.link.drop()
                raise TransferError(f"connection to {name} lost before the transfer started", "run the command again")
            self._unusable = chan.carrier()
            return None
        return helper

    def warm(self, count: int) -> None:
        """Start helpers in the background until `count` are idle; a get takes one already started. A
        failure in the background is left for that get to meet (and report) again; the warm never opens
        a connection (none there: nothing is warmed)."""
        def start() -> None:
            try:
                with contextlib.suppress(Exception):
                    # after a connect under way (the session's link start), and never opening one: a
                    # host that is down or a runner closed meanwhile costs nothing more
                    if not self.link.connected(wait=True):
                        return
                    helper = self._take(fresh=True)
                    if helper is not None and not self.link.connected():
                        _close_quietly(helper.chan)  # the connection went meanwhile: nobody will take it
                        return
                    if helper is not None:
                        helper.in_step = True
                        self._give(helper)
            finally:
                with self._lock:
                    self._warming -= 1
                    self._lock.notify_all()

        with self._lock:
            more = max(0, count - len(self._idle) - self._warming)
            self._warming += more
        for i in range(more):
            try:
                threading.Thread(target=start, name=f"transfer-warm-{i}", daemon=True).start()
            except RuntimeError:  # no thread to be had (a limit, the interpreter ending): no warm, no wait
                with self._lock:
                    self._warming -= 1
                    self._lock.notify_all()

    def _give(self, helper: _Helper) -> None:
        if not helper.in_step:
            _close_quietly(helper.chan)  # the helper sees its stdin end, removes an upload's part, exits
            return
        helper.in_step = False
        with self._lock:
            self._idle.append(helper)
            self._lock.notify_all()

    def _lost(self, helper: _Helper, cut: str, hint: str) -> TransferError:
        _close_quietly(helper.chan)
        if helper.stalled is not None:  # only that process is stuck: the connection stays for the next one
            return TransferError(f"{cut}: the transfer helper on {self.link.name} {helper.stalled}", hint)
        if not helper.chan.carrier_alive():
            self.link.drop()
            return TransferError(cut, hint)
        return TransferError(f"{cut}: the transfer helper on the host stopped", hint)

    def put(self, src: Path, target: str, identity: FileId | None = None) -> str:
        helper = self._take()
        if helper is None:
            return self.fallback.put(src, target, identity)  # no usable python on the host
        try:
            return self._put(helper, src, target, identity)
        finally:
            self._give(helper)

    def put_many(self, items: Sequence[tuple[Path, str, FileId | None]]) -> list[str]:
        """Runner.put_many on one helper (`_Sends`)."""
        helper = self._take()
        if helper is None:
            return self.fallback.put_many(items)  # no usable python on the host
        try:
            return _Sends(self, helper).run(items)
        finally:
            self._give(helper)  # a helper left out of step (cut, or a raise) is closed, not reused

    def _put(self, helper: _Helper, src: Path, target: str, identity: FileId | None) -> str:
        helper.in_step = True  # nothing asked yet: a file refused leaves the helper as usable as it was
        fin = open_to_send(src, identity)  # before the request: a file refused sends nothing at all
        helper.in_step = False
        name, part, st = self.link.name, upload_part(target), os.fstat(fin.fileno())
        cut = f"upload of {src} to {name}:{target} was cut"
        hint = UPLOAD_HINT
        with fin:
            reply = helper.ask(f"put {_hex(part)} {_hex(target)} {st.st_size} {st.st_mode & 0o777:o}\n")
            if not reply:
                raise self._lost(helper, cut, hint)
            if reply[0] == "err":
                helper.in_step = True
                raise TransferError(f"cannot write {name}:{target}: {_err_text(reply)}")
            digest = hashlib.sha256()
            left = st.st_size
            try:
                while left > 0 and (block := fin.read(min(CHUNK, left))):
                    digest.update(block)
                    if not helper.send(block):
                        raise self._lost(helper, cut, hint)
                    left -= len(block)
            except OSError as exc:
                raise TransferError(f"cannot read {src}: {exc}", hint) from None
        if left:
            raise TransferError(f"{src} shrank while it was being sent", hint)
        expected = digest.hexdigest()
        if not (reply := helper.ask(expected)):
            raise self._lost(helper, cut, hint)
        helper.in_step = True
        if reply[0] == "err":
            raise TransferError(f"upload of {src} to {name}:{target} failed: {_err_text(reply)}", hint)
        actual = reply[1] if len(reply) > 1 else ""
        if reply[0] != "ok" or actual != expected:
            raise mismatch_upload(self.link, src, target, expected, actual)
        return expected

    def get(self, source: str, dst: Path, identity: FileId | None = None) -> str:
        helper = self._take()
        if helper is None:
            return self.fallback.get(source, dst, identity)  # no usable python on the host
        try:
            return self._get(helper, source, dst, identity)
        finally:
            self._give(helper)

    def get_many(self, items: Sequence[GetItem], stop: threading.Event) -> Iterator[str | FileChangedError]:
        """Each item's get, in order, pipelined on one helper: up to WINDOW requests are in flight, so a
        small file costs its bytes, not a round trip (the helper answers its requests in order). The
        verified files land together (Landing: one sync for many, not an fsync each). Yields each file's
        sha256 once it is in place, or the FileChangedError of a file replaced since it was listed; any
        other failure is raised, as `get` raises it, once the files verified before it have landed
        and their outcomes are yielded. Asks nothing more once `stop` is set."""
        helper = self._take()
        if helper is None:
            yield from one_by_one(self.fallback.get, items, stop)  # no usable python on the host
            return
        asked = answered = 0
        landing = Landing()
        try:
            for source, dst, _identity in items:
                # topped up once half the window is answered, all in one write: a packet (and a read on
                # the host) per 16 requests, not one each (1,000 small files: 63 writes, not 1,000)
                if asked - answered <= WINDOW // 2 and asked < len(items) and not stop.is_set():
                    more = items[asked:answered + WINDOW]
                    batch = "".join(self._get_request(ahead, ahead_id) for ahead, _, ahead_id in more)
                    if not helper.send(batch.encode()):
                        raise self._lost(helper, f"download of {self.link.name}:{more[0][0]} was cut",
                                         "run the command again")
                    asked += len(more)
                if answered == asked:
                    break  # stopped: nothing left in flight
                answered += 1
                try:
                    sha, part, size = self._get_answer(helper, source, dst, durable=False)
                    full = landing.add((part, dst, sha), size)
                except FileChangedError as exc:
                    full = landing.add(exc)
                if full:
                    yield from landing.place()
            yield from landing.place()
        except GeneratorExit:
            raise  # the consumer wants no more outcomes: `finally` lands the held parts unsaid
        except BaseException:
            # an error or a cut link (Ctrl-C closes it): the files verified before it land and their
            # outcomes are said, so a fetch records every file it leaves under a final name
            with contextlib.suppress(TransferError):  # cannot place them: they are removed, the first error stands
                yield from landing.place()
            raise
        finally:
            landing.settle()  # stopped by its consumer: the verified parts still land
            if answered != asked:
                helper.in_step = False  # answers still on their way: this helper is closed, not reused
            self._give(helper)

    @staticmethod
    def _get_request(source: str, identity: FileId | None) -> str:
        expect = f" {identity[0]} {identity[1]}" if identity is not None else ""
        return f"get {_hex(source)}{expect}\n"

    def _get(self, helper: _Helper, source: str, dst: Path, identity: FileId | None) -> str:
        if not helper.send(self._get_request(source, identity).encode()):
            raise self._lost(helper, f"download of {self.link.name}:{source} was cut",
                             f"{dst} is untouched; run the command again")
        return self._get_answer(helper, source, dst, durable=True)[0]

    def _get_answer(self, helper: _Helper, source: str, dst: Path, *, durable: bool) -> tuple[str, Path, int]:
        """The helper's answer to one `get` (asked already): the file's bytes into a `.part` beside `dst`,
        verified; (sha256, the part, its size). `durable`: fsynced and renamed over `dst` now (the part
        is then `dst`); else the part waits for a Landing."""
        name = self.link.name
        cut = f"download of {name}:{source} was cut"
        hint = f"{dst} is untouched; run the command again"
        helper.in_step = False
        if not (reply := helper.line()):
            raise self._lost(helper, cut, hint)
        if reply[0] == "err":
            helper.in_step = True
            if reply[1:2] == ["2"]:
                raise TransferError(f"{name}:{source}: no such file")
            if reply[1:2] == ["5"]:
                raise FileChangedError(_err_text(reply))
            raise TransferError(f"cannot read {name}:{source}: {_err_text(reply)}")
        if reply[0] != "ok" or len(reply) != 2 or not reply[1].isdigit():
            _close_quietly(helper.chan)  # out of step: this helper is not used again
            raise TransferError(f"download of {name}:{source}: the transfer helper answered out of protocol "
                                f"({' '.join(reply)[:80]!r})", hint)
        size = int(reply[1])
        fout, part = open_part(dst)
        try:
            sha = self._receive(helper, size, fout, part, dst, source, cut, hint, durable)
            if durable:
                try:
                    os.replace(part, dst)
                except OSError as exc:
                    raise TransferError(f"cannot place {dst}: {exc}", f"{dst} is untouched") from None
                return sha, dst, size
        except BaseException:
            drop_part(part)  # a cut, a mismatch, a failed rename or Ctrl-C: nothing half-written stays
            raise
        return sha, part, size

    def _receive(self, helper: _Helper, size: int, fout: IO[bytes], part: Path, dst: Path, source: str,
                 cut: str, hint: str, durable: bool) -> str:
        digest = hashlib.sha256()
        try:
            with fout:
                complete = helper.copy_to(size, digest, fout)
                if complete and durable:
                    fout.flush()
                    os.fsync(fout.fileno())
        except OSError as exc:
            raise TransferError(f"cannot write {part}: {exc}", f"{dst} is untouched") from None
        if not complete or not (reply := helper.line()):
            raise self._lost(helper, cut, hint)
        helper.in_step = True
        if reply[0] == "short":
            raise TransferError(f"{self.link.name}:{source} shrank while it was being read", hint)
        actual = digest.hexdigest()
        if reply[0] != actual:
            raise mismatch_download(self.link, source, dst, reply[0], actual)
        return actual


class _Sends:
    """One put_many on one helper: each file goes out as a `send` (its request, its bytes and their
    sha256, back to back, without waiting for an answer) while at most WINDOW answers and
    SEND_AHEAD_BYTES are outstanding, so a small file costs its bytes rather than two round trips and
    a host that refuses the first file is heard before much more is sent. The first failure (in the
    items' order) is raised once every send under way is answered: those before it are in place, and
    none is sent once it is known."""

    def __init__(self, transfer: StreamTransfer, helper: _Helper) -> None:
        self.transfer = transfer
        self.helper = helper
        self.name = transfer.link.name
        self.shas: list[str] = []
        self.pending: list[_Sent] = []  # sent, not answered yet
        self.failures: list[tuple[int, Exception]] = []

    def run(self, items: Sequence[tuple[Path, str, FileId | None]]) -> list[str]:
        pending = self.pending
        for index, (src, target, identity) in enumerate(items):
            while pending and (len(pending) >= WINDOW or sum(p.size for p in pending) >= SEND_AHEAD_BYTES):
                self._answered(pending.pop(0))
            if self.failures or any(p.problem for p in pending):
                break
            try:  # before its `send`: a file refused (not the one checked) sends not one byte
                fin = open_to_send(src, identity)  # closed in _send
            except TransferError as exc:
                self.failures.append((index, exc))
                break
            pending.append(self._send(index, src, fin, target))
        while pending:
            self._answered(pending.pop(0))
        self.helper.in_step = True
        if self.failures:
            raise min(self.failures, key=lambda f: f[0])[1]
        return self.shas

    def _lost(self, src: Path, target: str) -> TransferError:
        return self.transfer._lost(self.helper, f"upload of {src} to {self.name}:{target} was cut", UPLOAD_HINT)

    def _send(self, index: int, src: Path, fin: IO[bytes], target: str) -> _Sent:
        """One `send` of the open file `fin`: always the announced size and a hash, so the stream stays
        in step. A file that shrinks or fails to read goes out padded with zeros and a hash that cannot
        match (the host keeps the target as it was), with its problem beside it."""
        helper = self.helper
        hint = UPLOAD_HINT
        helper.in_step = False
        with fin:
            st = os.fstat(fin.fileno())
            request = f"send {_hex(upload_part(target))} {_hex(target)} {st.st_size} {st.st_mode & 0o777:o}\n"
            if not helper.send(request.encode()):
                raise self._lost(src, target)
            digest, left, problem = hashlib.sha256(), st.st_size, None
            try:
                while left > 0 and (block := fin.read(min(CHUNK, left))):
                    digest.update(block)
                    if not helper.send(block):
                        raise self._lost(src, target)
                    left -= len(block)
                if left:
                    problem = TransferError(f"{src} shrank while it was being sent", hint)
            except OSError as exc:
                problem = TransferError(f"cannot read {src}: {exc}", hint)
        while left > 0:
            n = min(CHUNK, left)
            if not helper.send(bytes(n)):
                raise self._lost(src, target)
            left -= n
        sha = "0" * 64 if problem else digest.hexdigest()  # zeros: never a match for what was sent
        if not helper.send(sha.encode()):
            raise self._lost(src, target)
        return _Sent(index, src, target, sha, st.st_size, problem)

    def _answered(self, sent: _Sent) -> None:
        """Read one send's answer: its sha256 onto `shas`, or its failure onto `failures`."""
        reply = self.helper.line()
        if not reply:
            raise self._lost(sent.src, sent.target)
        actual = reply[1] if len(reply) > 1 else ""
        if sent.problem is not None:
            failure: Exception | None = sent.problem
        elif reply[0] == "err":
            failure = TransferError(f"cannot write {self.name}:{sent.target}: {_err_text(reply)}")
        elif reply[0] != "ok" or actual != sent.sha:
            failure = mismatch_upload(self.transfer.link, sent.src, sent.target, sent.sha, actual)
        else:
            self.shas.append(actual)
            return
        self.failures.append((sent.index, failure))


