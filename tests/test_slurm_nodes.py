"""A Slurm cluster of two compute nodes as a host: each slurmd in a network namespace of its own
(tests/netns.py), slurmctld on the bridge, the login node an sshd on this machine whose sessions get
SLURM_CONF. A run over both nodes (torchrun across them, its rendezvous on the first), and a node that
fails under a running run. A group of its own: it runs beside test_slurm.py's one-node cluster.
"""

from __future__ import annotations

import json
import re

import netns
import pytest
import slurm_cluster
from conftest import _start_sshd
from helpers import TRAIN_PY, commit, new_project, remote_tempdir, wait_until
from slurm_cluster import GATED, launched_run, next_poll, run_status

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_slurm_nodes")]

slurm_cluster.skip_unless_runnable()


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """A second cluster of two compute nodes, each in a network namespace of its own (tests/netns.py,
    slurmctld on the bridge), and its login node: an sshd on this machine whose sessions see it."""
    why = netns.unavailable()
    if why:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("two-nodes")
    with netns.Network(2) as net:
        nodes = [slurm_cluster.Node(h.name, h.ip, h.netns) for h in net.hosts]
        # tasks bound to their CPUs, as most clusters do: a step that asks too few CPUs shows it
        cluster = slurm_cluster.start(root / "cluster", nodes=nodes, ctl_addr=f"{net.subnet}.1", bind=True)
        try:
            login = _start_sshd(root / "login", extra_config=f"SetEnv SLURM_CONF={cluster.conf}\n")
            workdir = remote_tempdir(login) / "two"
            proj = new_project(root / "project", login, workdir, files={"train.py": TRAIN_PY},
                               jobs=f"jobs:\n  ddp:\n    script: train.py\n  gated:\n    {GATED}\n")
            text = (proj / "thrust.yaml").read_text()
            (proj / "thrust.yaml").write_text(text.replace("    connect_timeout: 5\n", "    connect_timeout: 5\n"
                                                           "    scheduler: slurm\n    time: \"10:00\"\n"))
            try:
                yield cluster, proj, workdir
            finally:
                login.stop()
        finally:
            cluster.stop()


def test_a_run_over_two_nodes_is_torchrun_across_them_with_its_rendezvous_on_the_first(cli, two_nodes):
    cluster, proj, workdir = two_nodes
    done = cli("train", "ddp", "--nodes", "2", cwd=proj)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = launched_run(done.stderr)
    run_dir = workdir / ".thrust" / "runs" / run_id
    seen = [json.loads((run_dir / f"seen-script-{rank}.json").read_text()) for rank in (0, 1)]
    assert {s["env"]["WORLD_SIZE"] for s in seen} == {"2"} and {s["ranks"] for s in seen} == {2.0}
    board = json.loads((run_dir / "rdzv.json").read_text())  # node 0's address, as Slurm knows it
    assert board["address"] == cluster_addr(cluster, 0) and board["port"]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["scheduler"]["nodes"] == 2 and "--nodes=2" in meta["scheduler"]["sbatch"]
    assert f"--rdzv-endpoint={board['address']}:{board['port']}" in meta["argv"]
    node1 = json.loads((run_dir / "nodes" / "1" / "run.json").read_text())  # node 1's own supervisor
    assert node1["slurm_node"] == 1
    # the run's end is node 0's; node 1's supervisor records its own a moment later (srun ends both)
    wait_until(lambda: (run_dir / "nodes" / "1" / "exit_code").exists(), 30, "node 1's supervisor to record its end")
    st = run_status(cli, proj, run_id)
    assert st["state"] == "FINISHED"
    # each node listed as a run over hosts lists its nodes: its index, Slurm's name for it, its own state
    names = [line.split("NodeName=")[1].split()[0] for line in cluster.conf.read_text().splitlines()
             if line.startswith("NodeName=")]
    assert [(n["node"], n["state"], n["exit_code"]) for n in st["nodes"]] == [(0, "FINISHED", 0), (1, "FINISHED", 0)]
    assert sorted(n["slurm_node"] for n in st["nodes"]) == sorted(names) and st["nodes"][1]["slurm_node"] == node1[
        "slurm_node_name"] and "slurm_nodes" not in st
    said = cli("status", run_id, cwd=proj).stdout
    assert f"node 1  {node1['slurm_node_name']}  FINISHED" in said, said
    # node 1's log, from its own nodes/1/
    shown = cli("logs", run_id, "--node", "1", cwd=proj)
    assert shown.returncode == 0 and shown.stdout == (run_dir / "nodes" / "1" / "log").read_text(), shown.stderr
    assert shown.stdout != (run_dir / "log").read_text()
    # and followed: node 1's log to the run's end (ended already: at once), as `logs --follow` does
    followed = cli("logs", run_id, "--follow", "--node", "1", "--raw", "--no-fetch", cwd=proj)
    assert followed.returncode == 0 and followed.stdout.startswith((run_dir / "nodes" / "1" / "log").read_text()), (
        followed.stdout + followed.stderr)
    beyond = cli("logs", run_id, "--node", "2", cwd=proj)
    assert beyond.returncode == 64 and "give --node 0 to 1" in beyond.stderr and "Traceback" not in beyond.stderr


CPUS_PY = """\
import os
print(f"rank {os.environ.get('RANK')} holds {len(os.sched_getaffinity(0))} CPUs", flush=True)
"""


@pytest.mark.parametrize(("name", "asked"), [("per_task", "{cpus-per-task: 2}"), ("whole", "{exclusive: true}")])
def test_a_run_over_two_nodes_holds_on_each_node_the_cpus_its_job_holds(cli, two_nodes, name: str, asked: str):
    """A job that holds both CPUs of each node, on a cluster that binds tasks to their CPUs: the step
    that starts each node's supervisor has one task, which Slurm would bind to one CPU (22.05's srun
    does not even take the job's cpus-per-task), leaving the job one CPU a node."""
    _, proj, workdir = two_nodes
    config = proj.parent / f"nodes-{name}.yaml"
    if not (proj / "cpus.py").exists():
        (proj / "cpus.py").write_text(CPUS_PY)
        commit(proj, "a job that says how many CPUs it holds", "cpus.py")
    text = (proj / "thrust.yaml").read_text()
    text = text.replace("    scheduler: slurm\n", f"    scheduler: slurm\n    sbatch: {asked}\n")
    config.write_text(text.replace("jobs:\n", f"jobs:\n  {name}:\n    script: cpus.py\n", 1))
    done = cli("--config", str(config), "train", name, "--nodes", "2", cwd=proj)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = workdir / ".thrust" / "runs" / launched_run(done.stderr)
    wait_until(lambda: (run_dir / "nodes" / "1" / "exit_code").exists(), 30, "node 1's supervisor to record its end")
    for rank, log in enumerate((run_dir / "log", run_dir / "nodes" / "1" / "log")):
        assert f"rank {rank} holds 2 CPUs" in log.read_text(), log.read_text()[-800:]


# Over two nodes (torchrun, one process a node): a step every 0.1 s on each; at the TERM rank 0 writes
# the checkpoint (the nodes share the tree) and each exits; resumed, each rank says from which step.
NODES_PY = """\
import os, signal, sys, time
rank = int(os.environ.get("RANK", "0"))
if sys.argv[1:2] == ["--resume-from"]:
    print(f"rank {rank} resumed from step {open(sys.argv[2]).read().strip()}", flush=True)
    sys.exit(0)
step = 0
def stop(*_):
    if rank == 0:
        os.makedirs("ckpt", exist_ok=True)
        with open("ckpt/.s", "w") as f:
            f.write(str(step))
        os.replace("ckpt/.s", "ckpt/step.txt")
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
while True:
    step += 1
    print(f"step {step}", flush=True)
    time.sleep(0.1)
"""


def test_a_run_over_two_nodes_at_its_time_limit_resubmits_itself_over_two_nodes(cli, two_nodes):
    """Slurm's warning (B:USR1) reaches srun, which passes it to both nodes' supervisors: each job gets
    its TERM, node 0's supervisor submits the next attempt itself, over two nodes again, from rank 0's
    checkpoint; both ranks of the new run start from it."""
    cluster, proj, workdir = two_nodes
    config = proj.parent / "nodes-own.yaml"
    if not config.exists():
        (proj / "nodes.py").write_text(NODES_PY)
        commit(proj, "a job over nodes that checkpoints on TERM", "nodes.py")
        config.write_text((proj / "thrust.yaml").read_text().replace("jobs:\n", (
            "jobs:\n  own2:\n    script: nodes.py\n    checkpoints: ckpt/*.txt\n"
            "    resume: [--resume-from, '{checkpoint}']\n    retry: {max: 1, on: [timeout]}\n"), 1))
    runs = workdir / ".thrust" / "runs"
    started = cli("--config", str(config), "train", "own2", "--nodes", "2", "--detach", cwd=proj)
    assert started.returncode == 0, started.stdout + started.stderr
    first = launched_run(started.stderr)
    logs = [runs / first / "log", runs / first / "nodes" / "1" / "log"]
    wait_until(lambda: all(p.exists() and "step 3" in p.read_text() for p in logs), 30, "both nodes' steps")
    job = json.loads((runs / first / "run.json").read_text())["scheduler"]["job_id"]
    cluster.run("scancel", "--signal=USR1", "--batch", job)  # Slurm's warning before the time limit, now
    st = wait_until(lambda: (s := run_status(cli, proj, first))["state"] != "RUNNING" and s, 30, "its end")
    assert (st["state"], st.get("reason")) == ("FAILED", "timeout"), st
    assert st.get("continued_by"), (st.get("continue_error"), (runs / first / "log").read_text()[-800:])
    second = st["continued_by"][0]["run_id"]
    # a new Slurm job over both nodes, a new rendezvous: ~5 s here; CI once saw it still going after 60 s
    # (cause unknown; what it was doing is said below if it happens again): 120 s bounds a hang
    done = cli("wait", second, "--timeout", "120", cwd=proj)
    assert done.returncode == 0, "\n".join([done.stdout + done.stderr, cluster.describe(), *(
        f"{log}:\n{log.read_text(errors='replace')[-800:] if log.exists() else '(none)'}"
        for log in (runs / second / "log", runs / second / "nodes" / "1" / "log"))])
    meta = json.loads((runs / second / "run.json").read_text())
    assert meta["resumed_from"] == first
    assert meta["scheduler"]["nodes"] == 2 and "--nodes=2" in meta["scheduler"]["sbatch"]
    step = (runs / second / "resume" / "step.txt").read_text().strip()
    assert int(step) >= 3
    for i, log in enumerate((runs / second / "log", runs / second / "nodes" / "1" / "log")):
        assert f"rank {i} resumed from step {step}" in log.read_text()


def cluster_addr(cluster, i: int) -> str:
    """Compute node i's address in the cluster's config."""
    lines = [line for line in cluster.conf.read_text().splitlines() if line.startswith("NodeName=")]
    return lines[i].split("NodeAddr=")[1].split()[0]


def test_a_node_that_fails_under_a_running_run_makes_it_lost(cli, two_nodes):
    cluster, proj, workdir = two_nodes
    run_id = launched_run(cli("train", "gated", "--detach", cwd=proj).stderr)
    log = workdir / ".thrust" / "runs" / run_id / "log"
    wait_until(lambda: log.exists() and "started on" in log.read_text(), 30, "the run to start")
    node = re.search(r"started on (\S+)", log.read_text()).group(1)
    # the node dies (its slurmd, the job's slurmstepd, the supervisor and the job, killed at once):
    # slurmctld finds it silent after SlurmdTimeout (10 s here), sets it DOWN and the job NODE_FAIL
    cluster.power_off(node)
    try:
        def lost() -> dict | None:
            next_poll(workdir)
            st = run_status(cli, proj, run_id)
            return st if st["state"] != "RUNNING" else None

        st = wait_until(lost, 60, "the node failure seen", interval=1)
        assert (st["state"], st["reason"]) == ("LOST", "node-fail"), st
        assert "node" in st["reason_detail"]
    finally:
        cluster.power_on(node)
