"""`tensorboard RUN` of a run whose artifacts were never fetched, under `--config other.yaml` (a host
thrust.yaml does not define): its hint to fetch the run first, followed as printed, fetches it, and
tensorboard then finds what came (issue 53, every hint names a command that works as printed)."""

from __future__ import annotations

import json
import re
import shlex

from helpers import new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode

JOBS = """\
jobs:
  board:
    kind: command
    command: [sh, -c, 'mkdir -p tb && echo events > tb/events.out']
    artifacts: [tb/**]
    metrics: {tensorboard: tb}
"""


def test_the_fetch_hint_of_an_unfetched_run_works_under_another_config(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "proj", sshd, workdir, jobs=JOBS)  # thrust.yaml: host sandbox only
    other = sshd.thrust_yaml(proj / "other.yaml", workdir=str(workdir), rest=JOBS, name="gpubox")
    ran = cli("--config", str(other), "train", "board", "--no-fetch", "--json", cwd=proj)
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]

    board = cli("--config", str(other), "tensorboard", run_id, cwd=proj, env={"COLUMNS": "1000"})
    assert board.returncode == ExitCode.USAGE, (board.stdout, board.stderr)
    hint = re.search(r"fetch them with: (thrust-remote [^,]+),", board.stderr)
    assert hint, board.stderr
    words = shlex.split(hint.group(1))
    followed = cli(*words[1:], cwd=proj)
    assert followed.returncode == 0, (hint.group(1), followed.stdout, followed.stderr)
    assert (proj / ".thrust" / "fetched" / run_id / "artifacts" / "tb" / "events.out").read_text() == "events\n"
