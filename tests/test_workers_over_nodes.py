"""A job that starts its own workers (`workers:`) runs once on one host: over several hosts, or over
`--nodes` of a cluster, it is refused (64) by the request's check, before anything connects or is
synced, not at launch after every node's sync (issue 53 item 2). Over a real sshd."""

from __future__ import annotations

from pathlib import Path

from helpers import commit, git_init, remote_tempdir

from thrust_remote.core.errors import ExitCode

SPAWN_PY = '''\
import argparse

import torch.multiprocessing as mp


def worker(rank):
    pass


parser = argparse.ArgumentParser()
parser.add_argument("--num-gpus", type=int, default=1)
mp.spawn(worker, nprocs=parser.parse_args().num_gpus)
'''

JOBS = "jobs:\n  spawner:\n    script: spawn.py\n    workers: {count: --num-gpus}\n"


def _project(sshd, tmp_path: Path, hosts_extra: str) -> tuple[Path, Path]:  # noqa: ANN001 - the sshd fixture
    """(project, the sandbox's workdir): spawn.py as a `workers:` job, the sandbox and `hosts_extra`."""
    workdir = remote_tempdir(sshd) / "own-workers"
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "spawn.py").write_text(SPAWN_PY)
    sshd.thrust_yaml(proj / "thrust.yaml", workdir=str(workdir), hosts_extra=hosts_extra, rest=JOBS)
    git_init(proj)
    commit(proj, "a script that starts its own workers")
    return proj, workdir


def test_over_several_hosts_it_is_refused_before_anything_is_sent(cli, sshd, tmp_path):
    hc = sshd.host_config()
    twin_dir = remote_tempdir(sshd) / "own-workers-twin"
    twin = (f"  twin:\n    address: {hc.address}\n    workdir: {twin_dir}\n    python: {hc.python}\n"
            f"    identity: {hc.identity}\n    known_hosts: {hc.known_hosts}\n")
    proj, workdir = _project(sshd, tmp_path, twin)
    done = cli("train", "spawner", "--host", "sandbox", "--host", "twin", "--no-fetch", cwd=proj)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "job 'spawner' starts its own workers (workers:)" in done.stderr, done.stderr
    assert "give one --host; --nproc N there passes N by the job's --num-gpus" in done.stderr, done.stderr
    assert "syncing" not in done.stderr.lower() and "Traceback" not in done.stderr, done.stderr
    assert not workdir.exists() and not twin_dir.exists()  # nothing was sent to either host


def test_over_a_clusters_nodes_it_is_refused_before_anything_is_sent(cli, sshd, tmp_path):
    # the Slurm backend's own check refuses it before any connection: the sandbox need not be a cluster
    proj, workdir = _project(sshd, tmp_path, "    scheduler: slurm\n    partition: debug\n")
    done = cli("train", "spawner", "--nodes", "2", "--no-fetch", cwd=proj)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "--nodes 2: job 'spawner' starts its own workers (workers:)" in done.stderr, done.stderr
    assert "drop --nodes; --nproc N passes N by the job's --num-gpus" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert not workdir.exists()
