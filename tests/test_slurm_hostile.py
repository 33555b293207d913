"""A Slurm cluster as a host when things go wrong (issue 51): a job's env left behind by a run that
never started, a run the cluster can never start, sbatch options that slip past the own-options check
(sbatch takes any unique prefix of a long option), and a cancel or a stop the tool did not finish.

Against a real cluster of its own (tests/slurm_cluster.py: one node on loopback, 2 CPUs), started by this
module: it stops the cluster's authentication for one login (a second sshd whose SLURM_CONF points the
clients at a munge socket nobody serves), which must not disturb test_slurm.py's cluster. The config
checks need no cluster and are core.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import slurm_cluster
from conftest import _start_sshd
from helpers import EXE, new_project, remote_tempdir, wait_until
from slurm_cluster import GATED, launched_run, next_poll, run_status

from thrust_remote.core.config import parse_config_text
from thrust_remote.core.errors import ConfigError

BASE = """default_host: hpc
hosts:
  hpc:
    address: me@login
    scheduler: slurm
    sbatch: {SBATCH}
jobs:
  j:
    command: [echo, hi]
"""


@pytest.mark.parametrize(("sbatch", "full"), [
    ("{outp: /tmp/elsewhere.out}", "--output"),  # moved the job's output
    ("{chd: /tmp}", "--chdir"),  # the job's working directory
    ("{requ: true}", "--requeue"),  # a requeued job runs again over the same run dir
    ("{arr: 0-2}", "--array"),  # three copies in one run dir
    ("{job-n: other}", "--job-name"),  # renamed: not thrust-RUN_ID
    ("{nod: 2}", "--nodes"),
    ("{test-only: true}", "--test-only"),  # submits nothing: the run would wait for a job that is not there
    ("{test: true}", "--test-only"),
    ("{help: true}", "--help"),  # prints its help, submits nothing
    ("{uid: nobody}", "--uid"),  # a job of another account, which cannot read the run dir
    ("{clusters: other}", "--clusters"),  # a job this cluster's squeue never shows
])
def test_an_sbatch_option_slurm_would_read_as_one_of_its_own_or_that_breaks_one_run_one_job_is_refused(
        tmp_path, sbatch, full):
    with pytest.raises(ConfigError) as exc:
        parse_config_text(BASE.replace("{SBATCH}", sbatch), tmp_path / "thrust.yaml")
    key = sbatch.strip("{}").split(":")[0]
    assert f"thrust.yaml:6: hosts.hpc.sbatch.{key}:" in exc.value.message, exc.value.message
    assert full in exc.value.message, exc.value.message  # the option sbatch would take it for, in full
    assert exc.value.hint


def test_options_that_only_begin_like_one_of_ours_pass_through(tmp_path):
    config = parse_config_text(BASE.replace("{SBATCH}", "{wait-all-nodes: 1, time-min: '5', export-file: f, "
                                                        "gpus-per-task: 1, qos: normal}"), tmp_path / "thrust.yaml")
    slurm = config.hosts["hpc"].slurm
    assert slurm is not None and [name for name, _ in slurm.sbatch] == [
        "wait-all-nodes", "time-min", "export-file", "gpus-per-task", "qos"]


# ------------------------------------------------------------------------------------------ on the cluster

cluster = slurm_cluster.cluster_fixture("thrust-slurm-hostile-")
login = slurm_cluster.login_fixture()


@pytest.fixture(scope="module")
def broken_login(cluster, tmp_path_factory):
    """The same login node with Slurm's authentication down: its clients' munge socket is served by
    nobody (what a stopped munged on a login node looks like to sbatch, squeue and scancel)."""
    root = tmp_path_factory.mktemp("broken-login")
    conf = root / "slurm.conf"
    text = cluster.conf.read_text()
    conf.write_text(re.sub(r"AuthInfo=socket=\S+", f"AuthInfo=socket={root / 'no-munge.socket'}", text))
    server = _start_sshd(root / "sshd", extra_config=f"SetEnv SLURM_CONF={conf}\n")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def hpc(login, broken_login, cluster, tmp_path_factory) -> tuple[Path, Path]:
    """A project whose host `sandbox` is the cluster and `broken` the same login node with munge down."""
    workdir = remote_tempdir(login) / "hpc"
    proj = new_project(tmp_path_factory.mktemp("slurm-hostile") / "project", login, workdir,
                       files={"tiny.py": "print('tiny ran')\n"},
                       jobs=f"jobs:\n  gated:\n    {GATED}\n    env: {{THRUST_TEST_SECRET: {SECRET}}}\n"
                            "  tiny:\n    script: tiny.py\n")
    slurm_keys = slurm_cluster.slurm_keys(cluster)
    text = (proj / "thrust.yaml").read_text()
    text = text.replace("    connect_timeout: 5\n", f"    connect_timeout: 5\n{slurm_keys}")
    bad = broken_login.host_config("broken", workdir=str(workdir))
    text = text.replace("jobs:\n", (f"  broken:\n    address: {bad.address}\n    workdir: {bad.workdir}\n"
                                    f"    python: {bad.python}\n    identity: {bad.identity}\n"
                                    f"    known_hosts: {bad.known_hosts}\n{slurm_keys}jobs:\n"), 1)
    (proj / "thrust.yaml").write_text(text)
    return proj, workdir


SECRET = "s3cr3t-value-51"


@pytest.fixture
def project(hpc, cluster):
    """The project, and after the test an empty queue: a test that failed midway leaves no job holding the
    node (each run asks for both its CPUs) for the next one."""
    yield hpc
    cluster.run("scancel", f"--user={slurm_cluster._user()}", check=False)
    wait_until(lambda: not cluster.run("squeue", "--noheader", "--states=PENDING,RUNNING,COMPLETING",
                                       check=False).stdout.strip(), 30, "the queue to empty")


def _runs(workdir: Path) -> Path:
    return workdir / ".thrust" / "runs"


def _job_id(workdir: Path, run_id: str) -> str:
    return json.loads((_runs(workdir) / run_id / "run.json").read_text())["scheduler"]["job_id"]


def _new_run(workdir: Path, before: set[str]) -> str:
    (run_id,) = {p.name for p in _runs(workdir).iterdir()} - before
    return run_id


def _ended(cli, proj: Path, workdir: Path, run_id: str, timeout: float = 30) -> dict:
    def seen() -> dict | None:
        next_poll(workdir)
        st = run_status(cli, proj, run_id)
        return st if st["state"] not in ("QUEUED", "RUNNING") else None

    return wait_until(seen, timeout, f"run {run_id}'s end", interval=0.5)


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_a_run_sbatch_refuses_or_cannot_reach_slurm_for_leaves_no_env_behind(cli, project, cluster):
    proj, workdir = project
    _runs(workdir).mkdir(parents=True, exist_ok=True)
    # sbatch refuses (a feature no node has; a partition the cluster lacks is refused before the sync)
    bad = proj.parent / "nosuch.yaml"
    text = (proj / "thrust.yaml").read_text()
    bad.write_text(text.replace("sbatch: {cpus-per-task: 2}", "sbatch: {cpus-per-task: 2, constraint: nosuchfeature}",
                                1))
    before = {p.name for p in _runs(workdir).iterdir()}
    refused = cli("--config", str(bad), "train", "gated", "--detach", cwd=proj)
    assert refused.returncode == 69, refused.stdout + refused.stderr
    run_dir = _runs(workdir) / _new_run(workdir, before)
    assert (run_dir / "exit_code").exists() and not (run_dir / ".env.json").exists()
    # Slurm cannot authenticate (munge down on the login node): said before anything is sent, no run made
    before = {p.name for p in _runs(workdir).iterdir()}
    failed = cli("train", "gated", "--host", "broken", "--detach", cwd=proj)
    assert failed.returncode == 69, failed.stdout + failed.stderr
    assert "munge" in failed.stderr.lower(), failed.stderr
    assert {p.name for p in _runs(workdir).iterdir()} == before
    assert not list(_runs(workdir).glob("*/.env.json"))  # nor in any other run dir: none is live


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_sbatch_that_submits_nothing_ends_the_run_at_once_with_no_env_behind(project, cluster, monkeypatch):
    """`--test-only` (refused in thrust.yaml) reaching sbatch anyway: sbatch exits 0 and prints no job id.
    The run has no job to wait for: it ends never started, not `running, no metrics yet` then LOST."""
    from thrust_remote.agent import slurm

    _proj, workdir = project
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    run_dir = _runs(workdir) / "test-only-run"
    run_dir.mkdir(mode=0o700, parents=True)
    answer = slurm.submit(str(run_dir), str(workdir), ["--test-only", f"--partition={cluster.partition}"],
                          {"THRUST_TEST_SECRET": SECRET}, {"run_id": "test-only-run"})
    assert answer.get("error") == "sbatch" and "job id" in answer.get("detail", ""), answer
    assert json.loads((run_dir / "exit_code").read_text())["never_started"] is True
    assert not (run_dir / ".env.json").exists()


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_a_run_that_ends_while_pending_leaves_no_env_behind(cli, project, cluster):
    proj, workdir = project
    first = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    second = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    third = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    wait_until(lambda: "started on" in cli("logs", first, cwd=proj).stdout, 30, "the first run to start")
    for run_id in (second, third):
        env_file = _runs(workdir) / run_id / ".env.json"
        assert env_file.exists() and env_file.stat().st_mode & 0o077 == 0  # it waits for its job, the owner's alone
    # stopped while pending: scancel; it never starts, and its env goes at once
    assert cli("stop", second, cwd=proj).returncode == 0
    assert run_status(cli, proj, second)["state"] == "STOPPED"
    assert not (_runs(workdir) / second / ".env.json").exists()
    # cancelled by hand while pending (the user's own scancel): the first status that sees it ended removes it
    cluster.run("scancel", _job_id(workdir, third))
    st = _ended(cli, proj, workdir, third)
    assert (st["state"], st["reason"]) == ("STOPPED", "cancelled"), st
    assert not (_runs(workdir) / third / ".env.json").exists()
    (_runs(workdir) / first / "go").touch()
    assert _ended(cli, proj, workdir, first)["state"] == "FINISHED"
    assert not (_runs(workdir) / first / ".env.json").exists()


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_a_run_the_cluster_can_never_start_fails_with_slurms_reason_and_is_cancelled(cli, project, cluster):
    """`--nodes 5` on a one-node partition: Slurm keeps the job PENDING (PartitionConfig) for ever. The
    followed `train` ends FAILED within a poll or two, saying why, and the job is gone from the queue."""
    proj, workdir = project
    done = cli("train", "tiny", "--nodes", "5", cwd=proj, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode != 0, said
    assert "FAILED" in said and "cannot start" in said and "PartitionConfig" in said, said
    assert "5 nodes" in said and "debug has 1" in said, said  # the request against what the partition has
    run_id = launched_run(done.stderr)
    st = run_status(cli, proj, run_id)
    assert (st["state"], st["reason"], st["started_at"]) == ("FAILED", "cannot-start", None), st
    assert "PartitionConfig" in st["reason_detail"]
    shown = cli("status", run_id, cwd=proj).stdout
    assert "FAILED" in shown and "PartitionConfig" in shown, shown
    job = _job_id(workdir, run_id)
    pending = cluster.run("squeue", "--noheader", "--states=PENDING", "--format=%i").stdout.split()
    assert job not in pending  # cancelled: it holds no place in the queue
    assert not (_runs(workdir) / run_id / ".env.json").exists()


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_a_followed_run_waiting_for_the_node_says_why_in_its_log(cli, project, cluster, tmp_path):
    proj, workdir = project
    first = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    wait_until(lambda: "started on" in cli("logs", first, cwd=proj).stdout, 30, "the first run to start")
    out = tmp_path / "train.out"
    with out.open("w") as fh:
        train = subprocess.Popen([EXE, "train", "gated"], cwd=proj, stdout=fh, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
    try:
        wait_until(lambda: re.search(r"waiting in Slurm's queue: (Resources|Priority)", out.read_text()), 60,
                   "the pending reason in the followed log")
        second = launched_run(out.read_text())
        (_runs(workdir) / first / "go").touch()
        wait_until(lambda: "started on" in out.read_text(), 60, "the second run to start")
        (_runs(workdir) / second / "go").touch()
        train.wait(timeout=120)
    finally:
        train.kill()
        train.wait()
    assert train.returncode == 0, out.read_text()


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_a_followed_run_cancelled_by_hand_ends_stopped_in_train_too(cli, project, cluster, tmp_path):
    proj, workdir = project
    out = tmp_path / "train.out"
    with out.open("w") as fh:
        train = subprocess.Popen([EXE, "train", "gated"], cwd=proj, stdout=fh, stderr=subprocess.STDOUT, text=True,
                                 start_new_session=True)
    try:
        wait_until(lambda: "started on" in out.read_text(), 60, "the run to start")
        run_id = launched_run(out.read_text())
        cluster.run("scancel", _job_id(workdir, run_id))  # the user's own scancel, not thrust-remote stop
        train.wait(timeout=60)
    finally:
        train.kill()
        train.wait()
    told = out.read_text()
    assert f"run {run_id} ended STOPPED" in told and "FAILED" not in told, told
    st = run_status(cli, proj, run_id)
    assert (st["state"], st["reason"]) == ("STOPPED", "cancelled"), st


@pytest.mark.e2e
@pytest.mark.xdist_group("test_slurm_hostile")
def test_a_stop_that_could_not_reach_slurm_never_relabels_the_runs_end(cli, project, cluster):
    proj, workdir = project
    run_id = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    wait_until(lambda: "started on" in cli("logs", run_id, cwd=proj).stdout, 30, "the run to start")
    failed = cli("stop", run_id, "--host", "broken", cwd=proj)  # scancel cannot authenticate: nothing stopped
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert not (_runs(workdir) / run_id / "stopped").exists()
    (_runs(workdir) / run_id / "go").touch()  # the run goes on and ends well by itself
    st = _ended(cli, proj, workdir, run_id)
    assert (st["state"], st["exit_code"]) == ("FINISHED", 0), st


def test_the_jobs_env_is_never_written_through_a_link_nor_into_an_open_file(tmp_path, monkeypatch):
    """`.env.json` made new (0600) and renamed over its name: a link left there (to a world-readable file)
    is replaced, never written through, and the secret is nowhere but in the run dir until the run ends
    (here at once: no sbatch on PATH, the run never starts, and its env goes with it)."""
    from thrust_remote.agent import slurm

    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    open_file = tmp_path / "open.txt"
    open_file.write_text("nothing\n")
    open_file.chmod(0o644)
    (run_dir / ".env.json").symlink_to(open_file)
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    answer = slurm.submit(str(run_dir), str(tmp_path), [], {"THRUST_TEST_SECRET": SECRET}, {"run_id": "run"})
    assert answer.get("error") == "sbatch", answer
    assert open_file.read_text() == "nothing\n" and not (run_dir / ".env.json").exists()
    assert SECRET not in "".join(p.read_text() for p in run_dir.iterdir() if p.is_file())
