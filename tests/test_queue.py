"""The host-side queue (`train --queue`): a run whose GPUs or CPU slot are taken waits on the host, QUEUED
with its place, and starts by itself when they free, with no laptop connected; `stop` takes a queued run
out; a run that can never fit is refused at once (64).

The order rules first (agent/runqueue.py, pure), then real runs: over a real sshd for the CPU slots (runs
that end when the test says so: a file in their run dir, never after a sleep), and on the `local` host
for GPUs. There is no GPU here: a small program named nvidia-smi, first on PATH, prints the inventory
recorded on a real 4 x A100 host (tests/data/nvidia_smi), so `--gpus N` has four to choose from."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from helpers import EXE, commit, git_init, gpu_shim, new_project, remote_tempdir, wait_until

from thrust_remote.agent import runqueue
from thrust_remote.agent.protocol import RunState
from thrust_remote.agent.runqueue import Entry
from thrust_remote.run import jobs

GATED = ("command: [sh, -c, 'echo gpus=$CUDA_VISIBLE_DEVICES; "
         "while [ ! -e \"$THRUST_RUN_DIR/go\" ]; do sleep 0.1; done']")


def _queued(run_id: str, order: float, **spec) -> Entry:
    return Entry(run_id, RunState.QUEUED, [], {"order": [order, run_id], **spec})


def test_a_run_starts_in_fifo_order_and_never_takes_what_an_earlier_run_waits_for():
    running = Entry("a", RunState.RUNNING, [0], None)
    first = {"order": [1.0, "b"], "count": 2, "pool": [0, 1, 2, 3]}
    later = {"order": [2.0, "c"], "gpus": [1]}
    other = {"order": [3.0, "d"], "gpus": [3]}
    entries = [running, _queued("b", 1.0, count=2, pool=[0, 1, 2, 3]), _queued("c", 2.0, gpus=[1]),
               _queued("d", 3.0, gpus=[3])]
    assert runqueue.may_start(first, "b", entries) == [1, 2]  # the first two of the pool that are free
    assert runqueue.may_start(later, "c", entries) is None  # GPU 1 is free, but b (ahead) wants it
    assert runqueue.blocked_by(later, "c", entries) == "b"
    assert runqueue.may_start({**first, "count": 4}, "b", entries) is None  # GPU 0 is held
    assert runqueue.position(other, "d", entries) == 3
    cpu = [Entry("x", RunState.RUNNING, [], None), _queued("y", 1.0)]
    assert runqueue.take({"cpu_slots": 1}, cpu) is None
    assert runqueue.take({"cpu_slots": 2}, cpu) == []
    assert runqueue.never_fits({"count": 5, "pool": [0, 1, 2, 3]}) == "asks 5 GPU(s) of 4"
    assert runqueue.never_fits({"count": 4, "pool": [0, 1, 2, 3]}) is None


def test_a_queued_run_over_several_hosts_waits_at_the_rendezvous_for_nodes_that_start_later():
    plain = jobs.Rendezvous(2, 1, "10.0.0.1", 29500, "r1").argv()
    queued = jobs.Rendezvous(2, 1, "10.0.0.1", 29500, "r1", queued=True).argv()
    assert "--rdzv-conf=is_host=false" in plain
    conf = next(a for a in queued if a.startswith("--rdzv-conf="))
    assert f"join_timeout={jobs.QUEUE_WAIT_S}" in conf and f"read_timeout={jobs.QUEUE_WAIT_S}" in conf


# ------------------------------------------------------------------------------------------ over SSH

@pytest.fixture(scope="module")
def one_slot(sshd, tmp_path_factory) -> tuple[Path, Path]:
    workdir = remote_tempdir(sshd) / "queue"
    proj = new_project(tmp_path_factory.mktemp("queue") / "project", sshd, workdir,
                       jobs=f"jobs:\n  gated:\n    {GATED}\n")
    return proj, workdir


def _run_id(stderr: str) -> str:
    return re.search(r"launching run (\S+)", stderr).group(1)


def _status(cli, proj: Path, run_id: str, env: dict | None = None) -> dict:
    result = cli("status", run_id, "--json", cwd=proj, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_a_queued_run_starts_by_itself_when_the_slot_frees_with_the_laptop_gone(cli, one_slot, tmp_path):
    proj, workdir = one_slot
    runs = workdir / ".thrust" / "runs"
    first = cli("train", "gated", "--queue", "--detach", cwd=proj)
    assert first.returncode == 0, first.stderr
    holder = _run_id(first.stderr)
    assert "started on sandbox" in first.stdout  # the slot was free: no wait
    # the second follows attached, then its laptop goes away (killed) while it waits on the host
    err = tmp_path / "second.err"
    with err.open("w") as fh:
        attached = subprocess.Popen([EXE, "train", "gated", "--queue"], cwd=proj, stdout=subprocess.PIPE,
                                    stderr=fh, text=True, start_new_session=True)
    try:
        wait_until(lambda: "queue (position 1)" in err.read_text(), 120, "the second run to be queued")
        waiting = _run_id(err.read_text())
        st = _status(cli, proj, waiting)
        assert (st["state"], st.get("position"), st["pid"]) == ("QUEUED", 1, None) and st["queued_at"], st
        third = cli("train", "gated", "--queue", "--detach", cwd=proj)
        assert third.returncode == 0, third.stderr
        assert "queued on sandbox (position 2)" in third.stdout
        os.killpg(attached.pid, signal.SIGINT)  # Ctrl-C: the laptop leaves; the run stays queued on the host
        assert attached.wait(timeout=60) == 75
    finally:
        attached.kill()
        attached.wait()
    told = err.read_text()
    assert f"thrust-remote logs {waiting} --follow" in told and "from where you left" not in told  # no --offset
    empty = cli("logs", waiting, cwd=proj)
    assert empty.returncode == 0 and "nothing in its log (it is QUEUED: it has not started yet)" in empty.stderr
    said = cli("status", waiting, cwd=proj).stdout
    assert "QUEUED (position 1 in the queue since" in said and "None" not in said and "pid=" not in said
    listed = {r["run_id"]: r for r in json.loads(cli("runs", "--json", cwd=proj).stdout)}
    assert listed[waiting]["state"] == "QUEUED" and listed[waiting]["position"] == 1
    plain = cli("runs", cwd=proj).stdout
    assert re.search(rf"QUEUED \(1\).*{waiting}", plain), plain
    # the third is taken out of the queue before its turn: it never runs
    stopped = cli("stop", _run_id(third.stderr), cwd=proj)
    assert stopped.returncode == 0, stopped.stderr
    gone = _status(cli, proj, _run_id(third.stderr))
    assert gone["state"] == "STOPPED" and gone["pid"] is None and gone["started_at"] is None
    assert gone["exit_code"] is None and gone["ended_at"]  # no job ran: no exit code, only when it ended
    # the holder is stopped: the queued run starts on the host by itself, its turn taken with nobody connected
    assert cli("stop", holder, cwd=proj).returncode == 0
    wait_until(lambda: _status(cli, proj, waiting)["state"] == "RUNNING", 60, "the queued run to start")
    started = _status(cli, proj, waiting)
    assert started["started_at"] >= _status(cli, proj, holder)["ended_at"]
    (runs / waiting / "go").touch()
    done = cli("wait", waiting, "--timeout", "60", cwd=proj)
    assert done.returncode == 0, done.stderr
    assert _status(cli, proj, _run_id(third.stderr))["state"] == "STOPPED"  # stopped stays stopped


# ------------------------------------------------------------------------------------------ GPUs



@pytest.mark.slow
def test_a_run_without_queue_on_a_full_cpu_host_is_told_it_shares_the_cpu(cli, tmp_path):
    """cpu_slots bounds the queue only; a plain `train` still starts at once, and says so when RUNNING
    runs fill the slots (a new user read `cpu_slots: 1` as a limit on every run)."""
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(f"jobs:\n  gated:\n    {GATED}\n")
    commit(proj, "a job that waits")
    first = cli("train", "gated", "--host", "local", "--detach", cwd=proj)
    assert first.returncode == 0 and "cpu_slots" not in first.stderr, first.stderr  # a free slot: nothing said
    holder = _run_id(first.stderr)
    second = cli("train", "gated", "--host", "local", "--detach", cwd=proj)
    assert second.returncode == 0, second.stderr
    assert f"local's cpu_slots (1) are taken by RUNNING run(s) {holder}" in second.stderr
    assert "`train --queue` waits for a free slot" in second.stderr
    runs = proj / ".thrust" / "runs"
    for run in (holder, _run_id(second.stderr)):
        (runs / run / "go").touch()
        assert cli("wait", run, "--host", "local", "--timeout", "60", cwd=proj).returncode == 0


def test_gpus_a_host_can_never_give_are_refused_before_anything_is_set_up(cli, tmp_path):
    """--gpus 5 on a 4-GPU host (the stand-in nvidia-smi), queued or not: 64 once the host's facts are in,
    before a venv is made for the job (a new user waited through a set-up to hear it)."""
    env = gpu_shim(tmp_path)
    proj = git_init(tmp_path / "p")
    (proj / "t.py").write_text("print('ran')\n")
    (proj / "thrust.yaml").write_text("jobs:\n  own:\n    kind: python\n    script: t.py\n")
    commit(proj, "a python job")
    for queued in ([], ["--queue"]):
        never = cli("train", "own", "--host", "local", "--gpus", "5", *queued, cwd=proj, env=env)
        assert never.returncode == 64 and "--gpus 5: local has 4 GPU(s)" in never.stderr, never.stderr
        assert "venv" not in never.stderr and not (proj / ".thrust" / "venvs").exists(), never.stderr


@pytest.mark.slow
def test_gpus_n_queued_takes_the_first_n_to_free_and_a_run_that_never_fits_is_refused(cli, tmp_path):
    env = gpu_shim(tmp_path)
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(f"jobs:\n  gated:\n    {GATED}\n")
    commit(proj, "a job that waits")
    never = cli("train", "gated", "--host", "local", "--queue", "--gpus", "5", cwd=proj, env=env)
    assert never.returncode == 64 and "has 4 GPU(s)" in never.stderr and "Traceback" not in never.stderr
    both = cli("train", "gated", "--queue", "--allow-shared-gpus", "--host", "local", cwd=proj, env=env)
    assert both.returncode == 64 and "--queue" in both.stderr
    held = cli("train", "gated", "--host", "local", "--gpus", "1,2,3", "--queue", "--detach", "--json", cwd=proj,
               env=env)
    assert held.returncode == 0, held.stderr
    started = json.loads(held.stdout)
    assert started["state"] == "RUNNING" and started["pid"]
    holder = started["run_id"]
    two = cli("train", "gated", "--host", "local", "--gpus", "2", "--queue", "--detach", cwd=proj, env=env)
    assert two.returncode == 0 and "queued on local (position 1)" in two.stdout, two.stderr + two.stdout
    assert "waits in" not in two.stderr  # said once: the detach's line, not a step before it as well
    waiting = _run_id(two.stderr)
    runs = proj / ".thrust" / "runs"
    (runs / holder / "go").touch()
    wait_until(lambda: "gpus=" in (runs / waiting / "log").read_text(), 60, "the queued run to start")
    assert "gpus=0,1" in (runs / waiting / "log").read_text()  # the first two free, chosen when it started
    st = json.loads(cli("status", waiting, "--host", "local", "--json", cwd=proj, env=env).stdout)
    assert st["state"] == "RUNNING" and st["gpus"] == [0, 1]
    (runs / waiting / "go").touch()
    assert cli("wait", waiting, "--host", "local", "--timeout", "60", cwd=proj, env=env).returncode == 0
