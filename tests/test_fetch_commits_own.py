"""An artifacts glob over files the project tracks (docs/architecture.md, "Artifacts"): the run's tree is
a checkout of its commit, so the files it matches that are still the commit's own are not brought back
as the run's, and the fetch says how many it left out; a file the run changed or wrote comes as before.
Over the suite's real sshd."""

from __future__ import annotations

import os
import re
import subprocess

from helpers import EXE, new_project, remote_tempdir

JOBS = """\
jobs:
  logger:
    kind: command
    command: [sh, -c, "echo changed-by-the-run > logs/b.txt && echo new > logs/c.txt"]
    artifacts: ["logs/**"]
"""


def test_files_the_commit_tracks_unchanged_are_left_out_and_said(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "own"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=JOBS, message="tracked logs",
                       files={"logs/a.txt": "tracked, never touched\n", "logs/b.txt": "tracked, the run changes it\n"})
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    trained = subprocess.run([EXE, "train", "logger"], cwd=proj, capture_output=True, text=True, env=env,
                             timeout=300)
    match = re.search(r"launching run (\S+)", trained.stderr)
    assert trained.returncode == 0 and match, trained.stderr
    dest = proj / ".thrust" / "fetched" / match.group(1) / "artifacts"
    got = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert got == ["logs/b.txt", "logs/c.txt"], (got, trained.stderr)
    assert (dest / "logs" / "b.txt").read_text() == "changed-by-the-run\n"
    said = "1 file(s) logs/** matched on sandbox are the commit's own, unchanged"
    assert trained.stderr.count(said) == 1, trained.stderr
    # `fetch` again: the same left out, said again, nothing more fetched
    fetched = cli("fetch", match.group(1), cwd=proj)
    assert fetched.returncode == 0, fetched.stderr
    assert said in fetched.stderr and "2 file(s)" in fetched.stderr, fetched.stderr
    assert not (dest / "logs" / "a.txt").exists()
