"""A run's artifacts brought home (docs/architecture.md, "Artifacts"): over a real sshd, a project that
is not this repository runs a command job that writes files under its cwd and its run dir; they come
back into .thrust/fetched/<run-id>/artifacts/ verified, a second fetch transfers nothing, a changed
file comes again, a glob that matches nothing warns, and a cut transfer leaves no file under its
final name and the next fetch completes it. The host side's listing is also checked on its own."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import EXE, new_project, remote_tempdir, run_tree

from thrust_remote.agent import listing
from thrust_remote.core.errors import ExitCode

# one worker runs this module's tests, in order: its tests change the files of one shared run, each after the last
pytestmark = pytest.mark.xdist_group("test_fetch_artifacts")

WRITE = """\
#!/bin/sh
mkdir -p runs/tb/sub models
echo "event-1 $THRUST_RUN_ID" > runs/tb/events.out.1
echo "event-2" > runs/tb/sub/events.out.2
printf 'weights' > models/a.pt
echo "in the run dir" > "$THRUST_RUN_DIR/out.txt"
"""

JOBS = """\
jobs:
  writer:
    kind: command
    command: [sh, write.sh]
    artifacts: ["runs/**", "models/*.pt", "$THRUST_RUN_DIR/out.txt", "nothing/*.bin", "$THRUST_RUN_DIR/none*"]
    metrics: {tensorboard: runs/tb}
  plain:
    kind: command
    command: [sh, -c, "true"]
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def trained(sshd, tmp_path_factory) -> tuple[Path, Path, str, subprocess.CompletedProcess]:
    """(project, host workdir, run id, train's result): one run of the writer job, fetched by train."""
    workdir = remote_tempdir(sshd) / "arts"
    proj = new_project(tmp_path_factory.mktemp("arts") / "project", sshd, workdir, files={"write.sh": WRITE},
                       jobs=JOBS, message="writer")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    result = subprocess.run([EXE, "train", "writer"], cwd=proj, capture_output=True, text=True, env=env, timeout=300)
    match = re.search(r"launching run (\S+)", result.stderr)
    assert result.returncode == 0 and match, result.stderr
    return proj, workdir, match.group(1), result


def _fetch(cli, proj: Path, run_id: str) -> tuple[subprocess.CompletedProcess, int]:
    """`fetch RUN`: its result and how many files it transferred (what it reports)."""
    result = cli("fetch", run_id, cwd=proj)
    match = re.search(r"\((\d+) fetched", result.stderr)
    return result, int(match.group(1)) if match else -1


def test_train_fetches_the_artifacts_verified_and_warns_for_a_glob_that_matches_nothing(trained):
    proj, workdir, run_id, result = trained
    dest = proj / ".thrust" / "fetched" / run_id / "artifacts"
    assert f".thrust/fetched/{run_id}/artifacts/" in result.stderr
    assert "'nothing/*.bin' matches nothing" in result.stderr  # a warning, and the run still exit 0
    # a glob under the run directory is said to be looked for there, not in the checkout
    run_dir_glob = next(line for line in result.stderr.splitlines() if "'$THRUST_RUN_DIR/none*'" in line)
    assert run_dir_glob.endswith(f"(under {workdir / '.thrust' / 'runs' / run_id})"), run_dir_glob
    run_dir, tree = workdir / ".thrust" / "runs" / run_id, run_tree(workdir, run_id)
    expected = {
        "runs/tb/events.out.1": tree / "runs/tb/events.out.1",
        "runs/tb/sub/events.out.2": tree / "runs/tb/sub/events.out.2",
        "models/a.pt": tree / "models/a.pt",
        "THRUST_RUN_DIR/out.txt": run_dir / "out.txt",
    }
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == sorted(expected)
    for name, source in expected.items():
        assert (dest / name).read_bytes() == source.read_bytes(), name
    record = json.loads((dest.parent / "artifacts.json").read_text())["files"]
    assert {name: row["sha256"] for name, row in record.items()} == {n: _sha(p) for n, p in expected.items()}
    assert not list(dest.rglob("*.part"))
    # .thrust/ keeps its `*` .gitignore: the next sync does not take fetched files for untracked ones
    assert (proj / ".thrust" / ".gitignore").read_text() == "*\n"


def test_a_second_fetch_transfers_nothing_and_a_changed_file_comes_again(cli, trained):
    proj, workdir, run_id, _ = trained
    dest = proj / ".thrust" / "fetched" / run_id / "artifacts"
    inodes = {p: p.stat().st_ino for p in dest.rglob("*") if p.is_file()}
    again, n = _fetch(cli, proj, run_id)
    assert again.returncode == 0, again.stderr
    assert n == 0, again.stderr
    assert again.stdout.strip() == str(dest)  # no model: the artifacts dir is what fetch names
    assert {p: p.stat().st_ino for p in dest.rglob("*") if p.is_file()} == inodes  # nothing rewritten
    (run_tree(workdir, run_id) / "runs/tb/events.out.1").write_text("event-1, appended later\n")
    changed, n = _fetch(cli, proj, run_id)
    assert changed.returncode == 0, changed.stderr
    assert n == 1, changed.stderr
    assert (dest / "runs/tb/events.out.1").read_text() == "event-1, appended later\n"
    assert (dest / "models/a.pt").stat().st_ino == inodes[dest / "models/a.pt"]


def test_a_cut_fetch_leaves_no_half_file_and_the_next_fetch_completes(cli, sshd, trained):
    proj, workdir, run_id, _ = trained
    dest = proj / ".thrust" / "fetched" / run_id / "artifacts"
    big = run_tree(workdir, run_id) / "models" / "big.pt"
    big.write_bytes(os.urandom(150_000_000))
    proc = subprocess.Popen([EXE, "fetch", run_id], cwd=proj, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    cut_done = threading.Event()

    def cut() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            for part in (dest / "models").glob(".big.pt.*.part"):  # the download's temporary file
                with contextlib.suppress(OSError):
                    if part.stat().st_size > 5_000_000:
                        sshd.kill_sessions()
                        cut_done.set()
                        return
            time.sleep(0.005)

    watcher = threading.Thread(target=cut, daemon=True)
    watcher.start()
    _out, err = proc.communicate(timeout=120)
    watcher.join()
    try:
        assert cut_done.is_set(), "the transfer ended before it could be cut"
        assert proc.returncode == ExitCode.TRANSFER == 74, err
        assert not (dest / "models" / "big.pt").exists()  # never a half file under the final name
        assert not list(dest.rglob("*.part"))  # nor a temporary one
        done, n = _fetch(cli, proj, run_id)
        assert done.returncode == 0, done.stderr
        assert n == 1, done.stderr  # only the file the cut left missing
        assert _sha(dest / "models" / "big.pt") == _sha(big)
    finally:
        big.unlink()


def test_a_job_with_no_model_and_no_artifacts_has_nothing_to_fetch(cli, trained):
    proj, _workdir, _run_id, _ = trained
    result = cli("train", "plain", cwd=proj)
    assert result.returncode == 0, result.stderr
    assert "artifacts" not in result.stderr
    run_id = re.search(r"launching run (\S+)", result.stderr).group(1)
    fetched = cli("fetch", run_id, cwd=proj)
    assert fetched.returncode == ExitCode.USAGE, fetched.stderr
    assert "nothing to fetch" in fetched.stderr and "Traceback" not in fetched.stderr


# ------------------------------------------------------------------------------------------ the host side

def test_listing_refuses_what_leaves_its_base_and_lists_each_file_once(tmp_path):
    cwd, run_dir, outside = tmp_path / "w", tmp_path / "w" / ".thrust" / "runs" / "r", tmp_path / "secret"
    (cwd / "runs" / "a").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    outside.mkdir()
    (outside / "key").write_text("no")
    (cwd / "runs" / "a" / "ev").write_text("1")
    (cwd / "runs" / "link").symlink_to(outside / "key")
    (run_dir / "m.jsonl").write_text("{}")
    answer = listing.list_files(str(cwd), str(run_dir),
                                ["runs", "runs/**", "../secret/*", "/etc/passwd", "$THRUST_RUN_DIR/*.jsonl", "x/*"])
    names = sorted((f["base"], f["path"]) for f in answer["files"])
    assert names == [("cwd", "runs/a/ev"), ("run", "m.jsonl")]  # a directory match means its files; once each
    assert "runs/link" in answer["refused"]  # a symlink out of the workdir
    assert {"../secret/*", "/etc/passwd"} <= set(answer["refused"])
    assert answer["unmatched"] == ["x/*"]
    row = next(f for f in answer["files"] if f["path"] == "runs/a/ev")
    assert row["sha256"] == hashlib.sha256(b"1").hexdigest() and row["size"] == 1


def test_listing_skips_what_an_earlier_run_left_in_the_shared_checkout(tmp_path):
    cwd, run_dir = tmp_path / "w", tmp_path / "w" / ".thrust" / "runs" / "r"
    (cwd / "runs").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    (cwd / "runs" / "old.txt").write_text("an earlier run's")
    (cwd / "runs" / "new.txt").write_text("this run's")
    (run_dir / "out.txt").write_text("the run dir is the run's own, whatever its time")
    started = time.time()
    os.utime(cwd / "runs" / "old.txt", (started - 3600, started - 3600))
    os.utime(run_dir / "out.txt", (started - 3600, started - 3600))
    answer = listing.list_files(str(cwd), str(run_dir), ["runs/*", "runs/old*", "$THRUST_RUN_DIR/*"], since=started - 1)
    assert sorted((f["base"], f["path"]) for f in answer["files"]) == [("cwd", "runs/new.txt"), ("run", "out.txt")]
    assert answer["older"] == 1 and answer["unmatched"] == ["runs/old*"]
    # once the run has ended, what changed after its end is a later run's
    os.utime(cwd / "runs" / "new.txt", (started + 3600, started + 3600))
    ended = listing.list_files(str(cwd), str(run_dir), ["runs/*", "$THRUST_RUN_DIR/*"], since=started - 1,
                               until=started)
    assert [(f["base"], f["path"]) for f in ended["files"]] == [("run", "out.txt")]
    assert ended["newer"] == 1 and ended["older"] == 1


@pytest.mark.slow
def test_a_later_run_does_not_bring_back_what_an_earlier_one_left(cli, trained):
    """Each run has a tree of its own: a file left in an earlier run's tree is not in a later run's, and a
    fetch of the earlier run after the later one rewrote the same paths brings the earlier run's files,
    with no time window and no word about other runs' files."""
    proj, workdir, first_id, _ = trained
    first_event = proj / ".thrust" / "fetched" / first_id / "artifacts" / "runs" / "tb" / "events.out.1"
    first_had = first_event.read_text()
    (run_tree(workdir, first_id) / "models" / "stale.pt").write_text("left by an earlier run")
    result = cli("train", "writer", cwd=proj)
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"launching run (\S+)", result.stderr).group(1)
    assert run_id != first_id
    dest = proj / ".thrust" / "fetched" / run_id / "artifacts"
    assert (dest / "models" / "a.pt").is_file()  # this run wrote it, in its own tree
    assert not (dest / "models" / "stale.pt").exists()
    assert "older than this run" not in result.stderr and "newer than" not in result.stderr
    again = cli("fetch", first_id, cwd=proj)
    assert again.returncode == 0, again.stderr
    assert "newer than" not in again.stderr and "older than" not in again.stderr
    assert first_event.read_text() == first_had and run_id not in first_had
    assert (proj / ".thrust" / "fetched" / first_id / "artifacts" / "models" / "stale.pt").read_text() == \
        "left by an earlier run"  # its own tree's file, whenever it was written


def test_a_glob_that_matched_only_other_runs_files_does_not_read_as_matching_nothing():
    """Fetching an earlier run whose files a later run rewrote: one warning said the glob 'matches nothing'
    and the next that 5,000 matching files were a later run's. Now the first says 'nothing of this run's'."""
    from thrust_remote.fetch.artifacts import listing_warnings

    aged = listing_warnings({"cwd": "/w", "unmatched": ["out/**"], "newer": 5000}, "box", "/w/.thrust/runs/r")
    assert aged[0] == "artifacts: 'out/**' matches nothing of this run's on box (under /w)"
    assert "5000 matching file(s) under /w on box are newer than this run's end" in aged[1]
    plain = listing_warnings({"cwd": "/w", "unmatched": ["out/**"]}, "box", "/w/.thrust/runs/r")
    assert plain == ["artifacts: 'out/**' matches nothing on box (under /w)"]


def test_a_run_on_another_filesystem_brings_back_its_artifacts_and_checkpoint(sshd, tmp_path):
    """A workdir on a tmpfs (device number 39 here, the disk's is 65024): the artifacts and the newest
    checkpoint come back verified. The transfer helper once took a two-digit device number for a path
    and died, so every fetch and checkpoint pull failed on such filesystems."""
    if sshd.tmpfs is None:
        pytest.skip("no tmpfs of the test's own: mounting needs root (make test runs as root in CI)")
    workdir = Path(tempfile.mkdtemp(prefix="remote-", dir=sshd.tmpfs)) / "arts"
    jobs = ("jobs:\n  ck:\n    kind: command\n    command: [sh, write.sh]\n    artifacts: ['models/*.pt']\n"
            "    checkpoints: ckpt/*.pt\n")
    script = "mkdir -p models ckpt\nprintf 'weights' > models/a.pt\nprintf 'state-1' > ckpt/step-1.pt\n"
    proj = new_project(tmp_path / "project", sshd, workdir, files={"write.sh": script}, jobs=jobs, message="ck")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    result = subprocess.run([EXE, "train", "ck"], cwd=proj, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"launching run (\S+)", result.stderr).group(1)
    fetched = proj / ".thrust" / "fetched" / run_id
    assert (fetched / "artifacts" / "models" / "a.pt").read_bytes() == b"weights"
    assert (fetched / "checkpoints" / "step-1.pt").read_bytes() == b"state-1"


def test_a_checkpoint_linked_to_outside_the_run_is_a_warning_naming_it_not_a_silent_skip(cli, tmp_path):
    """The listing refuses a link whose real path leaves the run's directories; the artifacts fetch said
    so, the checkpoint pull skipped it without a word (host local: the same listing as over SSH)."""
    from helpers import commit, git_init

    outside = tmp_path / "elsewhere.pt"
    outside.write_text("not this run's")
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(
        "jobs:\n  ck:\n    command: [sh, -c, 'mkdir -p ckpt && printf state-1 > ckpt/step-1.pt && "
        f"ln -s {outside} ckpt/step-2.pt']\n    checkpoints: ckpt/*.pt\n")
    commit(proj, "a job whose newest checkpoint is a link to outside")
    trained = cli("train", "ck", "--host", "local", cwd=proj)
    assert trained.returncode == 0, trained.stderr
    run_id = re.search(r"launching run (\S+)", trained.stderr).group(1)
    fetched = cli("fetch", run_id, "--host", "local", cwd=proj)
    assert fetched.returncode == 0, fetched.stderr
    for result in (trained, fetched):  # the end of the follow pulls it, and so does fetch
        said = [line for line in result.stderr.splitlines() if "checkpoints:" in line and "step-2.pt" in line]
        assert len(said) == 1 and "is outside the run's directories on local" in said[0], result.stderr
    got = proj / ".thrust" / "fetched" / run_id / "checkpoints"
    assert sorted(p.name for p in got.iterdir()) == ["step-1.pt"]
