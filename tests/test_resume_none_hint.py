"""`resume` of a run that left no checkpoint (it died at import), over the suite's sshd: the host answered
and has none, so the hint is the train command again, which runs as printed; never a `fetch`, which
exits 0 and brings nothing (found trying nanoGPT as a new user, issue 53)."""

from __future__ import annotations

import re
import shlex

from helpers import new_project, remote_tempdir

WIDE = {"COLUMNS": "1000"}  # one hint on one line, as a terminal this wide shows it

JOBS = """\
jobs:
  broken:
    script: broken.py
    checkpoints: out/ckpt-*.pt
    resume: ["--resume_from={checkpoint}"]
"""

FILES = {"broken.py": "import argparse\nimport no_such_module_here  # noqa\n"}


def test_resume_without_any_checkpoint_names_the_train_command_that_runs(cli, sshd, tmp_path):
    proj = new_project(tmp_path / "project", sshd, remote_tempdir(sshd) / "w", files=FILES, jobs=JOBS)
    died = cli("train", "broken", "--set", "seed=3", cwd=proj, env=WIDE)
    assert died.returncode == 1, died.stderr
    run_id = re.search(r"launching run (\S+)", died.stderr).group(1)

    refused = cli("resume", run_id, cwd=proj, env=WIDE)
    assert refused.returncode == 64, refused.stderr
    assert "thrust-remote fetch" not in refused.stderr, refused.stderr
    assert "run it again: " in refused.stderr, refused.stderr
    hint = shlex.split(refused.stderr.split("run it again: ", 1)[1].splitlines()[0])
    assert hint[:2] == ["thrust-remote", "train"] and hint[2:5] == ["broken", "--set", "seed=3"], hint

    again = cli(*hint[1:], cwd=proj, env=WIDE)
    # the command runs: a new run is launched and ends as the job does (its import error), not refused (64)
    assert again.returncode == 1 and "launching run" in again.stderr, again.stderr
    assert "No module named 'no_such_module_here'" in again.stdout + again.stderr
