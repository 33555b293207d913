"""Issue 53 item 14 on the real Slurm cluster (tests/slurm_cluster.py): `wait` for a cluster's run that
ends before its first pull says what the pull at its end brought (its artifacts), as an ssh box's does,
and says the run while it goes; a pull of a job without `checkpoints:` never reads "no checkpoint yet"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import slurm_cluster
from helpers import new_project, remote_tempdir

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_follow_quiet_slurm")]

slurm_cluster.skip_unless_runnable()

cluster = slurm_cluster.cluster_fixture("thrust-quiet-", gpus=0)
login = slurm_cluster.login_fixture()

JOBS = """\
jobs:
  made:
    command: [sh, -c, 'mkdir -p out && echo made > out/a.txt && sleep 3 && echo done']
    artifacts: ["out/a.txt"]
"""


@pytest.fixture(scope="module")
def hpc(login, cluster, tmp_path_factory) -> Path:
    workdir = remote_tempdir(login) / "hpc"
    proj = new_project(tmp_path_factory.mktemp("quiet-slurm") / "project", login, workdir, jobs=JOBS)
    text = (proj / "thrust.yaml").read_text()
    text = text.replace("    connect_timeout: 5\n", f"    connect_timeout: 5\n{slurm_cluster.slurm_keys(cluster)}")
    (proj / "thrust.yaml").write_text(text)
    return proj


def test_wait_for_a_cluster_run_says_what_its_end_pull_brought(cli, hpc):
    started = cli("train", "made", "--detach", cwd=hpc)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"launching run (\S+)", started.stdout + started.stderr).group(1)  # type: ignore[union-attr]
    got = cli("wait", run_id, cwd=hpc)
    assert got.returncode == 0, got.stderr
    err = " ".join(got.stderr.split())
    assert re.search(rf"{run_id}: (QUEUED|RUNNING)", err), err  # said while it goes, at once
    assert f"{run_id}: FINISHED" in err and f"{run_id}: artifacts: 1 file(s) in" in err, err
    assert "no checkpoint yet" not in err
