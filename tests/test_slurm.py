"""A Slurm cluster as a host (`scheduler: slurm`), against a real one: Debian's slurmctld, slurmd and
munged started by this module (tests/slurm_cluster.py: one node on loopback, 2 CPUs, 2 stand-in GPUs), its login
node a real sshd whose sessions get SLURM_CONF (`SetEnv`), as a cluster's login shell would.

What is checked: `train --detach` submits one `sbatch --parsable` job whose step is the agent's
supervisor, so the run directory holds the usual files and `status`, `logs`, `wait` work unchanged; a run
pending behind another shows Slurm's reason; `stop` is scancel, of a pending and of a running run; a
cancel from outside thrust-remote reads STOPPED with its reason; sbatch's refusal is an error with
Slurm's words; one squeue answer serves every look for 10 s. Jobs are tiny `command:` jobs held by a
file the test writes, never a sleep. A cluster of two nodes: test_slurm_nodes.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import slurm_cluster
from conftest import _start_sshd
from helpers import EXE, commit, new_project, remote_tempdir, wait_until
from slurm_cluster import GATED, launched_run, next_poll, run_status

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_slurm")]

slurm_cluster.skip_unless_runnable()

cluster = slurm_cluster.cluster_fixture("thrust-slurm-", gpus=2, preempt=True)
login = slurm_cluster.login_fixture()


@pytest.fixture(scope="module")
def hpc(login, cluster, tmp_path_factory) -> tuple[Path, Path]:
    """A project whose host `hpc` is the cluster: its thrust.yaml and the workdir on the shared disk."""
    workdir = remote_tempdir(login) / "hpc"
    proj = new_project(tmp_path_factory.mktemp("slurm") / "project", login, workdir,
                       jobs=f"jobs:\n  gated:\n    {GATED}\n  hello:\n    command: [sh, -c, 'echo hello from slurm']\n")
    text = (proj / "thrust.yaml").read_text()
    # the sshd fixture's host, made a Slurm login node; every run asks the whole node (2 CPUs), so a
    # second one waits for the first
    text = text.replace("    connect_timeout: 5\n", f"    connect_timeout: 5\n{slurm_cluster.slurm_keys(cluster)}")
    (proj / "thrust.yaml").write_text(text)
    return proj, workdir


def test_a_run_begun_on_an_ssh_box_resumes_on_the_cluster(cli, hpc, login):
    proj, workdir = hpc
    config = str(_own_config(proj, workdir, login))
    started = cli("--config", config, "train", "own", "--host", "box", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    first = launched_run(started.stderr)
    box_log = workdir / ".thrust" / "runs" / first / "log"
    wait_until(lambda: box_log.exists() and "step 3" in box_log.read_text(), 30, "the run's steps on the box")
    assert cli("--config", config, "stop", first, cwd=proj).returncode == 0  # TERM: it writes its checkpoint
    assert "checkpoint at step" in box_log.read_text()
    moved = cli("--config", config, "resume", first, "--host", "sandbox", cwd=proj)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    second = launched_run(moved.stderr)
    assert "submitted to Slurm on sandbox" in moved.stderr
    st = run_status(cli, proj, second)
    assert (st["state"], st["resumed_from"]) == ("FINISHED", first) and st["scheduler_job"]
    resumed = (workdir / ".thrust" / "runs" / second / "log").read_text()
    assert re.search(r"resumed from step [1-9]", resumed), resumed


# A job that checkpoints as it goes (every 10 steps, written whole, then renamed); resumed, it finishes.
STEPPING_JOB = """\
#!/bin/sh
if [ "$1" = --resume-from ]; then echo "resumed from step $(cat "$2")"; exit 0; fi
mkdir -p ckpt
step=0
while :; do
  step=$((step+1)); sleep 0.1
  if [ $((step % 10)) = 0 ]; then echo $step > ckpt/.t; mv ckpt/.t ckpt/step.txt; echo "checkpoint $step"; fi
done
"""


def test_a_run_whose_ssh_box_dies_is_retried_on_the_cluster(cli, hpc, tmp_path):
    """retry: {hosts: [the cluster]}: a run followed on a plain SSH box whose box dies moves to the next
    host of its retry, here a Slurm cluster, from the checkpoint pulled while it was followed."""
    proj, workdir = hpc
    box = _start_sshd(tmp_path / "box-sshd")
    try:
        (proj / "stepping.sh").write_text(STEPPING_JOB)
        commit(proj, "a job that checkpoints as it goes", "stepping.sh")
        hc = box.host_config("box", workdir=str(workdir))  # hpc's: one disk, its venv built already
        config = proj.parent / "retry.yaml"
        config.write_text((proj / "thrust.yaml").read_text().replace("jobs:\n", (
            f"  box:\n    address: {hc.address}\n    workdir: {hc.workdir}\n    python: {hc.python}\n"
            f"    identity: {hc.identity}\n    known_hosts: {hc.known_hosts}\n    connect_timeout: 3\n"
            "jobs:\n  stepping:\n    command: [sh, stepping.sh]\n    checkpoints: ckpt/*.txt\n"
            "    resume: [--resume-from, '{checkpoint}']\n"
            "    retry: {max: 1, on: [host-lost, lost], hosts: [sandbox], grace: 0}\n"), 1))
        err = tmp_path / "train.err"
        with err.open("w") as fh:
            train = subprocess.Popen([EXE, "--config", str(config), "train", "stepping", "--host", "box",
                                      "--sync-every", "1"], cwd=proj, stdout=subprocess.PIPE, stderr=fh, text=True,
                                     start_new_session=True)
        try:
            first = wait_until(lambda: re.search(r"launching run (stepping-\S+)", err.read_text()), 60,
                               "the launch on the box").group(1)
            pulled = proj / ".thrust" / "fetched" / first / "checkpoints.json"
            wait_until(lambda: pulled.exists() and json.loads(pulled.read_text()).get("newest"), 60,
                       "a checkpoint pulled while followed")
            box.stop()  # the box is gone, with its run
            train.communicate(timeout=120)
        finally:
            train.kill()
            train.wait()
    finally:
        box.stop()
    told = err.read_text()
    assert train.returncode == 0, told
    second = re.findall(r"launching run (stepping-\S+)", told)[-1]
    assert "submitted to Slurm on sandbox" in told and second != first
    resumed = (workdir / ".thrust" / "runs" / second / "log").read_text()
    assert re.search(r"resumed from step [1-9]", resumed), resumed


def test_a_run_on_slurm_is_one_sbatch_job_and_status_logs_wait_work_unchanged(cli, hpc, cluster):
    proj, workdir = hpc
    started = cli("train", "hello", "--host", "sandbox", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    run_id = launched_run(started.stderr)
    # said once, by the detach (not "queued (position"); the job id is Slurm's
    job = re.search(rf"run {run_id} submitted to Slurm on sandbox as job (\d+)", started.stdout).group(1)
    done = cli("wait", run_id, "--timeout", "60", cwd=proj)
    assert done.returncode == 0, done.stdout + done.stderr
    st = run_status(cli, proj, run_id)
    assert (st["state"], st["exit_code"], st["scheduler_job"]) == ("FINISHED", 0, job)
    assert "hello from slurm" in cli("logs", run_id, cwd=proj).stdout
    run_dir = workdir / ".thrust" / "runs" / run_id
    # the files of a run on any host, written by the supervisor on the allocation
    assert {"run.json", "log", "exit_code"} <= {p.name for p in run_dir.iterdir()}
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["scheduler"]["job_id"] == job and meta["pid"] and meta["started_at"] and meta["gpus_used"] == []
    sbatch = meta["scheduler"]["sbatch"]
    assert sbatch[:2] == ["sbatch", "--parsable"] and "--partition=debug" in sbatch and "--cpus-per-task=2" in sbatch
    assert "--time=10:00" in sbatch
    assert not (run_dir / ".env.json").exists()  # the job's env (secrets?) is gone with the job


def test_a_pending_run_shows_slurms_reason_and_stop_cancels_pending_and_running_runs(cli, hpc, cluster):
    proj, workdir = hpc
    runs = workdir / ".thrust" / "runs"
    first = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    second = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    wait_until(lambda: "started on" in cli("logs", first, cwd=proj).stdout, 30, "the first run to start")
    # the second waits in Slurm's queue for the node the first holds, and says why
    def pending() -> dict | None:
        next_poll(workdir)
        st = run_status(cli, proj, second)
        return st if st["reason"] in ("Resources", "Priority") else None

    queued = wait_until(pending, 30, "the second run's pending reason", interval=0.5)
    assert queued["state"] == "QUEUED" and queued["pid"] is None
    env_file = runs / second / ".env.json"  # the job's env waits for it, its owner's alone
    assert oct(env_file.stat().st_mode & 0o777) == "0o600" and oct(env_file.parent.stat().st_mode & 0o777) == "0o700"
    said = cli("status", second, cwd=proj).stdout
    assert "QUEUED" in said and re.search(r"\[(Resources|Priority)\]", said) and "slurm_job=" in said
    # stop of the pending run: scancel; it never starts
    assert cli("stop", second, cwd=proj).returncode == 0
    gone = run_status(cli, proj, second)
    assert (gone["state"], gone["exit_code"], gone["started_at"]) == ("STOPPED", None, None)
    # stop of the running run: scancel; the supervisor passes the TERM on and records the end
    assert cli("stop", first, cwd=proj).returncode == 0
    ended = wait_until(lambda: (s := run_status(cli, proj, first))["state"] != "RUNNING" and s, 30, "the stop")
    assert ended["state"] == "STOPPED" and ended["exit_code"] == 143, ended
    assert not (runs / first / "go").exists()


def test_gpus_are_slurms_to_place_a_run_waits_for_them_and_sees_its_share(cli, hpc, cluster):
    """`train --gpus G` asks Slurm for G GPUs (--gres), never picks them: the job sees the ones Slurm gave
    (CUDA_VISIBLE_DEVICES), a run asking GPUs another holds waits with a CPU free, one asking more than a
    node has is refused with Slurm's words. The GPUs are the cluster's stand-ins (tests/slurm_cluster.py)."""
    proj, workdir = hpc
    config = proj.parent / "gpus.yaml"  # one CPU a run: the node has CPUs left for a second, not GPUs
    config.write_text((proj / "thrust.yaml").read_text()
                      .replace("sbatch: {cpus-per-task: 2}", "sbatch: {cpus-per-task: 1}")
                      .replace("jobs:\n", "jobs:\n  gpu:\n    command: [sh, -c, 'echo gpus=$CUDA_VISIBLE_DEVICES; "
                               "while [ ! -e \"$THRUST_RUN_DIR/go\" ]; do sleep 0.1; done']\n", 1))
    runs = workdir / ".thrust" / "runs"

    def train(gpus: str) -> subprocess.CompletedProcess:
        return cli("--config", str(config), "train", "gpu", "--gpus", gpus, "--detach", cwd=proj)

    first = launched_run(train("2").stderr)
    wait_until(lambda: "gpus=0,1" in cli("logs", first, cwd=proj).stdout, 30, "the first run with both GPUs")
    meta = json.loads((runs / first / "run.json").read_text())
    assert "--gres=gpu:2" in meta["scheduler"]["sbatch"] and meta["gpus_used"] == [0, 1]
    second = launched_run(train("1").stderr)

    def pending() -> dict | None:
        next_poll(workdir)
        st = run_status(cli, proj, second)
        return st if st["reason"] == "Resources" else None

    assert wait_until(pending, 30, "the second run waiting for a GPU", interval=0.5)["state"] == "QUEUED"
    refused = train("3")
    assert refused.returncode == 69, refused.stderr
    assert "Requested node configuration is not available" in refused.stderr  # Slurm's own words
    (runs / first / "go").touch()
    wait_until(lambda: "gpus=0" in cli("logs", second, cwd=proj).stdout, 30, "the second run on the freed GPU")
    (runs / second / "go").touch()
    for run_id in (first, second):
        assert cli("wait", run_id, "--timeout", "60", cwd=proj).returncode == 0
        assert run_status(cli, proj, run_id)["state"] == "FINISHED"


def test_a_cancel_from_outside_reads_stopped_with_its_reason_and_a_refused_sbatch_says_why(cli, hpc, cluster):
    proj, workdir = hpc
    run_id = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    meta = json.loads((workdir / ".thrust" / "runs" / run_id / "run.json").read_text())
    cluster.run("scancel", meta["scheduler"]["job_id"])  # the user's own scancel, not thrust-remote stop
    def cancelled() -> dict | None:
        next_poll(workdir)
        st = run_status(cli, proj, run_id)
        return st if st["state"] == "STOPPED" else None

    st = wait_until(cancelled, 30, "the cancel seen", interval=0.5)
    assert st["reason"] == "cancelled" and "scancel" in st["reason_detail"]
    # a partition the cluster does not have: refused before the sync (sinfo), 78 naming those there are
    text = (proj / "thrust.yaml").read_text()
    bad = proj.parent / "bad.yaml"
    bad.write_text(text.replace(f"partition: {cluster.partition}", "partition: nosuch"))
    refused = cli("--config", str(bad), "train", "hello", "--detach", cwd=proj)
    assert refused.returncode == 78, refused.stdout + refused.stderr
    assert "no partition 'nosuch'" in refused.stderr and cluster.partition in refused.stderr
    # an option sbatch itself refuses (a feature no node has): the error is Slurm's own words, 69
    bad.write_text(text.replace("sbatch: {cpus-per-task: 2}", "sbatch: {cpus-per-task: 2, constraint: nosuchfeature}"))
    refused = cli("--config", str(bad), "train", "hello", "--detach", cwd=proj)
    assert refused.returncode == 69, refused.stdout + refused.stderr
    assert "Slurm refused run" in refused.stderr and "feature" in refused.stderr.lower(), refused.stderr
    assert "Traceback" not in refused.stderr


# A job of one's own on a cluster: a step every 0.1 s, a checkpoint when told to stop (the TERM its
# supervisor passes on when Slurm warns that the time limit is near), and resumed from it, it finishes.
OWN_JOB = """\
#!/bin/sh
step=0
if [ "$1" = --resume-from ]; then echo "resumed from step $(cat "$2")"; exit 0; fi
mkdir -p ckpt
trap 'echo $step > ckpt/step.txt; echo "checkpoint at step $step"; exit 143' TERM
while :; do step=$((step+1)); echo "step $step"; sleep 0.1; done
"""


def _own_config(proj: Path, workdir: Path, login) -> Path:
    """The project's thrust.yaml with job `own` (job.sh, committed) and a plain SSH host `box` beside the
    cluster: the same machine and workdir (its venv built already; runs are told apart by their ids), no
    scheduler."""
    config = proj.parent / "own.yaml"
    if config.exists():
        return config
    (proj / "job.sh").write_text(OWN_JOB)
    commit(proj, "a job of one's own", "job.sh")
    box = login.host_config("box", workdir=str(workdir))
    text = (proj / "thrust.yaml").read_text().replace("jobs:\n", (
        f"  box:\n    address: {box.address}\n    workdir: {box.workdir}\n    python: {box.python}\n"
        f"    identity: {box.identity}\n    known_hosts: {box.known_hosts}\n"
        "jobs:\n  own:\n    command: [sh, job.sh]\n    checkpoints: ckpt/*.txt\n"
        "    resume: [--resume-from, '{checkpoint}']\n    retry: {max: 1, on: [timeout, preempted]}\n"), 1)
    config.write_text(text)
    return config


def test_a_run_warned_of_its_time_limit_checkpoints_and_resubmits_itself_from_it(cli, hpc, cluster, login,
                                                                                  tmp_path):
    proj, workdir = hpc
    config = _own_config(proj, workdir, login)
    err = tmp_path / "train.err"
    with err.open("w") as fh:
        train = subprocess.Popen([EXE, "--config", str(config), "train", "own"], cwd=proj, stdout=subprocess.PIPE,
                                 stderr=fh, text=True, start_new_session=True)
    try:
        first = wait_until(lambda: re.search(r"launching run (own-\S+)", err.read_text()), 60, "the launch").group(1)
        log = workdir / ".thrust" / "runs" / first / "log"
        wait_until(lambda: log.exists() and "step 3" in log.read_text(), 30, "the job's steps")
        job = json.loads((log.parent / "run.json").read_text())["scheduler"]["job_id"]
        # what Slurm does limit_warning seconds before the time limit (sbatch --signal=B:USR1@S), now
        cluster.run("scancel", "--signal=USR1", "--batch", job)
        out, _ = train.communicate(timeout=120)
    finally:
        train.kill()
        train.wait()
    told = err.read_text()
    assert train.returncode == 0, told
    # the cluster resubmitted it itself (its retry: on: [timeout]); the follower follows that run and
    # submits none of its own: one resubmission, not two
    second = re.search(rf"run {first}: it reached its time limit; the cluster resubmitted it as (own-\S+) ",
                       told).group(1)
    assert told.count("launching run") == 1 and f"resuming run {first}" not in told, told
    assert "checkpoint at step" in log.read_text()
    st = run_status(cli, proj, first)
    assert (st["state"], st["reason"]) == ("FAILED", "timeout")
    assert [c["run_id"] for c in st["continued_by"]] == [second]
    assert _resumed_from(workdir, first) == [second]
    resumed = (workdir / ".thrust" / "runs" / second / "log").read_text()
    assert re.search(r"resumed from step [1-9]", resumed), resumed
    assert run_status(cli, proj, second)["state"] == "FINISHED"


def _resumed_from(workdir: Path, run_id: str) -> list[str]:
    """The runs on the cluster's disk that continue `run_id`."""
    out = []
    for meta in (workdir / ".thrust" / "runs").glob("*/run.json"):
        if json.loads(meta.read_text()).get("resumed_from") == run_id:
            out.append(meta.parent.name)
    return out


def test_a_detached_run_at_its_time_limit_resubmits_itself_with_no_laptop_following(cli, hpc, cluster, login):
    """`train --detach` and the laptop gone: at Slurm's warning the job checkpoints, and the run's
    supervisor on the allocation submits the next attempt itself from that checkpoint (retry: max 1)."""
    proj, workdir = hpc
    config = str(_own_config(proj, workdir, login))
    started = cli("--config", config, "train", "own", "--host", "sandbox", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    first = launched_run(started.stderr)
    runs = workdir / ".thrust" / "runs"
    log = runs / first / "log"
    wait_until(lambda: log.exists() and "step 3" in log.read_text(), 30, "the job's steps")
    assert json.loads((runs / first / "run.json").read_text())["self_retry"]["attempt"] == 0
    job = json.loads((runs / first / "run.json").read_text())["scheduler"]["job_id"]
    cluster.run("scancel", "--signal=USR1", "--batch", job)  # Slurm's warning before the time limit, now
    st = wait_until(lambda: (s := run_status(cli, proj, first))["state"] != "RUNNING" and s, 30, "its end")
    assert (st["state"], st["reason"]) == ("FAILED", "timeout"), st
    second = st["continued_by"][0]["run_id"]
    assert st["continued_by"] == [{"run_id": second, "host": "sandbox"}] and _resumed_from(workdir, first) == [second]
    assert f"continued by {second} on sandbox" in cli("status", first, cwd=proj).stdout
    done = cli("wait", second, "--timeout", "60", cwd=proj)  # found without --host: the index has it now
    assert done.returncode == 0, done.stdout + done.stderr
    nxt = run_status(cli, proj, second)
    assert (nxt["state"], nxt["resumed_from"]) == ("FINISHED", first) and nxt["scheduler_job"] != job
    meta = json.loads((runs / second / "run.json").read_text())
    assert meta["self_retry"]["attempt"] == 1
    assert (runs / second).stat().st_mode & 0o077 == 0  # the account's alone, as the run dir a launch makes
    assert meta["cwd"] == json.loads((runs / first / "run.json").read_text())["cwd"]  # the same tree
    checkpoint = runs / second / "resume" / "step.txt"
    assert checkpoint.exists() and f"--resume-from {checkpoint}" in " ".join(meta["argv"])
    resumed = (runs / second / "log").read_text()
    assert re.search(r"resumed from step [1-9]", resumed), resumed
    assert not (runs / second / ".env.json").exists()


def test_a_detached_run_that_is_preempted_resubmits_itself_with_no_laptop_following(cli, hpc, cluster, login):
    """A job of the `urgent` partition takes the node: Slurm cancels the run's job (a TERM, no warning
    before), the job checkpoints, and the run's supervisor, finding the job's PreemptTime set, submits
    the next attempt itself (retry: on: [preempted]); it starts once the urgent job is done."""
    proj, workdir = hpc
    config = str(_own_config(proj, workdir, login))
    first = launched_run(cli("--config", config, "train", "own", "--host", "sandbox", "--detach", cwd=proj).stderr)
    runs = workdir / ".thrust" / "runs"
    log = runs / first / "log"
    wait_until(lambda: log.exists() and "step 3" in log.read_text(), 30, "the job's steps")
    cluster.run("sbatch", "--parsable", "--partition=urgent", "--cpus-per-task=2", "--output=/dev/null",
                "--wrap", "true")  # no slurm-N.out in the test's cwd
    st = wait_until(lambda: (s := run_status(cli, proj, first))["state"] != "RUNNING" and s, 30, "its end")
    assert (st["state"], st.get("reason")) == ("LOST", "preempted"), st
    assert "checkpoint at step" in log.read_text()
    second = st["continued_by"][0]["run_id"]
    assert _resumed_from(workdir, first) == [second] and (runs / first / "preempted").exists()
    done = cli("wait", second, "--timeout", "60", cwd=proj)
    assert done.returncode == 0, done.stdout + done.stderr
    assert run_status(cli, proj, second)["resumed_from"] == first
    assert re.search(r"resumed from step [1-9]", (runs / second / "log").read_text())
    # a cancel is not a preemption: stopped, it ends STOPPED and continues nowhere
    third = launched_run(cli("--config", config, "train", "own", "--host", "sandbox", "--detach", cwd=proj).stderr)
    wait_until(lambda: (runs / third / "log").exists() and "step 3" in (runs / third / "log").read_text(), 30,
               "the third run's steps")
    assert cli("stop", third, cwd=proj).returncode == 0
    st = wait_until(lambda: (s := run_status(cli, proj, third))["state"] != "RUNNING" and s, 30, "the stop")
    assert st["state"] == "STOPPED" and not st.get("continued_by") and not (runs / third / "preempted").exists()


def test_one_squeue_answer_serves_every_look_for_ten_seconds(hpc, cluster, monkeypatch):
    from thrust_remote.agent import slurm

    _proj, workdir = hpc
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    kept = workdir / ".thrust" / "slurm"
    first = slurm.poll(str(kept))
    again = slurm.poll(str(kept))
    assert "error" not in first and again["at"] == first["at"]  # not asked again within POLL_S
    assert slurm.POLL_S >= 10
    os.utime(kept / "squeue.json")  # its age is what it says, not the file's time
    aged = json.loads((kept / "squeue.json").read_text())
    aged["at"] = time.time() - slurm.POLL_S - 1
    (kept / "squeue.json").write_text(json.dumps(aged))
    assert slurm.poll(str(kept))["at"] > first["at"]  # older than POLL_S: asked once more


def test_doctor_of_the_login_node_adds_the_clusters_rows_each_with_its_fix(cli, hpc, cluster):
    proj, _workdir = hpc
    report = cli("doctor", "--json", cwd=proj)
    rows = {c["id"]: c for c in json.loads(report.stdout)["checks"]}
    assert rows["slurm-partition"]["status"] == "ok" and "debug" in rows["slurm-partition"]["detail"]
    assert rows["slurm-time"]["status"] == "ok" and "10:00" in rows["slurm-time"]["detail"]
    assert rows["slurm-submit"]["status"] == "ok", rows  # sbatch --test-only: nothing submitted
    assert rows.get("slurm-shared", {}).get("status") == "ok", {k: v for k, v in rows.items() if "slurm" in k}
    assert rows["slurm-python"]["status"] == "ok" and "torch" in rows["slurm-python"]["detail"]
    assert "GPUs: gpu:2" in rows["slurm-partition"]["detail"]  # sinfo's gres (the stand-in GPUs)
    cuda = rows["slurm-cuda"]  # a GPU partition: CUDA as a compute node's python sees it; torch here is a CPU build
    assert cuda["status"] == "warn" and "is False" in cuda["detail"] and "train --gpus" in cuda["fix"]
    # a partition the cluster lacks and a time over the limit: failed rows, each with its fix
    text = (proj / "thrust.yaml").read_text()
    bad = proj.parent / "doctor-bad.yaml"
    bad.write_text(text.replace(f"partition: {cluster.partition}", "partition: nosuch"))
    rows = {c["id"]: c for c in json.loads(cli("--config", str(bad), "doctor", "--json", cwd=proj).stdout)["checks"]}
    assert rows["slurm-partition"]["status"] == "fail" and "debug" in rows["slurm-partition"]["detail"]
    assert rows["slurm-partition"]["fix"] == "set partition: to one of them"
    assert rows["slurm-submit"]["status"] == "fail" and rows["slurm-submit"]["fix"]
    assert rows["slurm-node"]["status"] == "skip"


SCORE_SH = """\
#!/bin/sh
for w in "$@"; do case "$w" in lr=*) lr="${w#lr=}";; esac; done
echo "THRUST_METRICS {\\"step\\": 1, \\"charts/score\\": $lr}"
"""


def test_optimize_on_the_cluster_runs_each_trial_as_a_job_and_a_pending_one_is_not_a_failure(cli, hpc):
    proj, workdir = hpc
    (proj / "score.sh").write_text(SCORE_SH)
    commit(proj, "a search of one's own", "score.sh")
    config = proj.parent / "search.yaml"
    config.write_text((proj / "thrust.yaml").read_text().replace("jobs:\n", (
        "jobs:\n  words:\n    command: [sh, score.sh]\n    objective: {metric: charts/score, mode: max}\n"), 1)
        + "search:\n  words: {lr: {choices: [0.1, 0.3, 0.7]}}\n")
    # two jobs in the scheduler at once on a node that runs one (each asks both CPUs): one waits, QUEUED
    result = cli("--config", str(config), "optimize", "words", "--trials", "2", "--parallel", "2", "--seed", "1",
                 "--json", cwd=proj, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["counts"]["done"] == 2 and {t["state"] for t in out["trials"]} == {"COMPLETE"}, out["trials"]
    spans = []
    for trial in out["trials"]:
        run_dir = workdir / ".thrust" / "runs" / trial["run_id"]
        meta = json.loads((run_dir / "run.json").read_text())
        assert meta["scheduler"]["job_id"] and "--cpus-per-task=2" in meta["scheduler"]["sbatch"]
        spans.append((meta["started_ts"], json.loads((run_dir / "exit_code").read_text())["ended_ts"]))
    (_, first_end), (second_start, _) = sorted(spans)
    assert second_start >= first_end - 0.5  # both were in Slurm at once; the second waited, pending, for the node
