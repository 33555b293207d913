"""A full disk, on the host while the job runs and on the laptop while a model lands: the cause named
(the host's free space with the run's end; 74 naming the laptop's file), the run's own end recorded,
nothing half-placed, and never an offer to place a model that is not whole.

Both need a filesystem of the test's own that can be filled: a tmpfs (mounting needs root; `make test`
runs as root in CI, elsewhere these skip).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import FAKE_FAST, FAKE_JOB, commit, fake_files, git_init, new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode

# fills the filesystem of its tree, then ends with its own code (3), as a job whose disk filled would
FILLER = "jobs:\n  filler:\n    kind: command\n    command: [sh, -c, 'cat /dev/zero > fill; exit 3']\n"


def _fill(directory: Path) -> Path:
    """`directory`'s filesystem filled to the last byte (a file of the test's own, removed by the caller)."""
    fill = directory / f"fill-{os.getpid()}"
    with fill.open("wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * (1 << 16))
            fh.flush()
    return fill


def test_a_job_that_fills_the_hosts_disk_ends_failed_with_its_code_and_the_free_space_said(cli, sshd, tmp_path):
    """Before: the run's end could not be written on the full disk, so it read LOST (exit code None) with
    no word of the disk. Now its end is written into bytes kept for it, and its status carries the
    free space, which `train`, `status` and `wait` name."""
    if sshd.tmpfs is None:
        pytest.skip("no tmpfs of the test's own: mounting needs root (make test runs as root in CI)")
    workdir = Path(subprocess.run(["mktemp", "-d", "-p", str(sshd.tmpfs)], capture_output=True, text=True,
                                  check=True).stdout.strip()) / "w"
    proj = new_project(tmp_path / "p", sshd, workdir, jobs=FILLER)
    try:
        res = cli("train", "filler", cwd=proj)
        run_id = re.search(r"launching run (\S+)", res.stderr).group(1)
        assert res.returncode == 3, res.stderr
        assert f"run {run_id} ended FAILED (exit code 3)" in res.stderr
        assert re.search(r"the run's disk on sandbox has \d+\.\d MiB free: a full disk may have ended it", res.stderr)
        st = json.loads(cli("status", run_id, "--json", cwd=proj).stdout)
        assert (st["state"], st["exit_code"]) == ("FAILED", 3) and st["disk_free"] < (1 << 20), st
        shown = cli("status", run_id, cwd=proj)
        assert "a full disk may have ended it" in shown.stdout, shown.stdout
        waited = cli("wait", run_id, cwd=proj)
        assert waited.returncode == 3 and "a full disk may have ended it" in waited.stderr, waited.stderr
    finally:
        for fill in workdir.glob(".thrust/trees/*/fill"):
            fill.unlink()
    st = json.loads(cli("status", run_id, "--json", cwd=proj).stdout)
    assert st["disk_free"] > 128 << 20  # room again: the next look says so (nothing named then)
    assert "full disk" not in cli("status", run_id, cwd=proj).stdout


def test_a_run_that_left_an_empty_model_is_not_offered_to_be_placed(cli, sshd, tmp_path):
    """A run that ended badly with a model it could not write whole (0 bytes: a full disk): before, the
    end said `place it anyway: ... fetch --force`; now no offer, and fetch says why."""
    jobs = ("jobs:\n  own:\n    kind: command\n    command: [sh, -c, ': > \"$THRUST_EXPORT\"; exit 2']\n"
            "    export: web/public/own.onnx\n")
    proj = new_project(tmp_path / "p", sshd, remote_tempdir(sshd) / "w", jobs=jobs)
    res = cli("train", "own", cwd=proj)
    assert res.returncode == 2, res.stderr
    assert "ended FAILED (exit code 2)" in res.stderr
    assert "--force" not in res.stderr and "place it anyway" not in res.stderr, res.stderr


def test_a_full_laptop_disk_where_the_model_lands_is_74_naming_it_and_fetch_places_it_later(cli, tmp_path):
    """Before: `internal error: OSError: [Errno 28]` (exit 1). Now 74 naming the file and the free space,
    the hint a fetch (never the train again), the verified model kept, and nothing half-written placed."""
    public = tmp_path / "p" / "web" / "public"
    public.mkdir(parents=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(public)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("no tmpfs of the test's own: mounting needs root (make test runs as root in CI)")
    try:
        proj = git_init(tmp_path / "p")
        for name, text in fake_files().items():
            (proj / name).parent.mkdir(parents=True, exist_ok=True)
            (proj / name).write_text(text)
        (proj / "thrust.yaml").write_text("jobs:\n" + FAKE_JOB)
        commit(proj, "a project whose web/public is full")
        fill = _fill(public)
        res = cli("train", "fake", "--host", "local", *FAKE_FAST, cwd=proj)
        assert res.returncode == ExitCode.TRANSFER, res.stderr
        run_id = re.search(r"launching run (\S+)", res.stderr).group(1)
        assert re.search(r"no space left on this machine's disk writing \S*web/public/\S+ \(0\.0 MiB free there\)",
                         res.stderr), res.stderr
        assert f"then fetch it: thrust-remote fetch {run_id} --host local" in res.stderr
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr
        assert not (public / "fake.onnx").exists() and not list(public.glob(".*.tmp"))
        assert (proj / ".thrust" / "fetched" / run_id / "model.onnx").stat().st_size > 0  # kept, verified
        fill.unlink()
        fetched = cli("fetch", run_id, "--host", "local", cwd=proj)
        assert fetched.returncode == 0, fetched.stderr
        kept = proj / ".thrust" / "fetched" / run_id / "model.onnx"
        assert (public / "fake.onnx").read_bytes() == kept.read_bytes()
    finally:
        subprocess.run(["umount", "-l", str(public)], capture_output=True)
