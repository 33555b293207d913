"""A cluster's login node whose Slurm is reachable only through the login environment (issue 53, item 7):
the account's shell is /bin/sh and its plain `sh -c` (what sshd runs a command with) has neither Slurm's
commands on PATH nor SLURM_CONF; `~/.profile` loads them, as `module load slurm` does on real clusters
(tests/slurm_cluster.py, LoginNode). A host's `login_shell: true` runs thrust-remote's commands there in
that environment; doctor without it names that key, and does not blame account: or partition: for it.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import slurm_cluster
from slurm_cluster import launched_run, run_status

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_slurm")]

slurm_cluster.skip_unless_runnable()

cluster = slurm_cluster.cluster_fixture("thrust-slurm-login-")
login_node = slurm_cluster.login_node_fixture()

JOBS = "jobs:\n  hello:\n    command: [sh, -c, 'echo hello from the login environment; command -v sbatch']\n"


def _rows(done: subprocess.CompletedProcess) -> dict[str, dict]:
    return {c["id"]: c for c in json.loads(done.stdout)["checks"]}


def test_the_login_node_has_slurm_only_in_its_login_environment(cli, login_node, tmp_path):
    """The fixture is what it says, over its sshd: no Slurm in the account's plain `sh -c`; with
    login_shell: true, every command (exec's too) runs where Slurm is."""
    for login_shell, found in ((False, False), (True, True)):
        proj = login_node.project(tmp_path / f"project-{login_shell}", JOBS, login_shell=login_shell)
        done = cli("exec", "--", "sh", "-c", 'command -v sinfo && echo "conf=$SLURM_CONF"', cwd=proj)
        assert done.returncode == (0 if found else 127), (login_shell, done.stdout, done.stderr)
        assert ("conf=/" in done.stdout) == found, done.stdout


def test_doctor_without_login_shell_names_the_key_and_blames_neither_account_nor_partition(cli, login_node, tmp_path):
    proj = login_node.project(tmp_path / "project", JOBS, login_shell=False)
    done = cli("doctor", "--json", cwd=proj)
    rows = _rows(done)
    commands = rows["slurm-commands"]
    assert commands["status"] == "fail" and "login shell" in commands["detail"], commands
    assert "`login_shell: true` under hosts.sandbox in thrust.yaml" in commands["fix"], commands
    assert rows["slurm-submit"]["status"] == "skip" and "Slurm's commands" in rows["slurm-submit"]["detail"]
    assert rows["slurm-node"]["status"] == "skip"
    assert not any("account:" in (r.get("fix") or "") for r in rows.values()), rows
    assert done.returncode != 0
    # a train says the same before anything is sent (not sbatch's "not found" after the sync and setup)
    train = cli("train", "hello", cwd=proj)
    assert train.returncode == 69 and "`login_shell: true` under hosts.sandbox" in train.stderr, train.stderr
    assert "syncing" not in train.stderr and not (login_node.home / "thrust" / ".thrust" / "trees").exists()


def test_with_login_shell_doctor_is_ok_and_a_train_finishes(cli, login_node, tmp_path):
    proj = login_node.project(tmp_path / "project", JOBS, login_shell=True)
    rows = _rows(cli("doctor", "--json", cwd=proj))
    assert "slurm-commands" not in rows, rows
    for cid in ("slurm-partition", "slurm-submit", "slurm-shared"):
        assert rows[cid]["status"] == "ok", (cid, rows[cid])
    started = cli("train", "hello", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    run_id = launched_run(started.stderr)
    done = cli("wait", run_id, "--timeout", "120", cwd=proj)
    assert done.returncode == 0, done.stdout + done.stderr
    st = run_status(cli, proj, run_id)
    assert st["state"] == "FINISHED" and st["scheduler_job"], st
    log = cli("logs", run_id, cwd=proj)
    assert "hello from the login environment" in log.stdout and "slurm/bin/sbatch" in log.stdout, log.stdout
