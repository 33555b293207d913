"""SFTP transfers over one SSH connection: what the streaming helper (host/streams.py) falls back to
when the host has no python that can run it.

The same promise as the helper's (docs/architecture.md, "Transfers"): SFTP for the bytes into a `.part`
file, `xfer hash` (or sha256sum) on the host for the check, the `.part` renamed over the destination only
when both hashes agree. A cut transfer leaves the destination untouched (exit 74); SFTP's `.part` stays
on a dead link, named in the hint.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Protocol, TypeVar

import paramiko
from paramiko.ssh_exception import SSHException

from thrust_remote.core.errors import ThrustError, TransferError
from thrust_remote.host.runner import FileChangedError, FileId, RunResult, drop_part, open_part, open_to_send
from thrust_remote.host.streams import CHUNK, Transfer, mismatch_download, mismatch_upload, upload_part, xfer_argv

LINK_ERRORS = (SSHException, EOFError, OSError)
T = TypeVar("T")


class Link(Protocol):
    """What SFTP needs from the runner that owns the connection."""

    name: str
    python: str

    def transport(self) -> paramiko.Transport: ...
    def drop(self) -> None: ...
    def run(self, argv: Sequence[str]) -> RunResult: ...


class SftpTransfer(Transfer):
    """SFTP for the bytes, a hash on the host for the check. Owns the connection's SFTP client."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._client: paramiko.SFTPClient | None = None
        # paramiko's SFTPClient is not safe for requests from two threads at once: each reader may take
        # the other's answer off the channel and drop it, and the other then waits for it forever (a
        # session's link start asked `home` while a command asked `exists`). One request at a time.
        self._lock = threading.RLock()

    def client(self) -> paramiko.SFTPClient:
        transport = self.link.transport()  # reconnects (and resets this client) if the link is gone
        if self._client is None:
            try:
                self._client = transport.open_sftp_client()
            except LINK_ERRORS as exc:
                raise TransferError(
                    f"cannot open SFTP on {self.link.name}: {exc}",
                    "the server needs the sftp subsystem (Subsystem sftp internal-sftp in sshd_config)",
                ) from None
        return self._client

    def reset(self) -> None:
        """Forget the client (the connection it lived on is gone)."""
        self._client = None

    def call(self, op: Callable[[paramiko.SFTPClient], T]) -> T:
        """op(client), one at a time; a dead SFTP channel on a live connection is reopened once."""
        with self._lock:
            try:
                return op(self.client())
            except (EOFError, OSError) as exc:
                if isinstance(exc, FileNotFoundError | PermissionError):
                    raise
                self._client = None
                return op(self.client())

    def remote_sha256(self, path: str) -> str:
        result = self.link.run(xfer_argv(self.link.python, "hash", path))
        if result.exit_code == 127:  # no python there: coreutils will do
            result = self.link.run(["sha256sum", "--", path])
        if not result.ok or not result.stdout.strip():
            raise TransferError(f"cannot hash {path} on {self.link.name}: {result.stderr.strip()}")
        return result.stdout.split()[0]

    def _mkdirs(self, path: str) -> None:
        if not path:
            return
        try:
            self.client().stat(path)
        except FileNotFoundError:
            self.link.run(["mkdir", "-p", "--", path]).check(f"mkdir -p {path}")

    def put(self, src: Path, target: str, identity: FileId | None = None) -> str:
        with self._lock:  # the client's requests, one thread at a time (__init__)
            return self._put(src, target, identity)

    def _put(self, src: Path, target: str, identity: FileId | None = None) -> str:
        part = upload_part(target)
        digest = hashlib.sha256()
        fin = open_to_send(src, identity)  # before anything on the host: a file refused sends nothing
        mode = os.fstat(fin.fileno()).st_mode
        try:
            with fin:
                sftp = self.client()
                self._mkdirs(os.path.dirname(target))
                with sftp.open(part, "wbx") as fout:  # x: O_EXCL, as the helper
                    fout.set_pipelined(True)
                    while block := fin.read(CHUNK):
                        digest.update(block)
                        fout.write(block)
            # always this account's to read, as the helper stores it: a laptop file of mode 000 (root
            # reads it there) stored 000 could never be hashed here, nor sealed by tree-add
            sftp.chmod(part, (mode & 0o777) | 0o600)
        except ThrustError:
            raise
        except LINK_ERRORS as exc:
            self.link.drop()
            raise TransferError(
                f"upload of {src} to {self.link.name}:{target} was cut: {exc}",
                f"the destination is untouched (partial data in {part}); run the command again",
            ) from None  # SFTP cannot remove it on a dead link: said, with its name
        expected = digest.hexdigest()
        try:
            actual = self.remote_sha256(part)
            if actual != expected:
                raise mismatch_upload(self.link, src, target, expected, actual)
            try:
                self.client().posix_rename(part, target)
            except (SSHException, OSError) as exc:
                raise TransferError(f"cannot rename {part} to {target} on {self.link.name}: {exc}") from None
        except ThrustError:
            self._remove_quietly(part)  # its own name: a failed try leaves nothing to pile up
            raise
        return expected

    def _remove_quietly(self, path: str) -> None:
        with contextlib.suppress(Exception):  # the link may be what failed
            self.client().remove(path)

    def get(self, source: str, dst: Path, identity: FileId | None = None) -> str:
        fout, part = open_part(dst)
        try:
            with self._lock:  # the client's requests, one thread at a time (__init__)
                return self._get(source, dst, identity, fout, part)
        except BaseException:
            drop_part(part)
            raise

    def _get(self, source: str, dst: Path, identity: FileId | None, fout: IO[bytes], part: Path) -> str:
        digest = hashlib.sha256()
        remote_hash: dict[str, object] = {}

        def hash_there() -> None:  # runs on its own channel while the bytes arrive
            try:
                remote_hash["value"] = self.remote_sha256(source)
            except Exception as exc:  # noqa: BLE001 - reported after the transfer
                remote_hash["error"] = exc

        try:
            sftp = self.client()
            st = sftp.lstat(source) if identity is not None else sftp.stat(source)
            if identity is not None and not stat.S_ISREG(st.st_mode or 0):
                # SFTP cannot open without following links: a listed file that is now anything but a
                # regular file is refused (the streaming helper also checks dev/ino)
                raise FileChangedError(f"{self.link.name}: {source} is no longer the file that was listed")
            size = st.st_size or 0
            hasher = threading.Thread(target=hash_there, daemon=True)
            hasher.start()
            with sftp.open(source, "rb") as fin, fout:
                fin.prefetch(size)
                while block := fin.read(CHUNK):
                    digest.update(block)
                    fout.write(block)
                fout.flush()
                os.fsync(fout.fileno())
            hasher.join()
        except FileNotFoundError:
            raise TransferError(f"{self.link.name}:{source}: no such file") from None
        except LINK_ERRORS as exc:
            self.link.drop()
            raise TransferError(
                f"download of {self.link.name}:{source} was cut: {exc}",
                f"{dst} is untouched; run the command again",
            ) from None
        if "error" in remote_hash:
            err = remote_hash["error"]
            raise err if isinstance(err, ThrustError) else TransferError(str(err))
        actual = digest.hexdigest()
        if remote_hash.get("value") != actual:
            raise mismatch_download(self.link, source, dst, str(remote_hash.get("value")), actual)
        os.replace(part, dst)
        return actual
