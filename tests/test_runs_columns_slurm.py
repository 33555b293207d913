"""`runs` of a Slurm cluster's runs says what `status` says: a QUEUED run's pending reason and its Slurm
job id, a FAILED run's exit code, a refused sbatch's `[not-submitted]`; and `status RUN` without --host
asks the host the local index recorded, even when the default host is another (issue 53, item 13).
Against the suite's real cluster (tests/slurm_cluster.py), as tests/test_slurm.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import slurm_cluster
from helpers import new_project, remote_tempdir, wait_until
from slurm_cluster import GATED, launched_run, next_poll, run_status

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_slurm")]

slurm_cluster.skip_unless_runnable()


cluster = slurm_cluster.cluster_fixture("thrust-slurm-cols-", gpus=2)
login = slurm_cluster.login_fixture()


@pytest.fixture(scope="module")
def hpc(login, cluster, tmp_path_factory) -> tuple[Path, Path]:
    """A project with two hosts: `box` (the default, a plain SSH box) and `sandbox`, the cluster."""
    workdir = remote_tempdir(login) / "hpc"
    jobs = (f"jobs:\n  gated:\n    {GATED}\n  three:\n    command: [sh, -c, 'exit 3']\n")
    proj = new_project(tmp_path_factory.mktemp("slurm") / "project", login, workdir, jobs=jobs)
    text = (proj / "thrust.yaml").read_text()
    box = text.split("hosts:\n", 1)[1].split("jobs:\n", 1)[0].replace("  sandbox:\n", "  box:\n", 1)
    box = box.replace(f"workdir: {workdir}", f"workdir: {workdir}-box")
    text = text.replace("    connect_timeout: 5\n", f"    connect_timeout: 5\n{slurm_cluster.slurm_keys(cluster)}", 1)
    text = text.replace("default_host: sandbox", "default_host: box").replace("jobs:\n", box + "jobs:\n", 1)
    (proj / "thrust.yaml").write_text(text)
    return proj, workdir


def _line(listing: str, run_id: str) -> str:
    return next(line for line in listing.splitlines() if run_id in line)


def test_runs_says_why_a_run_waits_or_failed_and_status_finds_its_host_in_the_index(cli, hpc):
    proj, workdir = hpc
    on = ("--host", "sandbox")
    first = launched_run(cli("train", "gated", "--detach", *on, cwd=proj).stderr)
    second = launched_run(cli("train", "gated", "--detach", *on, cwd=proj).stderr)

    def pending() -> dict | None:
        next_poll(workdir)
        st = run_status(cli, proj, second)
        return st if st["reason"] in ("Resources", "Priority") else None

    queued = wait_until(pending, 30, "the second run's pending reason", interval=0.5)
    # `status` without --host: the index's host (the cluster), not the default host `box`
    said = cli("status", second, cwd=proj)
    assert said.returncode == 0 and "QUEUED" in said.stdout, said.stdout + said.stderr
    listed = cli("runs", *on, cwd=proj).stdout
    row = _line(listed, second)
    # its pending reason and Slurm's job id, in a column of the cluster's own
    assert f"QUEUED [{queued['reason']}]" in row, listed
    assert "slurm_job" in listed.splitlines()[0] and f" {queued['scheduler_job']} " in row, listed
    everywhere = cli("runs", "--all", cwd=proj).stdout
    assert f" {queued['scheduler_job']} " in _line(everywhere, second), everywhere
    # a refused sbatch: FAILED [not-submitted]
    bad = proj.parent / "bad.yaml"
    bad.write_text((proj / "thrust.yaml").read_text().replace("sbatch: {cpus-per-task: 2}",
                                                              "sbatch: {cpus-per-task: 2, constraint: nosuchfeature}"))
    refused = cli("--config", str(bad), "train", "three", "--detach", *on, cwd=proj)
    assert refused.returncode == 69, refused.stdout + refused.stderr
    never = launched_run(refused.stderr)
    assert "FAILED [not-submitted]" in _line(cli("runs", *on, cwd=proj).stdout, never)
    # not in the local index (its launch failed), on the cluster, not on the default host `box`: found there
    said = cli("status", never, cwd=proj)
    assert said.returncode == 0 and "FAILED [not-submitted]" in said.stdout, said.stdout + said.stderr
    assert "Traceback" not in said.stderr
    # a job that exits 3: FAILED with its code
    for run_id in (first, second):
        assert cli("stop", run_id, cwd=proj).returncode == 0
    failed = launched_run(cli("train", "three", "--detach", *on, cwd=proj).stderr)
    assert cli("wait", failed, "--timeout", "60", cwd=proj).returncode != 0
    listed = cli("runs", *on, cwd=proj).stdout
    assert re.search(r"\bFAILED +3 ", _line(listed, failed)), listed
