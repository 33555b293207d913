"""What the laptop says when the host refuses a path of the run's tree behind a symlink of the commit
(docs/architecture.md, "Trees"; agent/trees.py `_blocked`, run/data.py `_refusal`), over a real sshd
through `train`: the thrust.yaml line that asked for the path (a job's `shared:`, the top level's
`files:`), the link and where it leads (said to be outside the run's tree when it is), that nothing is
ever written through a link, a hint naming a real directory, exit 78, no traceback."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import commit, new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode

SHARED = """\
jobs:
  quick:
    kind: command
    command: [sh, -c, 'true']
    shared: [data/cache]
"""
FILES = """\
files: [data/weights.bin]
jobs:
  quick:
    kind: command
    command: [sh, -c, 'cat data/weights.bin > "$THRUST_RUN_DIR/seen"']
"""


def _line(proj: Path, text: str) -> int:
    return next(n for n, line in enumerate((proj / "thrust.yaml").read_text().splitlines(), 1) if text in line)


def test_a_jobs_shared_path_behind_a_link_of_the_commit_names_its_line_and_the_link(cli, sshd, tmp_path):
    datasets = remote_tempdir(sshd, "datasets-")  # a directory of the host's, outside any tree
    (datasets / "cache").mkdir()
    proj = new_project(tmp_path / "project", sshd, remote_tempdir(sshd) / "w", jobs=SHARED)
    os.symlink(datasets, proj / "data")
    commit(proj, "data is a link", "data")
    res = cli("train", "quick", cwd=proj)
    assert res.returncode == ExitCode.CONFIG, res.stderr
    line = _line(proj, "shared:")
    assert f"thrust.yaml:{line}: jobs.quick.shared: data/cache is behind data (a symlink of the commit to " \
           f"{datasets}, outside the run's tree): thrust-remote never writes, replaces or removes anything " \
           "through a link" in res.stderr, res.stderr
    assert "name a path that is a real directory of the commit, not under data" in res.stderr
    assert "Traceback" not in res.stderr
    assert sorted(p.name for p in datasets.iterdir()) == ["cache"] and not (datasets / "cache").is_symlink()


def test_a_top_level_files_path_behind_a_link_inside_the_tree_names_its_line_and_the_link(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=FILES,
                       files={"models/README": "weights go here\n", ".gitignore": "models/*.bin\n"})
    os.symlink("models", proj / "data")  # inside the project: the laptop sends data/weights.bin's content
    commit(proj, "data is a link to models", "data")
    (proj / "models" / "weights.bin").write_text("weights\n")
    res = cli("train", "quick", cwd=proj)
    assert res.returncode == ExitCode.CONFIG, res.stderr
    assert f"thrust.yaml:{_line(proj, 'files:')}: files: data/weights.bin is behind data (a symlink of the " \
           "commit to models): thrust-remote never writes, replaces or removes anything through a link" \
           in res.stderr, res.stderr
    assert "outside the run's tree" not in res.stderr
    assert "not under data" in res.stderr and "Traceback" not in res.stderr
    assert not (workdir / ".thrust" / "trees").exists() or not list((workdir / ".thrust" / "trees").iterdir())
