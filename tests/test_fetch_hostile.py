"""A fetch against a hostile host or tree (issue 26; docs/architecture.md, "Security"), over a real sshd.

One command job runs once; each test then crafts `$THRUST_RUN_DIR/out/` on the host (the run directory
has no age filter, so files made after the run still count) and runs `fetch RUN`. Where the host must
misbehave at one exact moment (an answer altered, a file swapped or grown between the listing and the
transfer, a listing out of time, an account that root's permissions do not cover), the host's `python:`
is a small wrapper script (HOST_PY) that runs the real python and does that one thing, as told by a
mode file beside it; with no mode file it is the real python and nothing else. A wrapper that alters
`list-files` must see it as a command of its own, so those fetches run with THRUST_AGENT_LINK=0 (over
the agent link, `list-files` is a request inside `agent serve`, which the wrapper starts unaltered).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import EXE, new_project, remote_tempdir, wait_until

from thrust_remote.core.errors import ExitCode

# one worker runs this module's tests, in order: its tests share one host and run
pytestmark = pytest.mark.xdist_group("test_fetch_hostile")

JOBS = """\
jobs:
  outs:
    kind: command
    command: [sh, -c, "true"]
    artifacts: ["$THRUST_RUN_DIR/out/**"]
"""
GLOB = "$THRUST_RUN_DIR/out/**"
LISTING_MODES = {"deadline", "edit", "swap", "swap_dir", "grow"}  # the wrapper's modes that alter list-files

# The host's python, as the tests need it to misbehave: reads mode.json beside itself, then runs the
# real python (REAL) unchanged, or for `list-files` alters its answer, or the tree after it answered.
HOST_PY = """\
#!{real} -S
import json, os, shutil, subprocess, sys


REAL = {real!r}
try:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mode.json")) as fh:
        mode = json.load(fh)
except OSError:
    mode = {{}}
argv = [REAL, *sys.argv[1:]]
if mode.get("drop_dac") and os.geteuid() == 0:  # root without its read-anything capabilities
    caps = "-dac_override,-dac_read_search"
    argv = ["setpriv", "--bounding-set", caps, "--inh-caps", caps, *argv]
# the agent's own list-files only (python AGENT.pyz list-files ...), not a wrapper that runs it (envexec)
pyz = [i for i, a in enumerate(sys.argv[1:3], 1) if a.endswith(".pyz")]
own = bool(pyz) and sys.argv[pyz[0] + 1:pyz[0] + 2] == ["list-files"]
if not own or not {listing_modes!r} & set(mode):
    os.execvp(argv[0], argv)
if "deadline" in mode:
    argv[argv.index("--deadline") + 1] = str(mode["deadline"])
    os.execvp(argv[0], argv)
answer = json.loads(subprocess.run(argv, stdout=subprocess.PIPE, check=True).stdout.splitlines()[-1])
files = answer["files"]
edit = mode.get("edit")
if edit == "nul":
    files[0]["path"] += "\\0x"
elif edit == "no_sha":
    del files[0]["sha256"]
elif edit == "file_and_dir":
    files.append(dict(files[0], path=files[0]["path"] + "/inner"))
elif edit == "twice":
    files.append(dict(files[0]))
if "swap" in mode:  # a listed file becomes a symlink to another one
    os.remove(mode["swap"])
    os.symlink(mode["to"], mode["swap"])
if "swap_dir" in mode:  # a listed file's directory becomes a symlink to another one
    shutil.rmtree(mode["swap_dir"])
    os.symlink(mode["to_dir"], mode["swap_dir"])
if "grow" in mode:
    with open(mode["grow"], "ab") as fh:
        fh.write(b"written after the listing " * 1000)
print(json.dumps(answer))
"""


class Host:
    """The crafted side: the run's out/ directory on the host, the wrapper's mode, the laptop's copy."""

    def __init__(self, proj: Path, workdir: Path, run_id: str, wrapper: Path) -> None:
        self.proj, self.workdir, self.run_id, self.wrapper = proj, workdir, run_id, wrapper
        self.run_dir = workdir / ".thrust" / "runs" / run_id
        self.out = self.run_dir / "out"
        self.dest = proj / ".thrust" / "fetched" / run_id / "artifacts"
        self.local = self.dest / "THRUST_RUN_DIR" / "out"
        self.mode: dict = {}

    def reset(self) -> None:
        """An empty out/ on the host, nothing fetched yet, the wrapper a plain python."""
        for path in (self.out, self.dest.parent):
            if path.exists():
                subprocess.run(["chmod", "-R", "u+rwX", str(path)], check=True)
                shutil.rmtree(path)
        self.out.mkdir()
        self.set_mode(None)

    def set_mode(self, mode: dict | None) -> None:
        self.mode = mode or {}
        path = self.wrapper.parent / "mode.json"
        if mode is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(mode))

    def fetch(self, timeout: float = 120) -> subprocess.CompletedProcess:
        env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
        if set(self.mode) & LISTING_MODES:  # the wrapper alters list-files: it must run as a command
            env["THRUST_AGENT_LINK"] = "0"
        return subprocess.run([EXE, "fetch", self.run_id], cwd=self.proj, capture_output=True, text=True, env=env,
                              timeout=timeout)

    def fetched(self) -> dict[str, bytes]:
        """What the laptop holds under out/: relative path -> content (regular files only)."""
        if not self.local.is_dir():
            return {}
        return {str(p.relative_to(self.local)): p.read_bytes() for p in self.local.rglob("*")
                if p.is_file() and not p.is_symlink()}

    def record(self) -> dict:
        path = self.dest.parent / "artifacts.json"
        return json.loads(path.read_text())["files"] if path.exists() else {}


@pytest.fixture(scope="module")
def host(sshd, tmp_path_factory) -> Iterator[Host]:
    workdir = remote_tempdir(sshd) / "hostile"
    wrapper = remote_tempdir(sshd, "hostpy-") / "python"
    wrapper.write_text(HOST_PY.format(real=sshd.host_config().python, listing_modes=LISTING_MODES))
    wrapper.chmod(0o755)
    proj = new_project(tmp_path_factory.mktemp("hostile") / "project", sshd, workdir, jobs=JOBS, python=wrapper,
                       message="outs")
    result = subprocess.run([EXE, "train", "outs"], cwd=proj, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    match = re.search(r"launching run (\S+)", result.stderr)
    assert result.returncode == 0 and match, result.stderr
    crafted = Host(proj, workdir, match.group(1), wrapper)
    yield crafted
    crafted.set_mode(None)


def _warnings(stderr: str, word: str) -> list[str]:
    return [line for line in stderr.splitlines() if word in line]


# ------------------------------------------------------------------------------------------ 2, 9, 10

def test_symlinked_directories_and_loops_are_not_walked_and_odd_names_come(host):
    host.reset()
    out = host.out
    (out / "sub").mkdir()
    files = {"a.txt": b"a", "..foo": b"dots", "....": b"four dots", ".hidden": b"h", "sub/b.txt": b"b",
             "n" * 251: b"251", "m" * 255: b"255", "sub/" + "k" * 255: b"255 deep"}
    for name, data in files.items():
        (out / name).write_bytes(data)
    (out / "etc").symlink_to("/etc")  # out of the tree: one refusal, not one per file of /etc
    (out / "l1").symlink_to(".")  # two loops: the listing must still end
    (out / "sub" / "l2").symlink_to("..")
    (out / "same").symlink_to("sub")  # a link to a directory inside: not followed either
    started = time.monotonic()
    result = host.fetch()
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 60
    assert host.fetched() == files  # dotfiles, and names of 251-255 bytes (a short temporary name)
    assert _warnings(result.stderr, "is outside the run's directories") == [
        line for line in result.stderr.splitlines() if "'$THRUST_RUN_DIR/out/etc'" in line]
    links = _warnings(result.stderr, "not followed")
    assert len(links) == 1 and "3 symlinked directories" in links[0], result.stderr
    assert all(f"'$THRUST_RUN_DIR/out/{p}'" in links[0] for p in ("l1", "same", "sub/l2"))
    assert not list(host.dest.rglob("*.part"))


def test_a_listing_out_of_time_names_the_host_and_the_glob(host):
    host.reset()
    (host.out / "a.txt").write_text("a")
    host.set_mode({"deadline": 0})  # the wrapper gives the host's walk no time at all
    result = host.fetch()
    assert result.returncode == ExitCode.TRANSFER, result.stderr
    assert "on sandbox took more than" in result.stderr and repr(GLOB) in result.stderr, result.stderr
    assert "unexpected answer" not in result.stderr and "Traceback" not in result.stderr
    assert host.fetched() == {}


def test_an_unreadable_file_or_directory_is_a_warning_and_the_rest_comes(host):
    host.reset()
    (host.out / "a.txt").write_text("a")
    (host.out / "locked.txt").write_text("no")
    (host.out / "lockdir").mkdir()
    (host.out / "lockdir" / "c.txt").write_text("no")
    (host.out / "locked.txt").chmod(0)
    (host.out / "lockdir").chmod(0)
    host.set_mode({"drop_dac": True})  # root's capabilities would read them anyway
    result = host.fetch()
    assert result.returncode == 0, result.stderr
    assert host.fetched() == {"a.txt": b"a"}
    unreadable = _warnings(result.stderr, "cannot read")
    assert len(unreadable) == 2, result.stderr
    assert any("'$THRUST_RUN_DIR/out/locked.txt' on sandbox (Permission denied)" in w for w in unreadable)
    assert any("'$THRUST_RUN_DIR/out/lockdir' on sandbox (Permission denied)" in w for w in unreadable)


# ------------------------------------------------------------------------------------------ 3

def test_ctrl_c_stops_a_fetch_at_once_records_what_came_and_leaves_no_temporary_file(host):
    host.reset()
    n = 4000
    for i in range(n):
        (host.out / f"f{i:05d}").write_bytes(b"x" * 1000 + str(i).encode())
    proc = subprocess.Popen([EXE, "fetch", host.run_id], cwd=host.proj, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def some_came() -> bool:
        with contextlib.suppress(OSError):
            return sum(1 for e in os.scandir(host.local) if not e.name.endswith(".part")) >= 40
        return False

    wait_until(some_came, 60, "the first files to arrive", interval=0.005)
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _out, err = proc.communicate(timeout=60)
    took = time.monotonic() - interrupted
    assert proc.returncode == ExitCode.INTERRUPTED, err
    assert took < 2.0, f"{took:.1f} s after Ctrl-C"
    assert f"fetch of run {host.run_id}'s artifacts interrupted: " in err and "not fetched" in err, err
    assert f"fetch the rest with: thrust-remote fetch {host.run_id}" in err, err  # what to do next
    local = host.fetched()
    assert 40 <= len(local) < n, len(local)
    for name, data in local.items():  # whole files only
        assert data == (host.out / name).read_bytes(), name
    assert not list(host.dest.rglob("*.part"))
    recorded = {name.removeprefix("THRUST_RUN_DIR/out/") for name in host.record()}
    assert recorded <= set(local)
    assert len(local) - len(recorded) <= 4  # at most the ones that landed in the very instant of the signal
    again = host.fetch()  # and the next fetch brings the rest
    assert again.returncode == 0, again.stderr
    assert len(host.fetched()) == n


def test_a_fetch_removes_the_temporary_files_of_one_killed_outright_and_no_others(host):
    """A fetch killed with SIGKILL leaves its `.NAME.PID-N.part` files (nothing ran to remove them);
    the next fetch removes those of a pid that is gone, and leaves a live process's part (another
    fetch under way) and a host file that merely has such a name."""
    host.reset()
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that is no process now
    (host.out / "a.txt").write_text("a")
    own = f".hosts-own.{gone.pid}-1.part"  # the job's own file with such a name: fetched, never swept
    (host.out / own).write_text("the job's own file")
    host.local.mkdir(parents=True)
    orphan = host.local / f".a.txt.{gone.pid}-3.part"
    orphan.write_bytes(b"half a file")
    live = host.local / f".a.txt.{os.getpid()}-9.part"  # this test's own pid: a process still running
    live.write_bytes(b"being written")
    result = host.fetch()
    assert result.returncode == 0, result.stderr
    assert not orphan.exists() and live.read_bytes() == b"being written"
    assert host.fetched()[own] == b"the job's own file" and host.fetched()["a.txt"] == b"a"
    again = host.fetch()  # its local copy, named like an orphan, is listed: kept, unchanged
    assert again.returncode == 0 and host.fetched()[own] == b"the job's own file", again.stderr


# ------------------------------------------------------------------------------------------ 4, 6

def test_the_laptop_never_writes_through_a_symlink_in_its_fetched_tree(host, tmp_path):
    host.reset()
    (host.out / "sub").mkdir()
    (host.out / "a.txt").write_text("from the host")
    (host.out / "sub" / "b.txt").write_text("b")
    assert host.fetch().returncode == 0
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    shutil.rmtree(host.local / "sub")
    (host.local / "sub").symlink_to(victim_dir)  # a directory link in the fetched tree
    (host.out / "sub" / "b.txt").write_text("b, changed")
    refused = host.fetch()
    assert refused.returncode == ExitCode.TRANSFER, refused.stderr
    assert "is a symlink or a file, not a directory" in refused.stderr and "/sub" in refused.stderr
    assert list(victim_dir.iterdir()) == []
    (host.local / "sub").unlink()
    (host.local / "a.txt").unlink()
    (host.local / "a.txt").symlink_to(victim)  # a file link: replaced, never written through
    (host.local / "a.txt.part").symlink_to(victim)  # nor is a planted temporary name followed
    result = host.fetch()
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "mine"
    assert not (host.local / "a.txt").is_symlink() and (host.local / "a.txt").read_text() == "from the host"
    assert (host.local / "sub" / "b.txt").read_text() == "b, changed"


def test_modes_are_never_more_open_than_the_hosts_and_the_fetched_root_is_owner_only(host):
    host.reset()
    (host.out / "secret.txt").write_text("s")
    (host.out / "secret.txt").chmod(0o600)
    (host.out / "run.sh").write_text("#!/bin/sh\n")
    (host.out / "run.sh").chmod(0o750)
    fetched_root = host.proj / ".thrust" / "fetched"
    fetched_root.chmod(0o755)  # as an older version left it
    result = host.fetch()
    assert result.returncode == 0, result.stderr
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE((host.local / "secret.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((host.local / "run.sh").stat().st_mode) == 0o750 & ~umask
    assert stat.S_IMODE(fetched_root.stat().st_mode) == 0o700


# ------------------------------------------------------------------------------------------ 5

def test_a_file_swapped_after_the_listing_is_not_sent_and_a_grown_one_is_said(host, sshd):
    host.reset()
    secret = remote_tempdir(sshd, "secret-") / "authorized_keys"
    secret.write_text("ssh-ed25519 AAAA the user's key\n")
    (host.out / "sub").mkdir()
    (host.out / "a.txt").write_text("a")
    (host.out / "sub" / "authorized_keys").write_text("a plain file")
    (host.out / "g.bin").write_bytes(b"g" * 100)
    (host.out / "ok.txt").write_text("ok")
    # the wrapper, once the listing is out: a.txt becomes a link to the key file, sub/ a link to the key's
    # directory (the same name there, another file), and g.bin grows
    host.set_mode({"swap": str(host.out / "a.txt"), "to": str(secret), "swap_dir": str(host.out / "sub"),
                   "to_dir": str(secret.parent), "grow": str(host.out / "g.bin")})
    result = host.fetch()
    assert result.returncode == 0, result.stderr
    got = host.fetched()
    assert secret.read_bytes() not in got.values()
    assert "a.txt" not in got and "sub/authorized_keys" not in got
    replaced = _warnings(result.stderr, "was replaced on sandbox after it was listed")
    assert len(replaced) == 2, result.stderr
    grown = _warnings(result.stderr, "changed on sandbox while it was fetched")
    assert len(grown) == 1 and "THRUST_RUN_DIR/out/g.bin" in grown[0] and "listed 100 bytes" in grown[0]
    assert got["g.bin"] == (host.out / "g.bin").read_bytes()  # the whole file as it was sent, verified
    assert got["ok.txt"] == b"ok"


# ------------------------------------------------------------------------------------------ 7

@pytest.mark.parametrize(("edit", "says"), [
    ("nul", "not a plain relative path"),
    ("no_sha", "no sha256 for"),
    ("file_and_dir", "both as a file and as a directory"),
    ("twice", "the same path listed twice"),
])
def test_a_malformed_answer_is_a_clear_error_and_nothing_is_written(host, edit, says):
    host.reset()
    (host.out / "a.txt").write_text("a")
    (host.out / "b.txt").write_text("b")
    host.set_mode({"edit": edit})  # the wrapper alters the listing's answer before it leaves the host
    result = host.fetch()
    assert result.returncode == ExitCode.TRANSFER, result.stderr
    assert "sandbox answered a malformed listing" in result.stderr and says in result.stderr, result.stderr
    assert "THRUST_RUN_DIR/out/a.txt" in result.stderr
    assert "Traceback" not in result.stderr
    assert not host.dest.exists() or not [p for p in host.dest.rglob("*") if p.is_file()]


# ------------------------------------------------------------------------------------------ host `local`

def test_a_local_get_of_a_listed_file_refuses_one_swapped_since(tmp_path):
    """Host `local` keeps the same promise as the transfer helper: only the listed file, never a link."""
    from thrust_remote.host.runner import FileChangedError, LocalRunner

    src, secret, out = tmp_path / "a.txt", tmp_path / "secret", tmp_path / "out" / "a.txt"
    src.write_text("listed")
    secret.write_text("not yours")
    st = src.stat()
    listed = (st.st_dev, st.st_ino)
    runner = LocalRunner()
    assert runner.get(str(src), out, identity=listed) == hashlib.sha256(b"listed").hexdigest()
    (tmp_path / "new").write_text("another file")
    os.replace(tmp_path / "new", src)  # the same name, another inode
    with pytest.raises(FileChangedError):
        runner.get(str(src), out, identity=listed)
    src.unlink()
    src.symlink_to(secret)
    with pytest.raises(FileChangedError):
        runner.get(str(src), out, identity=listed)
    assert out.read_text() == "listed"
    assert not list(out.parent.glob("*.part"))


def _entry(**changes: object) -> dict:
    row = {"base": "cwd", "path": "runs/a", "abs": "/w/runs/a", "size": 1, "mtime": 1.0, "mode": 0o644,
           "dev": 1, "ino": 2, "sha256": "0" * 64}
    return {**row, **changes}


@pytest.mark.parametrize(("entry", "says"), [
    (_entry(path="../x"), "not a plain relative path"),
    (_entry(path="/etc/passwd"), "not a plain relative path"),
    (_entry(abs="runs/a"), "no absolute host path"),
    (_entry(abs="/w/a\0b"), "no absolute host path"),
    (_entry(sha256="A" * 64), "no sha256"),
    (_entry(size=True), "numbers"),
    (_entry(ino=-1), "numbers"),
    ({k: v for k, v in _entry().items() if k != "mode"}, "numbers"),
    (_entry(base="home"), "without a base"),
    ("runs/a", "without a base"),
])
def test_each_malformed_entry_is_named(tmp_path, entry, says):
    from thrust_remote.core.errors import TransferError
    from thrust_remote.fetch.artifacts import checked_entries

    with pytest.raises(TransferError) as info:
        checked_entries({"files": [_entry(path="ok"), entry]}, "gpu", tmp_path)
    assert says in info.value.message and "gpu answered a malformed listing" in info.value.message
    assert info.value.exit_code == ExitCode.TRANSFER
