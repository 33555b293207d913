"""A partition the cluster does not have is refused before the sync, the venv and `setup:` (issue 53,
item 8): the error and its hint name the partitions there are. Against the suite's real cluster
(tests/slurm_cluster.py) and its login node."""

from __future__ import annotations

import pytest
import slurm_cluster
from helpers import new_project, remote_tempdir

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_slurm")]

slurm_cluster.skip_unless_runnable()

cluster = slurm_cluster.cluster_fixture("thrust-slurm-partition-")
login = slurm_cluster.login_fixture()

JOBS = ("jobs:\n  prepared:\n    command: [sh, -c, 'cat made']\n"
        "    setup: [sh, -c, 'echo made > made; touch \"$HOME/setup-ran\"']\n")


def test_a_partition_the_cluster_lacks_is_refused_before_anything_is_sent(cli, login, cluster, tmp_path):
    workdir = remote_tempdir(login) / "hpc"
    proj = new_project(tmp_path / "project", login, workdir, jobs=JOBS)
    cfg = proj / "thrust.yaml"
    keys = slurm_cluster.slurm_keys(cluster).replace(f"partition: {cluster.partition}", "partition: gpu-a100")
    cfg.write_text(cfg.read_text().replace("    connect_timeout: 5\n", f"    connect_timeout: 5\n{keys}", 1))
    done = cli("train", "prepared", cwd=proj)
    assert done.returncode == 78, done.stderr
    assert "hosts.sandbox.partition: sandbox has no partition 'gpu-a100'" in done.stderr, done.stderr
    hint = done.stderr.split("hint:", 1)[-1]
    assert f"one of them ({cluster.partition})" in hint, done.stderr
    assert "syncing" not in done.stderr.lower() and "setup" not in done.stderr, done.stderr
    assert not (workdir / ".thrust" / "trees").exists()  # nothing synced, no tree, no setup
    # the partition it names works as printed
    cfg.write_text(cfg.read_text().replace("partition: gpu-a100", f"partition: {cluster.partition}"))
    again = cli("train", "prepared", cwd=proj)
    assert again.returncode == 0, again.stderr
