"""Issue 56 items 2 and 3: what a run that did not finish leaves comes back as a finished run's does
(its metrics.csv, its config, its logs dir: what says why it failed), `--no-fetch` brings nothing, and
a checkpoint the `artifacts:` glob matches too is in both places, one file linked to the other, with
the end saying so. Real runs over the `sshd` host; the link's copy fallback on another filesystem here."""

from __future__ import annotations

import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir, wait_until

from thrust_remote.fetch import artifacts
from thrust_remote.host.runner import sha256_file

pytestmark = pytest.mark.xdist_group("test_failed_run_artifacts")

# a Lightning + Hydra template's run dir: metrics.csv, .hydra/, a logs dir, checkpoints/last.ckpt; then
# it dies (exit 3), or (`hold`) waits to be stopped, or (`ok`) finishes
JOB_PY = '''\
import os
import sys
import time

out = "runs/2026-12-02"
for sub in (".hydra", "logs", "checkpoints"):
    os.makedirs(f"{out}/{sub}", exist_ok=True)
with open(f"{out}/metrics.csv", "w") as fh:
    fh.write("step,val/acc\\n1,0.5\\n2,0.61\\n")
with open(f"{out}/.hydra/config.yaml", "w") as fh:
    fh.write("lr: 0.1\\n")
with open(f"{out}/logs/train.log", "w") as fh:
    fh.write("epoch 2: loss is nan\\n")
with open(f"{out}/checkpoints/last.ckpt", "wb") as fh:
    fh.write(b"weights at step 2" * 1000)
print("ready", flush=True)
if sys.argv[1:] == ["hold"]:
    time.sleep(600)
sys.exit(0 if sys.argv[1:] == ["ok"] else 3)
'''

JOBS = """\
jobs:
  dying:
    script: job.py
    artifacts: ["runs/**"]
    checkpoints: runs/*/checkpoints/*.ckpt
    sync_every: 0
  finishing:
    script: job.py
    args: [ok]
    artifacts: ["runs/**"]
    checkpoints: runs/*/checkpoints/*.ckpt
    sync_every: 0
  held:
    script: job.py
    args: [hold]
    artifacts: ["runs/**"]
    checkpoints: runs/*/checkpoints/*.ckpt
    sync_every: 0
"""

RUN_FILES = {"metrics.csv": "step,val/acc\n1,0.5\n2,0.61\n", ".hydra/config.yaml": "lr: 0.1\n",
             "logs/train.log": "epoch 2: loss is nan\n"}


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "failing"
    return new_project(tmp_path_factory.mktemp("failing") / "project", sshd, workdir, files={"job.py": JOB_PY},
                       jobs=JOBS, message="a job that dies after writing its run dir")


def _run_id(text: str) -> str:
    return re.search(r"launching run (\S+)", text).group(1)  # type: ignore[union-attr]


def _brought_all(project: Path, run_id: str, err: str) -> None:
    """Every file of the run dir here, the checkpoint in both places as one file, and the end said so."""
    kept = project / ".thrust" / "fetched" / run_id
    run_dir = kept / "artifacts" / "runs" / "2026-12-02"
    for name, text in RUN_FILES.items():
        assert (run_dir / name).read_text() == text, (name, err)
    in_artifacts, in_checkpoints = run_dir / "checkpoints" / "last.ckpt", kept / "checkpoints" / "last.ckpt"
    assert in_artifacts.read_bytes() == b"weights at step 2" * 1000
    assert os.path.samefile(in_artifacts, in_checkpoints), "one file, hard-linked (the same filesystem here)"
    said = " ".join(err.split())
    assert "artifacts: 4 file(s) in .thrust/fetched/" in said, said
    assert "last.ckpt is also artifacts/runs/2026-12-02/checkpoints/last.ckpt (a hard link)" in said, said


def test_a_finished_runs_checkpoint_is_in_its_artifacts_too(cli, project):
    """The checkpoint the artifacts glob matches too: in artifacts/ at its path and in checkpoints/, one
    file (the second place linked, not fetched again), and the end says so."""
    got = cli("train", "finishing", cwd=project)
    assert got.returncode == 0, got.stderr
    _brought_all(project, _run_id(got.stderr), got.stderr)


def test_a_failed_runs_artifacts_come_back_with_its_checkpoint_in_both_places(cli, project):
    """train (followed) of a job that exits 3: FAILED with its own code, and its metrics.csv, .hydra/
    config, logs dir and checkpoint all here, the checkpoint also under checkpoints/, said at the end."""
    got = cli("train", "dying", cwd=project)
    assert got.returncode == 3, got.stderr
    run_id = _run_id(got.stderr)
    assert f"run {run_id} ended FAILED (exit code 3)" in got.stderr, got.stderr
    _brought_all(project, run_id, got.stderr)
    again = cli("fetch", run_id, cwd=project)  # nothing moves again: each place unchanged, still one file
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert "(0 fetched, 0 bytes; 4 unchanged), verified by sha256; runs/2026-12-02/checkpoints/last.ckpt is also " \
           "checkpoints/last.ckpt (a hard link)" in said, said


def test_no_fetch_brings_nothing_of_a_failed_run(cli, project):
    got = cli("train", "dying", "--no-fetch", cwd=project)
    assert got.returncode == 3, got.stderr
    run_id = _run_id(got.stderr)
    assert not (project / ".thrust" / "fetched" / run_id).exists(), got.stderr
    assert "artifacts:" not in got.stderr, got.stderr


def test_a_stopped_runs_artifacts_come_back_at_the_end_of_its_follow(cli, project):
    """train --detach, then `logs -f` follows it while `stop` ends it: STOPPED, and its files come back
    as a finished run's do."""
    started = cli("train", "held", "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = _run_id(started.stdout + started.stderr)
    wait_until(lambda: "ready" in cli("logs", run_id, cwd=project).stdout, 120, "the job's files written")
    with ThreadPoolExecutor(1) as pool:
        followed = pool.submit(cli, "logs", run_id, "--follow", cwd=project, timeout=300)
        assert cli("stop", run_id, cwd=project).returncode == 0
        got = followed.result()
    assert f"run {run_id} ended STOPPED" in " ".join(got.stderr.split()), got.stderr
    _brought_all(project, run_id, got.stderr)


def test_a_twin_on_another_filesystem_comes_as_a_verified_copy(tmp_path):
    """A hard link cannot cross filesystems: the file is copied, hashed as it is written; a twin whose
    content is no longer the recorded one is not used (the file is fetched instead)."""
    if not Path("/dev/shm").is_dir() or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem here")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:
        source = Path(other) / "last.ckpt"
        source.write_bytes(b"state" * 100)
        sha = sha256_file(source)
        target = tmp_path / "last.ckpt"
        assert artifacts.from_twin((source, {}, "last.ckpt"), target, sha, 0o022, 0o644) == artifacts.COPY
        assert target.read_bytes() == source.read_bytes() and not os.path.samefile(source, target)
        source.write_bytes(b"edited here")
        assert artifacts.from_twin((source, {}, "last.ckpt"), tmp_path / "again.ckpt", sha, 0o022, 0o644) is None
        assert not (tmp_path / "again.ckpt").exists()
        assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # no temporary file left
