"""A Slurm host's config and the scheduler's states, in this process (the real cluster: test_slurm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thrust_remote.agent import slurm
from thrust_remote.agent.protocol import RunState
from thrust_remote.agent.slurmstate import SLURM_STATES, slurm_state
from thrust_remote.core.config import parse_config_text
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.core.scheduler import sbatch_options
from thrust_remote.run.lifecycle import check_request
from thrust_remote.run.vocab import TrainRequest

BASE = """default_host: hpc
hosts:
  hpc:
    address: me@login
    scheduler: slurm
{extra}jobs:
  j:
    command: [echo, hi]
"""


def _load(extra: str, tmp_path: Path):
    path = tmp_path / "thrust.yaml"
    return parse_config_text(BASE.format(extra=extra), path)


def test_a_slurm_host_takes_partition_account_time_and_passes_sbatch_options_through(tmp_path):
    host = _load('    partition: gpu\n    account: lab-1\n    time: "1-12:00:00"\n'
                 "    sbatch: {qos: normal, constraint: a100, exclusive: true}\n", tmp_path).hosts["hpc"]
    assert host.slurm is not None and (host.slurm.partition, host.slurm.account) == ("gpu", "lab-1")
    assert sbatch_options(host.slurm, gpus=2) == [
        "--nodes=1", "--ntasks-per-node=1", "--no-requeue", "--partition=gpu", "--account=lab-1", "--time=1-12:00:00",
        "--gres=gpu:2", "--signal=B:USR1@90", "--qos=normal", "--constraint=a100", "--exclusive"]
    unquoted = _load("    time: 24:00\n", tmp_path).hosts["hpc"].slurm
    assert unquoted is not None and unquoted.time == "24:00"  # as written, as sbatch reads it
    plain = parse_config_text("default_host: b\nhosts:\n  b:\n    address: me@box\n", tmp_path / "t.yaml")
    assert plain.hosts["b"].slurm is None


@pytest.mark.parametrize(("extra", "line", "said", "hint"), [
    ("    sbatch: {job-name: x}\n", 6, "hosts.hpc.sbatch.job-name: thrust-remote sets this sbatch option itself",
     "thrust-RUN_ID"),
    ("    sbatch: {partition: gpu}\n", 6, "sets this sbatch option itself", "partition: key"),
    ("    sbatch: {--time: '1:00'}\n", 6, "sets this sbatch option itself", "time: key"),
    ("    sbatch: {G: 2}\n", 6, "sets this sbatch option itself", "--gpus"),
    ("    sbatch: {'qos;rm': x}\n", 6, "an sbatch long option's name", None),
    ("    sbatch: {qos: [a, b]}\n", 6, "expected a single value", None),
    ("    time: forever\n", 6, "a Slurm time limit", None),
    ("    partition: 'gpu --wrap=x'\n", 6, "a Slurm partition name", None),
    ("", 5, "expected one of slurm", None),
])
def test_a_bad_slurm_key_is_refused_at_its_line(tmp_path, extra, line, said, hint):
    text = BASE.format(extra=extra)
    with pytest.raises(ConfigError) as exc:
        parse_config_text(text if extra else text.replace("slurm", "pbs"), tmp_path / "thrust.yaml")
    assert f"thrust.yaml:{line}:" in exc.value.message and said in exc.value.message
    if hint:
        assert hint in (exc.value.hint or "")


def test_slurm_keys_without_scheduler_slurm_are_refused_with_the_fix(tmp_path):
    text = BASE.format(extra="    partition: gpu\n").replace("    scheduler: slurm\n", "")
    with pytest.raises(ConfigError) as exc:
        parse_config_text(text, tmp_path / "thrust.yaml")
    assert "thrust.yaml:5: hosts.hpc.partition: only for a Slurm cluster" in exc.value.message
    assert "scheduler: slurm" in exc.value.hint


def test_slurms_states_map_once_to_run_states_with_their_reasons():
    def state(word, reason="", **kw):
        given = {"exit_code": None, "ended": False, "stopped": False, "started": False, **kw}
        return slurm_state(word, reason, **given)

    assert state("PENDING", "Priority") == {"state": RunState.QUEUED, "reason": "Priority"}
    assert state("RUNNING", started=True) == {"state": RunState.RUNNING}
    # an answer taken while it was pending, read after its supervisor started it: the run dir knows better
    assert state("PENDING", "Resources", started=True) == {"state": RunState.RUNNING}
    assert state("COMPLETED", exit_code=0, ended=True)["state"] == RunState.FINISHED
    assert state("COMPLETING", exit_code=3, ended=True)["state"] == RunState.FAILED  # its own end holds
    # killed by a signal while Slurm still has the job: Slurm's word (node-fail? timeout?) is awaited
    assert state("RUNNING", exit_code=143, ended=True, started=True)["reason"] == "ending"
    assert state("RUNNING", exit_code=143, ended=True, stopped=True)["state"] == RunState.STOPPED  # stop asked
    assert state("FAILED", exit_code=1, ended=True, started=True)["state"] == RunState.FAILED
    oom = state("OUT_OF_MEMORY", exit_code=137, ended=True, started=True)
    assert (oom["state"], oom["reason"]) == (RunState.FAILED, "out-of-memory")
    limit = state("TIMEOUT", exit_code=143, ended=True, started=True)  # the job recorded the TERM: still a timeout
    assert (limit["state"], limit["reason"]) == (RunState.FAILED, "timeout") and "time limit" in limit["reason_detail"]
    assert state("CANCELLED", stopped=True) == {"state": RunState.STOPPED, "reason": "user"}
    assert state("CANCELLED by 0")["reason"] == "cancelled"  # sacct's words; scancel from outside
    assert (state("NODE_FAIL", started=True)["state"], state("PREEMPTED")["state"]) == (RunState.LOST, RunState.LOST)
    assert state(None)["state"] == RunState.LOST  # gone from the scheduler, no end recorded
    assert state(None, exit_code=0, ended=True)["state"] == RunState.FINISHED
    assert state("COMPLETED")["state"] == RunState.LOST  # the batch ended, its supervisor recorded nothing
    assert state("SOMETHING_NEW")["state"] == RunState.LOST
    assert {s for s, _ in SLURM_STATES.values()} == {RunState.QUEUED, RunState.RUNNING, RunState.FINISHED,
                                                       RunState.FAILED, RunState.STOPPED, RunState.LOST}


@pytest.mark.parametrize(("kw", "said"), [
    ({"queue": True}, "queues every run in its scheduler"),
    ({"gpus": "0,2"}, "the scheduler picks the GPUs"),
])
def test_a_run_a_slurm_cluster_cannot_take_is_refused_before_connecting(tmp_path, kw, said):
    config = _load("", tmp_path)
    request = TrainRequest(job=config.jobs["j"], host=config.hosts["hpc"], **kw)
    with pytest.raises(UsageError) as exc:
        check_request(request, [config.hosts["hpc"]])
    assert said in exc.value.message


def test_a_time_limit_and_a_preemption_are_retry_events_of_their_own(tmp_path):
    from thrust_remote.run.resume import event_of

    assert event_of({"state": "FAILED", "reason": "timeout"}) == "timeout"
    assert event_of({"state": "LOST", "reason": "preempted"}) == "preempted"
    assert event_of({"state": "LOST", "reason": "node-fail"}) == "lost"
    assert event_of({"state": "FAILED"}) == "failed"
    # retry: on: takes them (with checkpoints: and resume:, as any retry)
    text = BASE.format(extra="").replace("    command: [echo, hi]\n", "    command: [sh, job.sh]\n"
                                         "    checkpoints: ckpt/*\n    resume: [--from, '{checkpoint}']\n"
                                         "    retry: {max: 2, on: [timeout, preempted]}\n")
    job = parse_config_text(text, tmp_path / "thrust.yaml").jobs["j"]
    assert job.retry is not None and tuple(job.retry.on) == ("timeout", "preempted")


def test_gpu_hours_on_a_cluster_count_the_gpus_asked_of_the_scheduler():
    from thrust_remote.backends.slurm import scheduled_gpus as _scheduled_gpus

    assert _scheduled_gpus(["--nodes=2", "--ntasks-per-node=1"], 4) == list(range(8))  # 4 a node, 2 nodes
    assert _scheduled_gpus(["--nodes=1"], 0) == []  # none asked: CPU hours only, whatever the login node has


def _warned_run(tmp_path: Path, attempt: int) -> tuple[Path, dict]:
    """A run dir as a Slurm run's supervisor leaves it at Slurm's time-limit warning, before its end."""
    run_dir = tmp_path / "runs" / "own-1"
    run_dir.mkdir(parents=True)
    (tmp_path / "tree").mkdir()
    meta = {"run_id": "own-1", "job": "own", "cwd": str(tmp_path / "tree"), "tree": str(tmp_path / "tree"),
            "self_retry": {"on": ["timeout"], "max": 1, "attempt": attempt, "checkpoints": "ckpt/*.txt",
                           "host": "hpc", "argv": ["sh", "job.sh", "--resume-from", "{checkpoint}"], "sbatch": []}}
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "time-limit").write_text("now")
    return run_dir, meta


@pytest.mark.parametrize(("attempt", "why"), [(0, "no checkpoint matches 'ckpt/*.txt'"),
                                              (1, "its retry: max (1) is reached")])
def test_a_run_at_its_time_limit_that_cannot_continue_itself_says_why_and_submits_nothing(tmp_path, attempt, why):
    """No checkpoint, or its retries spent: nothing is submitted (no sbatch is run), the run dir says why
    (status: `continue_error`), and a follower, if any, retries as before."""
    run_dir, meta = _warned_run(tmp_path, attempt)
    assert slurm.continue_itself(str(run_dir), meta, {}) is None
    assert json.loads((run_dir / "run.json").read_text())["continue_error"] == why
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["own-1"]  # no next run dir


@pytest.mark.parametrize(("text", "want"), [
    ("30", 30.0), ("30:30", 30.5), ("2:00:00", 120.0), ("1-00", 1440.0), ("1-02:30", 1590.0),
    ("1-02:30:30", 1590.5), (" 10:00 ", 10.0), ("UNLIMITED", None), ("infinite", None), ("1h", None), ("", None),
])
def test_slurm_time_limits_read_in_minutes_in_each_of_slurms_forms(text, want):
    """`time:` against the partition's limit (doctor's slurm-time row): sinfo and sbatch write a limit in
    any of Slurm's forms; one it cannot read, or no limit, is never called over it."""
    from thrust_remote.agent.slurmcheck import minutes

    assert minutes(text) == want


def test_every_node_of_a_run_takes_node_0s_rendezvous_address_from_the_board_node_0_wrote(tmp_path, monkeypatch):
    """Node 0 puts the address it listens on and its port on the run dir's board; another node's
    torchrun uses both from there, whatever its own env says of node 0 (SLURM_LAUNCH_NODE_IPADDR)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    meta = {"scheduler": {"nodes": 2}}
    argv = ["torchrun", f"--rdzv-endpoint={slurm.RDZV_PENDING}:0", "--rdzv-conf=is_host=false", "job.py"]
    monkeypatch.setenv("SLURM_NODEID", "0")
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1")
    here, node0 = slurm.place_node(str(run_dir), dict(meta), {}, list(argv))
    board = json.loads((run_dir / slurm.RDZV_FILE).read_text())
    assert here == str(run_dir) and board["address"] == "127.0.0.1" and board["port"] > 0
    assert f"--rdzv-endpoint=127.0.0.1:{board['port']}" in node0 and "--rdzv-conf=is_host=true" in node0
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.9")  # this node's own view, not node 0's word
    here, node1 = slurm.place_node(str(run_dir), dict(meta), {}, list(argv))
    assert here == str(run_dir / "nodes" / "1")
    assert f"--rdzv-endpoint=127.0.0.1:{board['port']}" in node1 and "--rdzv-conf=is_host=false" in node1


def test_sbatch_never_takes_from_the_login_environment_an_option_a_run_sets_or_refuses(monkeypatch):
    """A login profile's SBATCH_ARRAY_INX would make one run an array of jobs in one run dir, its
    SBATCH_ERROR split the log: sbatch's environment leaves them out and keeps the rest (a default
    partition, SLURM_CONF)."""
    for key in slurm.NOT_FROM_ENV:
        monkeypatch.setenv(key, "x")
    monkeypatch.setenv("SBATCH_PARTITION", "gpu")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    env = slurm._submit_env()
    assert not {"SBATCH_ARRAY_INX", "SBATCH_ERROR", "SBATCH_WAIT", "SLURM_JOB_ID"} & set(env)
    assert env["SBATCH_PARTITION"] == "gpu"
    assert env["SLURM_CONF"] == "/etc/slurm/slurm.conf"
