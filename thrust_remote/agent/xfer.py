"""Verified file transfers, the host's side: `xfer serve` (the streaming helper) and `xfer hash PATH`.

Stdlib only and self-contained: thrust_remote's SSH layer runs this file's source with
`python -S -c SOURCE serve` before anything is uploaded to the host (the agent itself is uploaded
with a transfer), so it must import nothing from the package. It is also an agent subcommand.

`hash PATH` prints the file's sha256 (hex). The host's hashlib (~1.6 GB/s) beats sha256sum (~0.3 GB/s).

`serve` speaks this protocol on stdin/stdout (docs/architecture.md, "Transfers"); it lives as long
as its channel, one request at a time:

- Every line the helper says starts with MAGIC (an rc file may print before the helper starts, and
  the client skips up to the first MAGIC line). The first line is `MAGIC ready`.
- A request is one line. Paths travel hex-encoded behind an `x` (utf-8, surrogateescape), so any
  byte may appear in them.

      get xPATH [DEV INO]
          -> ok SIZE | err 2 (no such file) | err 3 HEXMSG | err 5 HEXMSG (not the file listed)
          then SIZE bytes, then a line: SHA256 of those bytes | short (the file shrank: the bytes
          after its end are zeros, sent only to keep the stream in step)
          With DEV INO (what a listing saw: `agent list-files`), PATH is opened without following a
          final symlink and must be that very regular file: a file swapped after it was listed (for
          a symlink to another, or through a swapped directory) is `err 5`, never sent.
      put xPART xTARGET SIZE MODE
          -> ok | err 3 HEXMSG           (the parent of TARGET is made; PART is created, never an
                                          existing file: the client names it uniquely)
          then the client sends SIZE bytes and its SHA256 (64 hex characters, no newline)
          -> ok SHA256                   (equal: PART chmod MODE (octal) | 0600, renamed to TARGET)
           | mismatch SHA256             (PART removed, TARGET untouched)
           | err 3 HEXMSG                (a write failed; PART removed, TARGET untouched)

      send xPART xTARGET SIZE MODE
          followed at once by SIZE bytes and their SHA256 (64 hex characters, no newline): a put that
          does not wait for its `ok`, so the client streams many files back to back (Runner.put_many)
          -> the put's last answer: ok SHA256 | mismatch SHA256 | err 3 HEXMSG (PART could not be
          opened or written: the bytes are still read, so the stream stays in step)

  If stdin ends in the middle of a put or a send, the helper removes PART and exits with status 4:
  TARGET is untouched.

  Each verb's words are read by their place in its own shape (`parse_request`). A request that does
  not fit is answered `err 3 HEXMSG`; after a malformed put or send (whose bytes may follow and cannot
  be told from the next request) the helper then exits with status 2.
"""

from __future__ import annotations

import hashlib
import os
import select
import stat
import sys

# self-contained (run with `python -c` to upload the agent itself): the laptop imports MAGIC from here
MAGIC = b"\x1ethrust-xfer-1\x1e"
BLOCK = 1 << 20


class ChangedError(OSError):
    """The path no longer names the file that was listed."""


def _open_listed(path: str, identity: tuple[int, int] | None):  # noqa: ANN202 - a binary file object
    """`path` opened for reading; with `identity` (dev, ino), only when it is still that regular file."""
    if identity is None:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if os.path.islink(path):  # ELOOP (or EMLINK on some systems): a symlink now stands there
            raise ChangedError(f"{path} is now a symlink") from None
        raise exc from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != identity:
        os.close(fd)
        raise ChangedError(f"{path} is no longer the file that was listed")
    return os.fdopen(fd, "rb")


class Input:
    """The helper's stdin, buffered here rather than by io: the helper must know whether a whole
    request is already waiting (`waiting`), which a BufferedReader cannot say without blocking."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()

    def _fill(self) -> bool:
        chunk = os.read(self.fd, 1 << 16)
        self.buf += chunk
        return bool(chunk)

    def waiting(self) -> bool:
        """A request is here already, or bytes of one are: answering it needs no flush first."""
        return b"\n" in self.buf or bool(select.select([self.fd], [], [], 0)[0])

    def readline(self) -> bytes:
        while (at := self.buf.find(b"\n")) < 0:
            if not self._fill():
                at = len(self.buf) - 1  # the end: what is left, maybe no line at all
                break
        line = bytes(self.buf[:at + 1])
        del self.buf[:at + 1]
        return line

    def read(self, n: int) -> bytes:
        """Up to n bytes (fewer only at the end of the stream)."""
        while len(self.buf) < n and self._fill():
            pass
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data


class Helper:
    """The `serve` loop over stdin (an Input) and a binary stdout.

    What it says is flushed only when no further request is waiting: pipelined gets of many small
    files leave in few large writes, so few SSH packets, each of which costs the laptop's paramiko
    a decrypt and a MAC check in Python."""

    def __init__(self, rfile: Input, wfile) -> None:  # noqa: ANN001 - a binary file object
        self.rfile = rfile
        self.wfile = wfile

    def say(self, *words: str) -> None:
        self.wfile.write(MAGIC + " ".join(words).encode() + b"\n")

    def fail(self, exc: OSError | str) -> None:
        self.say("err", "3", str(exc).encode().hex())

    def get(self, path: str, identity: tuple[int, int] | None = None) -> None:
        try:
            fh = _open_listed(path, identity)
        except FileNotFoundError:
            self.say("err", "2")
            return
        except ChangedError as exc:
            self.say("err", "5", str(exc).encode().hex())
            return
        except OSError as exc:
            self.fail(exc)
            return
        with fh:
            left = os.fstat(fh.fileno()).st_size
            self.say("ok", str(left))
            digest = hashlib.sha256()
            while left:
                block = fh.read(min(left, BLOCK))
                if not block:
                    break
                digest.update(block)
                self.wfile.write(block)
                left -= len(block)
            shrank = left > 0
            while left:  # keep the stream in step with the size announced, then say so
                n = min(left, BLOCK)
                self.wfile.write(bytes(n))
                left -= n
            self.say("short" if shrank else digest.hexdigest())

    def put(self, part: str, target: str, size: int, mode: int, asked: bool = True) -> None:
        """`put` (asked: the client waits for `ok` before it sends the bytes) or `send` (the bytes
        follow the request at once: they are read even when PART cannot be opened)."""
        fh = None
        error = ""
        try:
            parent = os.path.dirname(target)
            if parent:
                os.makedirs(parent, exist_ok=True)
            # exclusive and never through a link: the name is this upload's own (the client's token)
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            fh = os.fdopen(fd, "wb")
        except OSError as exc:
            if asked:
                self.fail(exc)
                return
            error = str(exc)
        if asked:
            self.say("ok")
            self.wfile.flush()  # the client waits for this before it sends the bytes
        digest = hashlib.sha256()
        while size:
            block = self.rfile.read(min(size, BLOCK))
            if not block:
                self._cut(part if fh is not None else None)
            size -= len(block)
            if not error:  # after a failed write, keep reading so the stream stays in step
                try:
                    digest.update(block)
                    fh.write(block)
                except OSError as exc:
                    error = str(exc)
        try:
            if fh is not None:
                with fh:
                    # the laptop file's bits, but always this account's to read and write: a laptop file
                    # of mode 000 (root reads it there) stored 000 here could never be read or sealed
                    os.fchmod(fh.fileno(), (mode & 0o7777) | 0o600)
        except OSError as exc:
            error = error or str(exc)
        ours = digest.hexdigest()
        theirs = self.rfile.read(64).decode("ascii", "replace")
        if len(theirs) < 64:
            self._cut(part if fh is not None else None)  # cut before the hash: as above
        if not error and theirs == ours:
            try:
                os.replace(part, target)
                self.say("ok", ours)
                return
            except OSError as exc:  # TARGET a directory, say: an answer, never the helper's death
                error = str(exc)
        if fh is not None:
            _remove(part)  # a failed upload leaves nothing: its part was its own
        if error:
            self.fail(error)
        else:
            self.say("mismatch", ours)

    def _cut(self, part: str | None) -> None:
        """stdin ended in the middle of an upload: its part goes, and so does the helper (status 4)."""
        if part is not None:
            _remove(part)
        self.wfile.flush()
        sys.exit(4)

    def serve(self) -> int:
        self.say("ready")
        while True:
            if not self.rfile.waiting():
                self.wfile.flush()  # about to wait for the next request: what was said goes out now
            line = self.rfile.readline()
            if not line:
                break
            words = line.split()
            if not words:
                continue
            try:
                verb, args = parse_request(words)
            except ValueError as exc:
                if words[0] in (b"put", b"send"):  # its bytes cannot be told apart from the next request
                    self.fail(str(exc))
                    self.wfile.flush()
                    return 2
                self.fail(str(exc))  # a get carries nothing after its line: the stream is still in step
                continue
            if verb == "get":
                self.get(*args)
            else:
                self.put(*args, asked=verb == "put")
        return 0


def _path(word: bytes) -> str:
    try:
        if word.startswith(b"x"):
            return bytes.fromhex(word[1:].decode("ascii")).decode("utf-8", "surrogateescape")
    except ValueError:
        pass
    raise ValueError(f"not a path: {word[:40]!r}")


def _number(word: bytes, base: int = 10) -> int:
    if word.isdigit():  # int() alone would also take signs, spaces and underscores
        try:
            return int(word, base)
        except ValueError:  # a digit its base lacks (an octal mode's 8 or 9)
            pass
    raise ValueError(f"not a number: {word[:40]!r}")


def parse_request(words: list[bytes]) -> tuple[str, tuple]:
    """A request line's words as (verb, the arguments of its method): each word read by its place in
    that verb's shape, never by position across verbs (a get's device number is a number, not a path,
    whatever its digits). ValueError names what is wrong."""
    verb = words[0].decode("ascii", "replace")
    if verb == "get" and len(words) in (2, 4):
        identity = (_number(words[2]), _number(words[3])) if len(words) == 4 else None
        return verb, (_path(words[1]), identity)
    if verb in ("put", "send") and len(words) == 5:
        return verb, (_path(words[1]), _path(words[2]), _number(words[3]), _number(words[4], 8))
    raise ValueError(f"bad request: {verb[:20]} with {len(words) - 1} word(s)")


def _remove(path: str) -> None:
    try:  # noqa: SIM105 - not contextlib: the helper starts per connection and imports what it must only
        os.unlink(path)
    except OSError:
        pass


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"] and len(argv) == 1:
        out = os.fdopen(sys.stdout.fileno(), "wb", buffering=1 << 18, closefd=False)
        try:
            return Helper(Input(sys.stdin.fileno()), out).serve()
        finally:
            out.flush()
    if argv[:1] == ["hash"] and len(argv) == 2:
        try:
            print(sha256_of(argv[1]))
        except OSError as exc:
            print(f"xfer hash: {exc}", file=sys.stderr)
            return 1
        return 0
    print("usage: xfer serve | xfer hash PATH", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
