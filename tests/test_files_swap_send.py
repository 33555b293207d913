"""`files:` between the laptop's last check and the send (docs/architecture.md, "Trees" and "Security"), over a
real sshd: a file swapped for a link (to a private key outside the project), or reached through a directory
swapped for one, after `send_files` checked it is never read nor sent, whichever transfer carries it (the
streaming helper, the SFTP fallback of a host without python, a single put, host local): each put of a
file with the identity (device, inode) that was checked opens it without following a link and compares
before its request goes (74, naming the file). Around them: the SFTP fallback stores a laptop file of mode
000 readable by the account, as the helper does; and the untracked warning leaves out exactly what the
job being trained sends by `files:` (tests/test_files_hostile.py holds the swaps before the check)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.host.runner import FileChangedError, LocalRunner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import data

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not-for-the-host 91c4\n"
NO_PYTHON = "/nonexistent/python3"  # the host's transfers fall back to SFTP


def _secret(tmp_path: Path) -> Path:
    """A private key of the laptop's user, outside the project, its atime before its mtime: any read of it
    moves the atime (relatime), so `_untouched` can tell it was never read."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    key = ssh / "id_ed25519"
    key.write_text(SECRET)
    key.chmod(0o600)
    os.utime(key, (0, key.stat().st_mtime))
    probe = tmp_path / "probe"
    probe.write_text("x")
    os.utime(probe, (0, probe.stat().st_mtime))
    probe.read_text()
    if probe.stat().st_atime == 0:
        pytest.skip("this filesystem does not record reads (noatime): the check would prove nothing")
    return key


def _untouched(key: Path) -> bool:
    return key.stat().st_atime == 0


def _swap(proj: Path, key: Path, how: str) -> None:
    """What a hostile process does between the check and the send: data/sub/KEYNAME becomes a link to the
    key, or data/sub a link to the key's directory (the file's own name then leads to the key)."""
    if how == "file":
        (proj / "data" / "sub" / key.name).unlink()
        os.symlink(key, proj / "data" / "sub" / key.name)
    else:
        (proj / "data" / "sub").rename(proj / "data" / "old")
        os.symlink(key.parent, proj / "data" / "sub")


def _project(tmp_path: Path, key: Path) -> Path:
    proj = tmp_path / "project"
    (proj / "data" / "sub").mkdir(parents=True)
    (proj / "data" / "sub" / key.name).write_text("alpha\n")  # the same name as the key: a swap aims at it
    return proj


def _host_holds(root: Path, text: str) -> list[str]:
    found = subprocess.run(["grep", "-rlF", "--", text.strip(), str(root)], capture_output=True, text=True)
    return found.stdout.split()


class _SwapAtSend(data.Steps):
    """The reporter send_files tells "sending N files:" once its check passed, just before the put: the
    moment a hostile process swaps the file."""

    def __init__(self, swap) -> None:
        self.swap = swap
        self.said: list[str] = []

    def step(self, message: str) -> None:
        self.said.append(message)
        if message.startswith("sending"):
            self.swap()


@pytest.mark.parametrize("transfer", ["stream", "sftp"])
@pytest.mark.parametrize("how", ["file", "directory"])
def test_a_file_swapped_for_a_link_between_the_check_and_the_send_is_never_read_nor_sent(sshd, tmp_path, how,
                                                                                         transfer):
    key = _secret(tmp_path)
    proj = _project(tmp_path, key)
    files = data.local_files(proj, ("data/",))
    workdir = remote_tempdir(sshd) / "w"
    runner = sshd.runner(workdir=str(workdir), **({"python": NO_PYTHON} if transfer == "sftp" else {}))
    session = HostSession(runner, sshd.host_config(workdir=str(workdir)), HostPaths(str(workdir)))
    reporter = _SwapAtSend(lambda: _swap(proj, key, how))
    try:
        with pytest.raises(ThrustError) as refused:
            data.send_files(session, files, reporter)
    finally:
        runner.close()
    assert any(s.startswith("sending 1 of 1 files:") for s in reporter.said), reporter.said  # checked, then swapped
    assert refused.value.exit_code == ExitCode.TRANSFER
    assert f"data/sub/{key.name} was replaced" in refused.value.message, refused.value.message
    assert "nothing of it was sent" in refused.value.message
    assert refused.value.hint == "train again once it is written"
    assert _untouched(key), "the private key was read on the laptop"
    assert not _host_holds(workdir.parent, SECRET)
    store = workdir / ".thrust" / "store"
    assert not store.exists() or not [p for p in store.rglob("*") if p.is_file()]


def _sha(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def _runner(kind: str, sshd, workdir: Path):
    if kind == "local":
        return LocalRunner()
    return sshd.runner(workdir=str(workdir), **({"python": NO_PYTHON} if kind == "sftp" else {}))


@pytest.mark.parametrize("kind", ["stream", "sftp", "local"])
def test_a_put_with_the_identity_it_checked_refuses_a_swapped_file_and_sends_an_unswapped_one(sshd, tmp_path,
                                                                                              kind):
    key = _secret(tmp_path)
    proj = _project(tmp_path, key)
    (proj / "data" / "plain.txt").write_text("plain\n")
    src, plain = proj / "data" / "sub" / key.name, proj / "data" / "plain.txt"
    ident = (src.stat().st_dev, src.stat().st_ino)
    plain_ident = (plain.stat().st_dev, plain.stat().st_ino)
    _swap(proj, key, "file")
    dest = remote_tempdir(sshd) / "dest"
    runner = _runner(kind, sshd, dest)
    try:
        with pytest.raises(FileChangedError) as one:
            runner.put(src, str(dest / "one"), identity=ident)
        with pytest.raises(FileChangedError) as many:  # the good one first: it is sent, the swapped one not
            runner.put_many([(plain, str(dest / "plain"), plain_ident), (src, str(dest / "many"), ident)])
        assert runner.put_many([(plain, str(dest / "again"), plain_ident)]) == [_sha(b"plain\n")]
    finally:
        runner.close()
    for refused in (one.value, many.value):
        assert refused.exit_code == ExitCode.TRANSFER
        assert f"{src} was replaced since it was checked (it is now a link to {key})" in refused.message, \
            refused.message
    assert _untouched(key), "the private key was read on the laptop"
    assert not _host_holds(dest.parent, SECRET)
    assert sorted(p.name for p in dest.iterdir()) == ["again", "plain"]  # no `.part` of a refused one either


def test_the_sftp_fallback_stores_a_laptop_file_of_mode_000_readable_by_the_account(sshd, tmp_path):
    blob = tmp_path / "blob.bin"
    blob.write_text("blob\n")
    blob.chmod(0)  # the laptop's user is root here: it still reads it
    dest = remote_tempdir(sshd) / "store"
    runner = sshd.runner(python=NO_PYTHON)
    try:
        assert runner.put_many([(blob, str(dest / "aa" / "obj"))]) == [_sha(b"blob\n")]
    finally:
        runner.close()
    assert stat.S_IMODE((dest / "aa" / "obj").stat().st_mode) == 0o600


TWO_JOBS = """\
files: [data/top.bin]
jobs:
  first:
    kind: command
    command: [sh, -c, 'cat data/a.bin > "$THRUST_RUN_DIR/seen"']
    files: [data/a.bin]
  second:
    kind: command
    command: [sh, -c, 'cat data/b.bin > "$THRUST_RUN_DIR/seen"']
    files: [data/b.bin]
  plain:
    kind: command
    command: [sh, -c, 'cat data/top.bin > "$THRUST_RUN_DIR/seen"']
"""


def _untracked_line(stderr: str) -> str:
    return next((line for line in stderr.splitlines() if "untracked file" in line), "")


def test_the_untracked_warning_leaves_out_exactly_what_the_trained_jobs_files_sends(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=TWO_JOBS)
    (proj / "data").mkdir()
    for name in ("a", "b", "top"):
        (proj / "data" / f"{name}.bin").write_text(f"{name}\n")
    first = cli("train", "first", "--json", cwd=proj)
    assert first.returncode == 0, first.stderr
    assert (Path(json.loads(first.stdout)["run_dir"]) / "seen").read_text() == "a\n"
    # b.bin is another job's, top.bin the top level's that `first` overrides: neither was sent
    assert "2 untracked files were not sent: data/b.bin, data/top.bin" in _untracked_line(first.stderr), first.stderr
    plain = cli("train", "plain", "--json", cwd=proj)  # no files: of its own: the top level's
    assert plain.returncode == 0, plain.stderr
    assert "2 untracked files were not sent: data/a.bin, data/b.bin" in _untracked_line(plain.stderr), plain.stderr
