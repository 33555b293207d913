"""A cluster run that continues itself at its time limit, for a job that reads its checkpoint at a fixed
place of its tree (`resume: {checkpoint_at: out/ckpt.txt}`) and writes its checkpoints elsewhere
(`$THRUST_RUN_DIR/ckpt-N.txt`): its next attempt finds the newest one at that place, put there as
`resume` puts it (issue 53 item 4), against a real Slurm cluster (tests/slurm_cluster.py) with no laptop
following."""

from __future__ import annotations

import re

import pytest
import slurm_cluster
from helpers import commit, new_project, remote_tempdir, wait_until
from slurm_cluster import launched_run, run_status

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_slurm_checkpoint_at")]

slurm_cluster.skip_unless_runnable()

cluster = slurm_cluster.cluster_fixture("thrust-slurm-at-", gpus=0)
login = slurm_cluster.login_fixture()

# Continued, it reads out/ckpt.txt; a continuation that finds none there fails at once (3), never loops
JOB_SH = """\
#!/bin/sh
if [ -f out/ckpt.txt ]; then echo "resumed from step $(cat out/ckpt.txt)"; exit 0; fi
if [ -d "$THRUST_RUN_DIR/resume" ]; then echo "no checkpoint at out/ckpt.txt"; exit 3; fi
step=0
trap 'echo $step > "$THRUST_RUN_DIR/ckpt-$step.txt"; echo "checkpoint at step $step"; exit 143' TERM
while :; do step=$((step+1)); echo "step $step"; sleep 0.1; done
"""

JOBS = """\
jobs:
  own:
    command: [sh, job.sh]
    checkpoints: $THRUST_RUN_DIR/ckpt-*.txt
    resume: {checkpoint_at: out/ckpt.txt}
    retry: {max: 1, on: [timeout]}
"""


def test_a_run_continuing_itself_finds_its_checkpoint_where_the_job_reads_it(cli, cluster, login, tmp_path):
    workdir = remote_tempdir(login) / "hpc"
    proj = new_project(tmp_path / "proj", login, workdir, jobs=JOBS, files={"job.sh": JOB_SH})
    text = (proj / "thrust.yaml").read_text()
    (proj / "thrust.yaml").write_text(text.replace("    connect_timeout: 5\n",
                                                   f"    connect_timeout: 5\n{slurm_cluster.slurm_keys(cluster)}"))
    commit(proj, "the cluster", "thrust.yaml")
    started = cli("train", "own", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    first = launched_run(started.stderr)
    runs = workdir / ".thrust" / "runs"
    log = runs / first / "log"
    wait_until(lambda: log.exists() and "step 3" in log.read_text(), 60, "the job's steps")
    job = run_status(cli, proj, first)["scheduler_job"]
    cluster.run("scancel", "--signal=USR1", "--batch", job)  # Slurm's warning before the time limit, now
    st = wait_until(lambda: (s := run_status(cli, proj, first))["state"] != "RUNNING" and s, 60, "its end")
    assert (st["state"], st["reason"]) == ("FAILED", "timeout"), st
    second = st["continued_by"][0]["run_id"]
    done = cli("wait", second, "--timeout", "90", cwd=proj)
    resumed = (runs / second / "log").read_text()
    assert done.returncode == 0, (done.stdout, done.stderr, resumed)
    step = re.search(r"checkpoint at step (\d+)", log.read_text()).group(1)
    assert f"resumed from step {step}" in resumed, resumed
