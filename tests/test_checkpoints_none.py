"""A pull that finds no checkpoint says "none on the host yet" only while the run goes on; of an ended
run it says the run wrote none matching the job's glob (issue 53 leftovers, item 6). Real runs over the
`sshd` host."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir, wait_until

pytestmark = pytest.mark.xdist_group("test_checkpoints_none")

# writes no checkpoint; given "gate", waits until a file `go` appears in its cwd (a run still going)
JOB_PY = '''\
import os
import sys
import time

waited = 0.0
while sys.argv[1:] == ["gate"] and not os.path.exists("go") and waited < 300:
    time.sleep(0.1)
    waited += 0.1
print("done, no checkpoint", flush=True)
'''

JOBS = """\
jobs:
  nockpt:
    script: job.py
    checkpoints: out/*.pt
  gated:
    script: job.py
    args: [gate]
    checkpoints: out/*.pt
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "ckpt-none"
    return new_project(tmp_path_factory.mktemp("ckptnone") / "project", sshd, workdir, files={"job.py": JOB_PY},
                       jobs=JOBS, message="a job that writes no checkpoint")


def _run_id(text: str) -> str:
    return re.search(r"run (\S+) started", text).group(1)  # type: ignore[union-attr]


def test_an_ended_run_without_checkpoints_says_it_wrote_none(cli, project):
    got = cli("train", "nockpt", cwd=project)
    assert got.returncode == 0, got.stderr
    err = " ".join(got.stderr.split())
    assert "checkpoints: none (the run wrote none matching out/*.pt)" in err and "yet" not in err, err
    run_id = re.search(r"FINISHED: run (\S+) ", got.stderr).group(1)  # type: ignore[union-attr]
    again = cli("fetch", run_id, cwd=project)
    assert again.returncode == 0, again.stderr
    said = " ".join(again.stderr.split())
    assert "checkpoints: none (the run wrote none matching out/*.pt)" in said and "yet" not in said, said


def test_a_running_runs_fetch_says_none_yet(cli, project):
    started = cli("train", "gated", "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = _run_id(started.stdout)
    wait_until(lambda: json.loads(cli("status", run_id, "--json", cwd=project).stdout).get("state") == "RUNNING",
               60, "the run to start")
    try:
        got = cli("fetch", run_id, cwd=project)
        assert got.returncode == 0, got.stderr
        assert "checkpoints: none on the host yet" in " ".join(got.stderr.split()), got.stderr
    finally:
        cwd = json.loads(cli("status", run_id, "--json", cwd=project).stdout)["cwd"]
        Path(cwd, "go").write_text("go")
        assert cli("wait", run_id, cwd=project).returncode == 0
