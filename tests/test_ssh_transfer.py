"""The SSH layer's parts on their own: the host-side transfer program (agent/xfer.py), the helper pool,
the SFTP fallback, and the command loop shared by both runners (runner.drive)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from thrust_remote.agent import xfer
from thrust_remote.core.errors import ConnectionLostError, ExitCode, TransferError
from thrust_remote.host import streams as transfer
from thrust_remote.host.runner import LANDING_FILES, LinkLost, LocalRunner, drive
from thrust_remote.host.streams import WINDOW


def _serve(tmp_path: Path) -> subprocess.Popen:
    """The helper exactly as the SSH side starts it: `python -S -c SOURCE serve`."""
    proc = subprocess.Popen(transfer.xfer_argv(sys.executable, "serve"), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, cwd=tmp_path)
    assert proc.stdout.readline() == xfer.MAGIC + b"ready\n"
    return proc


def _reply(proc: subprocess.Popen) -> list[str]:
    line = proc.stdout.readline()
    assert line.startswith(xfer.MAGIC), line
    return line[len(xfer.MAGIC):].decode().split()


def test_both_sides_agree_on_the_magic_prefix():
    assert transfer.MAGIC == xfer.MAGIC


def test_xfer_source_is_stdlib_only_and_self_contained():
    import ast

    tree = ast.parse(transfer.xfer_source())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "hashlib", "os", "select", "stat", "sys"}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def test_xfer_hash_prints_sha256(tmp_path):
    f = tmp_path / "data"
    f.write_bytes(os.urandom(3_000_000))
    out = subprocess.run(transfer.xfer_argv(sys.executable, "hash", str(f)), capture_output=True, text=True)
    assert out.returncode == 0
    assert out.stdout.strip() == hashlib.sha256(f.read_bytes()).hexdigest()
    missing = subprocess.run(transfer.xfer_argv(sys.executable, "hash", str(tmp_path / "no")), capture_output=True)
    assert missing.returncode != 0
    assert xfer.main([]) == 2


def test_serve_put_then_get_round_trip_with_odd_path(tmp_path):
    data = os.urandom(2_500_000)
    target = str(tmp_path / "sub dir" / "f $(x) \udcff")  # any byte may appear in a path
    proc = _serve(tmp_path)
    size, digest = len(data), hashlib.sha256(data).hexdigest()
    proc.stdin.write(f"put {transfer._hex(target + '.part')} {transfer._hex(target)} {size} 640\n".encode())
    proc.stdin.flush()
    assert _reply(proc) == ["ok"]
    proc.stdin.write(data + digest.encode())
    proc.stdin.flush()
    assert _reply(proc) == ["ok", digest]
    written = Path(target)  # the filesystem encoding maps \udcff back to the byte 0xff
    assert written.read_bytes() == data
    assert written.stat().st_mode & 0o777 == 0o640
    proc.stdin.write(f"get {transfer._hex(target)}\n".encode())
    proc.stdin.flush()
    assert _reply(proc) == ["ok", str(size)]
    assert proc.stdout.read(size) == data
    assert _reply(proc) == [digest]
    proc.stdin.write(f"get {transfer._hex(str(tmp_path / 'missing'))}\n".encode())
    proc.stdin.flush()
    assert _reply(proc) == ["err", "2"]
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_serve_mismatch_and_cut_leave_the_target_untouched_and_no_part(tmp_path):
    target = tmp_path / "t.bin"
    target.write_bytes(b"previous")
    part = str(target) + ".part"
    proc = _serve(tmp_path)
    proc.stdin.write(f"put {transfer._hex(part)} {transfer._hex(str(target))} 4 600\n".encode())
    proc.stdin.flush()
    assert _reply(proc) == ["ok"]
    proc.stdin.write(b"abcd" + b"0" * 64)
    proc.stdin.flush()
    assert _reply(proc)[0] == "mismatch"
    assert target.read_bytes() == b"previous" and not Path(part).exists()
    proc.stdin.write(f"put {transfer._hex(part)} {transfer._hex(str(target))} 1000 600\n".encode())
    proc.stdin.flush()
    assert _reply(proc) == ["ok"]
    proc.stdin.write(b"x" * 10)
    proc.stdin.close()  # cut in the middle
    assert proc.wait(timeout=10) == 4
    assert target.read_bytes() == b"previous"
    assert not Path(part).exists()  # the cut upload's part goes with it


def test_two_uploads_of_one_path_at_once_each_write_their_own_part(sshd, tmp_path, remote_fs_dir):
    """Two commands sending the same payload to a fresh host at once (two runners, two connections):
    each writes a part of its own, so neither reads or renames the other's half-written file."""
    data = os.urandom(30_000_000)
    src = tmp_path / "payload.pyz"
    src.write_bytes(data)
    target = str(remote_fs_dir / "cache" / "payload.pyz")
    runners = [sshd.runner(), sshd.runner()]
    results: list[str] = []
    try:
        threads = [threading.Thread(target=lambda r=r: results.append(r.put(src, target))) for r in runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for r in runners:
            r.close()
    assert results == [hashlib.sha256(data).hexdigest()] * 2
    assert Path(target).read_bytes() == data
    assert sorted(p.name for p in (remote_fs_dir / "cache").iterdir()) == ["payload.pyz"]  # no part left


def test_serve_get_with_an_identity_sends_only_that_file_never_a_link(tmp_path):
    listed, secret = tmp_path / "listed", tmp_path / "secret"
    listed.write_bytes(b"listed")
    secret.write_bytes(b"secret")
    st = listed.stat()
    proc = _serve(tmp_path)

    def get() -> list[str]:
        proc.stdin.write(f"get {transfer._hex(str(listed))} {st.st_dev} {st.st_ino}\n".encode())
        proc.stdin.flush()
        return _reply(proc)

    assert get() == ["ok", "6"]
    assert proc.stdout.read(6) == b"listed"
    assert _reply(proc) == [hashlib.sha256(b"listed").hexdigest()]
    (tmp_path / "new").write_bytes(b"another")
    os.replace(tmp_path / "new", listed)  # the same name, another file
    assert get()[:2] == ["err", "5"]
    listed.unlink()
    listed.symlink_to(secret)  # a link put where the listed file was
    reply = get()
    assert reply[:2] == ["err", "5"] and "symlink" in bytes.fromhex(reply[2]).decode()
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize("dev", [7, 39, 1792, 2049, 65024, 259_000_001])
def test_serve_get_reads_a_device_number_of_any_length_as_a_number(tmp_path, dev):
    """`get xPATH DEV INO`: the device number is a number whatever its digits (a tmpfs is 39, a loop ext4
    1792, /dev/sda1 2049); it was once decoded as a hex path, and an even digit count killed the helper.
    The listed file on a device that is not its own is `err 5`; the real one comes whole."""
    f = tmp_path / "f"
    f.write_bytes(b"payload")
    st = f.stat()
    proc = _serve(tmp_path)
    for asked in (dev, st.st_dev):
        proc.stdin.write(f"get {transfer._hex(str(f))} {asked} {st.st_ino}\n".encode())
        proc.stdin.flush()
        if asked == st.st_dev:
            assert _reply(proc) == ["ok", "7"] and proc.stdout.read(7) == b"payload"
            assert _reply(proc) == [hashlib.sha256(b"payload").hexdigest()]
        else:
            assert _reply(proc)[:2] == ["err", "5"]
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


@pytest.mark.parametrize(("request_line", "fatal"), [
    (b"get", False), (b"get x41 12", False), (b"get x41 -1 5", False), (b"get x4 1 2", False),
    (b"get 41", False), (b"list x41", False), (b"put x41 x42 10", True), (b"send x41 x42 ten 644", True),
    (b"put x41 x42 3 9", True),
])
def test_serve_answers_a_malformed_request_and_stops_only_when_bytes_may_follow(tmp_path, request_line, fatal):
    """A request that does not fit its verb's shape is `err 3` naming why, never a traceback: after a get
    the helper serves on (nothing follows a get's line); after a put or send it ends with status 2 (its
    bytes could not be told from the next request)."""
    f = tmp_path / "ok"
    f.write_bytes(b"ok")
    proc = _serve(tmp_path)
    proc.stdin.write(request_line + b"\n" + f"get {transfer._hex(str(f))}\n".encode())
    proc.stdin.flush()
    reply = _reply(proc)
    assert reply[:2] == ["err", "3"] and bytes.fromhex(reply[2]).decode().startswith(("bad request", "not a"))
    if fatal:
        assert proc.wait(timeout=10) == 2
        assert proc.stdout.read() == b""
        return
    assert _reply(proc) == ["ok", "2"] and proc.stdout.read(2) == b"ok"
    assert _reply(proc) == [hashlib.sha256(b"ok").hexdigest()]
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_serve_answers_pipelined_gets_in_few_writes_and_a_lone_request_at_once(tmp_path):
    """Requests already waiting are answered into one buffer, written when none is left: 100 small
    files in a handful of writes, not three each (fewer SSH packets for paramiko to open). A request on
    its own is still answered at once (the client waits on it)."""
    names = []
    for i in range(100):
        (tmp_path / f"f{i}").write_bytes(os.urandom(200 + i))
        names.append(tmp_path / f"f{i}")
    proc = _serve(tmp_path)

    def writes() -> int:  # write(2) calls the helper has made so far
        io_stats = dict(line.split(": ") for line in Path(f"/proc/{proc.pid}/io").read_text().splitlines())
        return int(io_stats["syscw"])

    before = writes()
    proc.stdin.write(b"".join(f"get {transfer._hex(str(n))}\n".encode() for n in names))
    proc.stdin.flush()
    for n in names:
        assert _reply(proc) == ["ok", str(n.stat().st_size)]
        assert proc.stdout.read(n.stat().st_size) == n.read_bytes()
        assert _reply(proc) == [hashlib.sha256(n.read_bytes()).hexdigest()]
    assert writes() - before < 20  # 300 before: an answer, the bytes and the hash, each flushed
    proc.stdin.write(f"get {transfer._hex(str(names[0]))}\n".encode())
    proc.stdin.flush()
    assert _reply(proc) == ["ok", str(names[0].stat().st_size)]  # no further request needed to see it
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_sftp_fallback_get_with_an_identity_refuses_a_link(sshd, tmp_path, remote_fs_dir):
    from thrust_remote.host.runner import FileChangedError

    runner = sshd.runner(python="/nonexistent/python3")
    (remote_fs_dir / "secret").write_text("secret")
    (remote_fs_dir / "listed").write_text("listed")
    st = (remote_fs_dir / "listed").stat()
    try:
        assert runner.get(str(remote_fs_dir / "listed"), tmp_path / "got", identity=(st.st_dev, st.st_ino))
        (remote_fs_dir / "listed").unlink()
        (remote_fs_dir / "listed").symlink_to(remote_fs_dir / "secret")
        with pytest.raises(FileChangedError):
            runner.get(str(remote_fs_dir / "listed"), tmp_path / "got", identity=(st.st_dev, st.st_ino))
        assert (tmp_path / "got").read_text() == "listed"
        assert not list(tmp_path.glob("*.part"))
    finally:
        runner.close()


def test_concurrent_transfers_each_take_their_own_helper(sshd, tmp_path, remote_dir):
    data = os.urandom(20_000_000)
    (remote_dir / "big.bin").write_bytes(data)
    runner = sshd.runner()
    other = sshd.runner()
    try:
        results: list[str] = []
        threads = [threading.Thread(target=lambda i=i: results.append(
            runner.get(str(remote_dir / "big.bin"), tmp_path / f"got{i}.bin"))) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [hashlib.sha256(data).hexdigest()] * 2
        pool = runner._transfer._idle
        assert len(pool) == 2 and pool[0].chan is not pool[1].chan  # two helpers, both reusable
        assert runner._transfer._lock is not other._transfer._lock  # no lock shared by every runner
    finally:
        runner.close()
        other.close()


def test_a_helper_warmed_beforehand_serves_the_next_get_and_no_second_one_starts(sshd, tmp_path, remote_dir):
    """warm_transfers starts a helper in the background (its login shell and python paid beside other
    work); the get that comes meanwhile waits for that one instead of starting its own."""
    data = os.urandom(5000)
    (remote_dir / "w.bin").write_bytes(data)
    runner = sshd.runner()
    try:
        pool = runner._transfer
        runner.warm_transfers(1)
        with pool._lock:
            assert pool._lock.wait_for(lambda: not pool._warming, timeout=30)
        assert not pool._idle and not runner.connected()  # no connection yet: a warm never opens one
        runner.transport()
        runner.warm_transfers(1)
        runner.warm_transfers(1)  # one is on its way already: no second
        assert runner.get(str(remote_dir / "w.bin"), tmp_path / "w.bin") == hashlib.sha256(data).hexdigest()
        with pool._lock:
            assert pool._lock.wait_for(lambda: not pool._warming, timeout=30)
        assert len(pool._idle) == 1  # the warmed helper did the get and is back, reusable
        runner.warm_transfers(1)
        assert pool._warming == 0 and len(pool._idle) == 1  # one idle already: nothing to start
    finally:
        runner.close()


def test_many_gets_are_pipelined_on_one_helper_in_order_with_a_swapped_file_in_place(sshd, tmp_path, remote_fs_dir,
                                                                                    monkeypatch):
    """get_many over a real sshd: 200 files through one helper (one channel), answered in order, their
    requests sent in batches (a write, so a packet, per half window: not one per file); a file
    replaced after it was listed is its FileChangedError, in its place, and the stream goes on."""
    from thrust_remote.host.runner import FileChangedError
    from thrust_remote.host.streams import _Helper

    sends: list[bytes] = []
    real_send = _Helper.send
    monkeypatch.setattr(_Helper, "send", lambda self, data: sends.append(data) or real_send(self, data))

    items, want = [], {}
    for i in range(200):
        src = remote_fs_dir / "many" / f"f{i:03d}.bin"
        src.parent.mkdir(exist_ok=True)
        data = os.urandom(100 + i * 37)
        src.write_bytes(data)
        st = src.stat()
        items.append((str(src), tmp_path / src.name, (st.st_dev, st.st_ino)))
        want[src.name] = hashlib.sha256(data).hexdigest()
    swapped = remote_fs_dir / "many" / "f100.bin"
    swapped.unlink()
    swapped.symlink_to(remote_fs_dir / "many" / "f000.bin")  # what a listing saw is gone
    runner = sshd.runner()
    try:
        got = list(runner.get_many(items, threading.Event()))
        assert len(got) == 200 and isinstance(got[100], FileChangedError)
        assert b"".join(sends).count(b"get ") == 200 and len(sends) <= 200 // (WINDOW // 2) + 1
        assert [g for i, g in enumerate(got) if i != 100] == [want[f"f{i:03d}.bin"] for i in range(200) if i != 100]
        assert all(hashlib.sha256((tmp_path / n).read_bytes()).hexdigest() == h for n, h in want.items()
                   if n != "f100.bin")
        assert not (tmp_path / "f100.bin").exists() and not list(tmp_path.glob("*.part"))
        pool = runner._transfer._idle
        assert len(pool) == 1  # one helper answered all 200, and is in step to be used again
        stop = threading.Event()
        ok = [item for i, item in enumerate(items) if i != 100]
        many = (ok * (LANDING_FILES // len(ok) + 2))[:LANDING_FILES + 2 * WINDOW]  # more than one landing
        stream = runner.get_many(many, stop)
        assert next(stream) == want["f000.bin"]  # the first landing placed
        stop.set()  # asks nothing more: what it had asked (a window at most) still lands, the rest never
        rest = list(stream)
        assert LANDING_FILES - 1 <= len(rest) < len(many) - 1 and all(isinstance(r, str) for r in rest)
        assert not list(tmp_path.glob("*.part"))
    finally:
        runner.close()


def test_a_failed_get_many_says_every_file_it_placed_before_the_failure(sshd, tmp_path, remote_fs_dir):
    """get_many stopped by a failure (here a file gone from the host; a cut link or Ctrl-C takes the same
    path): the files verified before it land and each one's outcome comes before the error, so a fetch
    records every file it leaves under a final name (they had landed unsaid, and a cut fetch's record
    missed up to a landing's worth of the files on disk)."""
    items, want = [], []
    for i in range(LANDING_FILES + 40):
        src = remote_fs_dir / "failing" / f"f{i:03d}"
        src.parent.mkdir(exist_ok=True)
        src.write_bytes(os.urandom(50 + i))
        items.append((str(src), tmp_path / src.name, None))
        want.append(hashlib.sha256(src.read_bytes()).hexdigest())
    gone = LANDING_FILES + 30  # a landing placed, 30 verified files held, then the failure
    Path(items[gone][0]).unlink()
    runner = sshd.runner()
    got: list[object] = []
    try:
        with pytest.raises(TransferError, match="no such file"):
            got.extend(runner.get_many(items, threading.Event()))  # each outcome kept as it comes
        assert got == want[:gone]
        placed = sorted(p.name for p in tmp_path.iterdir())
        assert placed == [f"f{i:03d}" for i in range(gone)]  # nothing after the failure, no part left
    finally:
        runner.close()


def test_sftp_requests_from_several_threads_at_once_all_get_their_answers(sshd, remote_dir):
    """One runner's SFTP client, asked from several threads at once (a session's link start asks `home`
    while the command asks `exists`): paramiko's client lets one thread read another's answer and drop
    it, which hung `fetch` in CI; the runner's requests go one at a time."""
    (remote_dir / "here").write_text("x")
    runner = sshd.runner()
    answers: list[bool] = []

    def ask() -> None:
        for _ in range(150):
            answers.append(runner.exists(str(remote_dir / "here")))

    try:
        threads = [threading.Thread(target=ask, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in threads), "an SFTP request never got its answer"
        assert answers == [True] * 450
    finally:
        runner.close()


def test_host_without_python_falls_back_to_sftp(sshd, tmp_path, remote_dir):
    runner = sshd.runner(python="/nonexistent/python3")
    data = os.urandom(3_000_000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    try:
        assert runner.put(src, str(remote_dir / "a" / "b.bin")) == expected
        assert runner._transfer._unusable is not None  # the helper could not start there
        assert (remote_dir / "a" / "b.bin").read_bytes() == data
        assert sorted(p.name for p in (remote_dir / "a").iterdir()) == ["b.bin"]
        assert runner.get(str(remote_dir / "a" / "b.bin"), tmp_path / "back.bin") == expected
        assert runner.remote_sha256(str(remote_dir / "a" / "b.bin")) == expected  # sha256sum
        with pytest.raises(TransferError):
            runner.get(str(remote_dir / "missing"), tmp_path / "m")
    finally:
        runner.close()


def test_dead_sftp_channel_is_reopened_once(sshd, remote_dir):
    runner = sshd.runner()
    try:
        assert runner.exists(str(remote_dir))
        runner.sftp().close()  # the SFTP channel dies, the connection lives
        assert runner.exists(str(remote_dir))
        assert not runner.exists(str(remote_dir / "nope"))
    finally:
        runner.close()


class _Fake:
    """A Process whose hooks are scripted: what `drive` does with them is the test."""

    host_enforces_timeout = False

    def __init__(self, chunks: list[tuple[str, bytes]], answers: bool = True) -> None:
        self.chunks = chunks
        self.answers = answers
        self.killed = self.forgotten = False

    def read(self, wait: float) -> list[tuple[str, bytes]]:
        if self.chunks:
            return [self.chunks.pop(0)]
        time.sleep(min(wait, 0.05))
        return []

    def exit_code(self) -> int | None:
        return None

    def alive(self) -> bool:
        return self.answers

    def kill(self) -> None:
        self.killed = True

    def lost(self) -> None:
        self.forgotten = True


def test_drive_times_out_with_124_and_keeps_output():
    fake = _Fake([("out", b"one\ntw"), ("out", b"o\n")])
    lines: list[tuple[str, str]] = []
    result = drive(fake, ["x"], name="h", started=time.monotonic(), timeout=0.3,
                   stream=lambda n, line: lines.append((n, line)), on_bytes=None, liveness_timeout=None)
    assert (result.exit_code, result.timed_out, result.stdout) == (124, True, "one\ntwo\n")
    assert lines == [("out", "one"), ("out", "two")]
    assert fake.killed


def test_drive_silent_dead_link_is_connection_lost_with_partial_stdout():
    fake = _Fake([("out", b"partial")], answers=False)
    with pytest.raises(ConnectionLostError) as info:
        drive(fake, ["x"], name="h", started=time.monotonic(), timeout=None, stream=None, on_bytes=None,
              liveness_timeout=0.1)
    assert info.value.exit_code == ExitCode.CONNECTION_LOST
    assert info.value.partial_stdout == "partial"
    assert fake.forgotten


def test_drive_link_lost_from_a_hook():
    class Dying(_Fake):
        def exit_code(self) -> int | None:
            raise LinkLost

    with pytest.raises(ConnectionLostError):
        drive(Dying([]), ["x"], name="h", started=time.monotonic(), timeout=None, stream=None, on_bytes=None,
              liveness_timeout=None)


def test_local_runner_stdin_raw_bytes_and_missing_commands(tmp_path):
    runner = LocalRunner()
    assert runner.run(["cat"], stdin=b"in put").stdout == "in put"
    raw: list[tuple[str, bytes]] = []
    result = runner.run(["sh", "-c", "printf 'a\\0b'; printf e >&2"], on_bytes=lambda n, b: raw.append((n, b)))
    assert sorted(raw) == [("err", b"e"), ("out", b"a\0b")] and result.stdout == ""
    assert runner.run(["no-such-command-thrust"]).exit_code == 127
    script = tmp_path / "noexec"
    script.write_text("#!/bin/sh\n")
    assert runner.run([str(script)]).exit_code == 126
    started = time.monotonic()
    result = runner.run(["sleep", "5"], timeout=0.3)
    assert result.timed_out and result.exit_code == 124 and time.monotonic() - started < 3
    # a child that keeps the pipes open does not hold the result past the grace period
    started = time.monotonic()
    assert runner.run(["sh", "-c", "sleep 8 & echo done"]).stdout == "done\n"
    assert time.monotonic() - started < 8


def test_serve_send_reads_the_bytes_even_when_the_part_cannot_be_opened(tmp_path):
    """`send` is a put whose bytes follow at once: with an unwritable target the helper still reads
    them (and their hash), answers err, and takes the next request in step."""
    proc = _serve(tmp_path)
    (tmp_path / "file").write_text("a file, not a directory")
    bad, good = tmp_path / "file" / "sub" / "x", tmp_path / "out" / "y"
    for target, data in ((bad, b"lost"), (good, b"kept")):
        proc.stdin.write(f"send {transfer._hex(str(target) + '.part')} {transfer._hex(str(target))} {len(data)} 640\n"
                         .encode() + data + hashlib.sha256(data).hexdigest().encode())
    proc.stdin.flush()
    assert _reply(proc)[:2] == ["err", "3"]
    assert _reply(proc) == ["ok", hashlib.sha256(b"kept").hexdigest()]
    assert good.read_bytes() == b"kept" and good.stat().st_mode & 0o777 == 0o640
    proc.stdin.close()
    assert proc.wait(timeout=10) == 0


def test_put_many_streams_files_on_one_helper_and_stops_at_a_failure(sshd, tmp_path, remote_fs_dir):
    """put_many over a real sshd: 100 files (an empty one, a 3 MiB one) in order on one helper, each
    verified and in place; a target that cannot be written fails after the files before it landed,
    and the helper stays in step for the next transfer."""
    local = tmp_path / "local"
    local.mkdir()
    items, want = [], {}
    for i in range(100):
        data = os.urandom(0 if i == 7 else 3 << 20 if i == 50 else 50 + i * 41)
        src = local / f"f{i:03d}"
        src.write_bytes(data)
        items.append((src, str(remote_fs_dir / "up" / f"d{i % 5}" / f"f{i:03d}")))
        want[i] = hashlib.sha256(data).hexdigest()
    (remote_fs_dir / "blocker").write_text("a file where a directory is wanted")
    runner = sshd.runner()
    try:
        assert runner.put_many(items) == [want[i] for i in range(100)]
        for i, (_src, target) in enumerate(items):
            assert hashlib.sha256(Path(target).read_bytes()).hexdigest() == want[i]
        assert not list((remote_fs_dir / "up").rglob("*.part"))
        helper = runner._transfer._idle[0]
        bad = [(items[0][0], str(remote_fs_dir / "again0")), (items[1][0], str(remote_fs_dir / "blocker" / "x")),
               (items[2][0], str(remote_fs_dir / "again2"))]
        with pytest.raises(TransferError, match="cannot write"):
            runner.put_many(bad)
        assert (remote_fs_dir / "again0").read_bytes() == items[0][0].read_bytes()
        # already under way when the failure was answered: whole or absent, never half
        again2 = remote_fs_dir / "again2"
        assert not again2.exists() or again2.read_bytes() == items[2][0].read_bytes()
        assert runner._transfer._idle == [helper]  # answered in step: the same helper, reusable
        assert runner.put(items[3][0], str(remote_fs_dir / "after")) == want[3]
    finally:
        runner.close()


SYSFS_FILE = Path("/sys/devices/system/cpu/online")  # sysfs says 4096 bytes and reads a few: it "shrinks"


@pytest.mark.skipif(not SYSFS_FILE.is_file(), reason="no sysfs here")
def test_put_many_of_a_file_that_shrinks_leaves_its_target_untouched(sshd, tmp_path, remote_dir):
    assert SYSFS_FILE.stat().st_size > len(SYSFS_FILE.read_bytes())
    first = tmp_path / "first"
    first.write_bytes(b"first")
    (remote_dir / "shrunk").write_text("as it was")
    runner = sshd.runner()
    try:
        with pytest.raises(TransferError, match="shrank while it was being sent"):
            runner.put_many([(first, str(remote_dir / "first")), (SYSFS_FILE, str(remote_dir / "shrunk"))])
        assert (remote_dir / "first").read_bytes() == b"first"
        assert (remote_dir / "shrunk").read_text() == "as it was"
        assert len(runner._transfer._idle) == 1  # padded and refused by hash: the helper stayed in step
    finally:
        runner.close()


def test_put_many_hears_a_refusal_before_sending_more_than_its_byte_budget(sshd, tmp_path, remote_dir, monkeypatch):
    """With SEND_AHEAD_BYTES unanswered it waits: a host that refuses the first file (here: its
    parent is a file) is heard before the rest go out. The budget is shrunk to one byte to see it."""
    monkeypatch.setattr(transfer, "SEND_AHEAD_BYTES", 1)
    (remote_dir / "blocker").write_text("a file where a directory is wanted")
    srcs = []
    for i in range(3):
        srcs.append(tmp_path / f"s{i}")
        srcs[-1].write_bytes(os.urandom(1000))
    runner = sshd.runner()
    try:
        with pytest.raises(TransferError, match="cannot write"):
            runner.put_many([(srcs[0], str(remote_dir / "blocker" / "x")),
                             *[(s, str(remote_dir / s.name)) for s in srcs[1:]]])
        assert not (remote_dir / "s1").exists() and not (remote_dir / "s2").exists()
        assert len(runner._transfer._idle) == 1
    finally:
        runner.close()
