"""One run over two hosts: each host a network namespace with its own address and its own sshd, the
laptop in the root namespace (tests/netns.py). torchrun's c10d rendezvous and gloo, on CPU."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import VENV_BIN
from helpers import TRAIN_PY, commit, git_init
from netns import Network, unavailable

# e2e: several hosts in network namespaces. One worker runs the module's tests, in order: its two
# hosts are the module's, and its tests leave runs on them.
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.xdist_group("test_multinode")]

LONG_PY = '''\
import json, os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(1)
for step in range(1, 100000):
    dist.all_reduce(x)
    x.fill_(1.0)
    if rank == 0:
        print("THRUST_METRICS " + json.dumps({"step": step}), flush=True)
    time.sleep(0.2)
'''

QUIT_PY = '''\
import os, sys, time

if os.environ["RANK"] == "1":
    print("rank 1 gives up: no shard for it", flush=True)
    sys.exit(3)
time.sleep(300)
'''

JOBS = """\
groups:
  pair: [n0, n1]
jobs:
  quitter:
    script: quit.py
  ddp:
    script: train.py
    args: {tag: ddp, steps: 2}
  long:
    script: long.py
  crashy:
    args: {env: cartpole, total-steps: 4096, num-envs: 8, target-return: 0, log-interval: 0}
    env: {THRUST_TEST_CRASH_AT_STEP: "2048"}
  gated:
    command: [sh, -c, 'while [ ! -e "$THRUST_RUN_DIR/go" ]; do sleep 0.1; done']
"""


@pytest.fixture(scope="module")
def net():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with Network(2) as network:
        yield network


@pytest.fixture(scope="module")
def project(net, tmp_path_factory) -> Path:
    proj = tmp_path_factory.mktemp("multi") / "project"
    proj.mkdir()
    (proj / "train.py").write_text(TRAIN_PY)
    (proj / "long.py").write_text(LONG_PY)
    (proj / "quit.py").write_text(QUIT_PY)
    net.yaml(proj / "thrust.yaml", rest=JOBS)
    git_init(proj)
    commit(proj, "two nodes")
    return proj


def _run_id(text: str) -> str:
    match = re.search(r"launching run (\S+)", text)
    assert match, text
    return match.group(1)


def _run_dir(net: Network, node: int, run_id: str) -> Path:
    return net.hosts[node].workdir / ".thrust" / "runs" / run_id


def _status(cli, project: Path, run_id: str) -> dict:
    result = cli("status", run_id, "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _wait(predicate, timeout: float, what: str, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    tail = log.read_text()[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{tail}")


# ~25 s quiet: two real trainings over two namespaced hosts (torchrun on each, gloo's rendezvous), the
# train and its resume from the pulled checkpoint: the shortest proof that both reach node 0's model.
def test_two_nodes_train_the_builtin_trainer_and_node_0_brings_the_model_back(cli, net, project):
    result = cli("train", "cartpole", "--host", "n0", "--host", "n1", "--set", "total-steps=2048",
                 "--set", "num-envs=8", "--set", "target-return=0", cwd=project)
    assert result.returncode == 0, result.stderr + result.stdout
    run_id = _run_id(result.stderr)
    log = (_run_dir(net, 0, run_id) / "log").read_text()
    assert '"world_size": 2' in log
    assert (project / "web" / "public" / "cartpole.onnx").is_file()
    st = _status(cli, project, run_id)
    assert st["state"] == "FINISHED"
    assert [(n["host"], n["state"]) for n in st["nodes"]] == [("n0", "FINISHED"), ("n1", "FINISHED")]
    # node 1 ran the same commit in its own workdir and exported nothing
    assert not (_run_dir(net, 1, run_id) / "model.onnx").exists()
    # its newest checkpoint came home with the model: resumed over the same two hosts, every node gets
    # it (rank 0 reads it) and the step count goes on past it
    pulled = json.loads((project / ".thrust" / "fetched" / run_id / "checkpoints.json").read_text())["newest"]
    again = cli("resume", run_id, "--set", "total-steps=4096", "--json", cwd=project)
    assert again.returncode == 0, again.stderr + again.stdout
    out = json.loads(again.stdout)
    assert out["state"] == "FINISHED" and out["resumed_from"] == run_id
    for node in (0, 1):
        assert (_run_dir(net, node, out["run_id"]) / "resume" / pulled).is_file()
    first = json.loads((_run_dir(net, 0, out["run_id"]) / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] > int(pulled.removeprefix("ckpt-").removesuffix(".pt")) > 0


def test_a_queued_run_over_two_hosts_starts_training_when_its_last_node_frees(cli, net, project):
    """Every node queues on its host; node 0's slot is free, node 1's is held by a run of its own: the run
    is QUEUED until node 1 frees, then both nodes rendezvous (node 0 waited there) and train."""
    held = cli("train", "gated", "--host", "n1", "--queue", "--detach", cwd=project)
    assert held.returncode == 0, held.stderr
    holder = _run_id(held.stderr)
    result = cli("train", "ddp", "--host", "pair", "--queue", "--detach", "--no-fetch", cwd=project)
    assert result.returncode == 0, result.stderr + result.stdout
    run_id = _run_id(result.stderr)
    assert "waits in n1's queue (position 1)" in result.stderr
    st = _status(cli, project, run_id)
    assert st["state"] == "QUEUED", st
    assert [(n["host"], n["state"]) for n in st["nodes"]] == [("n0", "RUNNING"), ("n1", "QUEUED")]
    (_run_dir(net, 1, holder) / "go").touch()
    done = cli("wait", run_id, "--timeout", "120", cwd=project)
    assert done.returncode == 0, done.stderr + _node_logs(net, run_id)
    for node in (0, 1):
        seen = json.loads((_run_dir(net, node, run_id) / f"seen-ddp-{node}.json").read_text())
        assert seen["ranks"] == 2.0  # an all_reduce across the two hosts, once both had started


def _node_logs(net: Network, run_id: str) -> str:
    """Every node's log, for an assertion's message: the CLI shows node 0's only."""
    logs = [(node, _run_dir(net, node, run_id) / "log") for node in range(len(net.hosts))]
    return "".join(f"\n--- node {node} log ---\n{log.read_text()[-4000:] if log.exists() else '(none)'}"
                   for node, log in logs)


def test_a_node_other_than_0_that_fails_shows_the_end_of_its_own_log(cli, net, project):
    """`train` follows node 0's log; when node 1 fails first, the end of node 1's log says why."""
    result = cli("train", "quitter", "--host", "pair", "--no-fetch", cwd=project)
    assert result.returncode == 1, result.stderr + result.stdout
    text = result.stderr
    assert "node 1 (n1) failed first: FAILED" in text and "the end of node 1's log:" in text, text
    assert "rank 1 gives up: no shard for it" in text.split("the end of node 1's log:", 1)[1]


def test_a_run_over_two_hosts_reattached_names_the_failed_node_and_ends_as_attached_train_does(cli, net, project):
    """`logs RUN --follow` of a run over two hosts is the attached `train`'s follow: when node 1's worker
    has crashed (node 0 would wait on in its sleep: nothing on node 0 notices), the reattach's watch
    fails the run, stops node 0 FAILED naming node 1, shows the end of node 1's log and exits 1."""
    result = cli("train", "quitter", "--host", "pair", "--detach", cwd=project)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result.stderr)
    _wait(lambda: _status(cli, project, run_id)["nodes"][1]["state"] == "FAILED", 120, "node 1 to fail",
          _run_dir(net, 1, run_id) / "log")
    assert _status(cli, project, run_id)["nodes"][0]["state"] == "RUNNING"  # nobody has told node 0 yet
    # asked about with another config that lacks node 1's host: a clear error naming the config the run
    # was started with (68), never the run reported LOST or its nodes stopped as unreachable
    full = yaml.safe_load((project / "thrust.yaml").read_text())
    del full["hosts"]["n1"], full["groups"]
    other = project.parent / "only-n0.yaml"
    other.write_text(yaml.safe_dump(full))
    for args in (("status", run_id), ("logs", run_id, "--follow"), ("stop", run_id)):
        got = cli("--config", str(other), *args, cwd=project, timeout=60)
        assert got.returncode == 68, got.stderr + got.stdout
        assert "'n1'" in got.stderr and f"--config {project / 'thrust.yaml'}" in got.stderr, got.stderr
        assert "LOST" not in got.stdout + got.stderr and "Traceback" not in got.stderr
    assert _status(cli, project, run_id)["nodes"][0]["state"] == "RUNNING"  # nothing was stopped
    t0 = time.monotonic()
    follow = cli("logs", run_id, "--follow", cwd=project, timeout=120)
    assert follow.returncode == 1, follow.stderr + follow.stdout + _node_logs(net, run_id)
    assert time.monotonic() - t0 < 60  # the watch's first poll, not node 0's 300 s sleep
    text = follow.stderr + follow.stdout
    assert "node 1 (n1) failed first: FAILED" in text and "the end of node 1's log:" in text, text
    assert "rank 1 gives up: no shard for it" in text.split("the end of node 1's log:", 1)[1]
    st = _status(cli, project, run_id)
    assert st["state"] == "FAILED" and st["failed_node"]["node"] == 1, st
    assert [n["state"] for n in st["nodes"]] == ["FAILED", "FAILED"]
    meta0 = json.loads((_run_dir(net, 0, run_id) / "peer-failed.json").read_text())
    assert meta0["node"] == 1 and meta0["host"] == "n1"  # node 0 stopped for node 1, not STOPPED
    # the same end as `--json` gives it, and as the attached train's exit status
    again = cli("logs", run_id, "--follow", "--json", cwd=project, timeout=60)
    assert again.returncode == 1, again.stderr
    out = json.loads(again.stdout)
    assert out["state"] == "FAILED" and out["exit_code"] == 1 and out["failed_node"]["node"] == 1, out


def test_your_own_ddp_script_runs_on_both_nodes_over_their_own_interfaces_and_rank_0s_node_is_node_0(
        cli, net, project):
    """Each node runs the script under torchrun with the other's rendezvous over the interface that routes
    there. torchrun's c10d ranks nodes by address: with n1 (.12) given first, n1 serves the rendezvous and
    n0 (.11) is rank 0, so n0 is node 0. (A group, `--host pair`, is the queued test's.)"""
    result = cli("train", "ddp", "--host", "n1", "--host", "n0", "--no-fetch", cwd=project)
    run_id = _run_id(result.stderr)
    assert result.returncode == 0, result.stderr + result.stdout + _node_logs(net, run_id)
    assert "node 0 (rank 0: its log, checkpoints and model) is n0" in " ".join(result.stderr.split())
    for node in (0, 1):
        run_dir = _run_dir(net, node, run_id)
        seen = json.loads((run_dir / f"seen-ddp-{node}.json").read_text())  # RANK 0 ran on n0
        assert seen["env"]["WORLD_SIZE"] == "2" and seen["env"]["RANK"] == str(node)
        assert seen["ranks"] == 2.0  # an all_reduce across the two hosts
        meta = json.loads((run_dir / "run.json").read_text())
        assert meta["node"] == node
        assert meta["env"]["GLOO_SOCKET_IFNAME"] == "eth0"  # the interface that routes to the rendezvous
        assert meta["rdzv"].startswith(net.hosts[1].ip + ":")  # n1, given first, serves the rendezvous
        assert f"--local-addr={net.hosts[node].ip}" in meta["argv"] and "--nnodes=2" in meta["argv"]
        assert f"--rdzv-conf=is_host={'true' if node == 1 else 'false'}" in meta["argv"]
    st = _status(cli, project, run_id)
    assert [n["host"] for n in st["nodes"]] == ["n0", "n1"] and st["host"] == "n0"


SHIM = """\
import importlib.abc, sys


class _Patch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            module.__version__ = "2.4.0"

        spec.loader.exec_module = exec_module
        return spec


import importlib.util
sys.meta_path.insert(0, _Patch())
"""


def _older_torch_python(where: Path) -> Path:
    """A python whose torch says it is 2.4.0: the same torch, its version patched at import."""
    subprocess.run([str(VENV_BIN / "python"), "-m", "venv", "--without-pip", str(where)], check=True)
    site = next(where.glob("lib/python3*/site-packages"))
    real = next((VENV_BIN.parent).glob("lib/python3*/site-packages"))
    (site / "real.pth").write_text(f"{real}\n")
    (site / "older_torch.py").write_text(SHIM)
    (site / "older_torch.pth").write_text("import older_torch\n")
    return where / "bin" / "python"


def test_nodes_with_different_torch_are_refused_before_anything_starts(cli, net, project, tmp_path):
    older = _older_torch_python(tmp_path / "older")
    config = net.yaml(tmp_path / "thrust.yaml", rest=JOBS, extra={1: f"python: {older}"})
    before = [set((h.workdir / ".thrust" / "runs").glob("*")) for h in net.hosts]
    result = cli("--config", str(config), "train", "ddp", "--host", "pair", cwd=project)
    assert result.returncode == 69, result.stderr
    text = " ".join(result.stderr.split())
    assert "do not agree on torch" in text and "2.4.0 on n1 (node 1)" in text and "on n0 (node 0)" in text
    assert "launching" not in text and "setting up the host's python" not in text
    assert [set((h.workdir / ".thrust" / "runs").glob("*")) for h in net.hosts] == before


# ~20 s quiet: a node that cannot reach node 0 is only known by waiting out the reach check's timeout.
def test_doctor_over_two_hosts_shows_each_node_reaching_node_0_and_the_interface(cli, net, project, tmp_path):
    result = cli("doctor", "--host", "pair", "--json", cwd=project)
    reports = json.loads(result.stdout)
    assert [r["host"] for r in reports] == ["n0", "n1"]
    port = next(c for c in reports[0]["checks"] if c["id"] == "rdzv-port")
    reach = next(c for c in reports[1]["checks"] if c["id"] == "rdzv-reach")
    assert port["status"] == "ok" and reach["status"] == "ok", reach
    assert f"at {net.hosts[0].ip}:" in reach["detail"] and "through eth0" in reach["detail"]
    # node 0 announced at an address nobody has: node 1's row fails, with the fix
    bad = net.yaml(tmp_path / "thrust.yaml", rest=JOBS, extra={0: f"rdzv_address: {net.subnet}.250"})
    result = cli("--config", str(bad), "doctor", "--host", "n0", "--host", "n1", "--json", cwd=project)
    assert result.returncode == 1
    reach = next(c for c in json.loads(result.stdout)[1]["checks"] if c["id"] == "rdzv-reach")
    assert reach["status"] == "fail" and "rdzv_address:" in reach["fix"]


# ~12-20 s quiet: two trainings over two hosts, the first attempt killed at step 2048 by the trainer's
# fault injection and torchrun's restart of both nodes: the restart is the subject.
def test_max_restarts_restarts_every_node_from_node_0s_checkpoint(cli, net, project):
    """The first attempt checkpoints and exits at step 2048 on every rank (trainer's fault injection);
    torchrun restarts both nodes, and node 1, which has no checkpoint of its own, resumes with node 0's."""
    result = cli("train", "crashy", "--host", "pair", "--max-restarts", "1", "--no-fetch", cwd=project)
    assert result.returncode == 0, result.stderr + result.stdout
    run_id = _run_id(result.stderr)
    log = (_run_dir(net, 0, run_id) / "log").read_text()
    resumed = [json.loads(x.split(" ", 1)[1]) for x in log.splitlines() if x.startswith("THRUST_INFO ")
               and "resumed_from" in x]
    assert resumed and resumed[0]["step"] == 2048
    done = [json.loads(x.split(" ", 1)[1]) for x in log.splitlines() if x.startswith("THRUST_DONE ")]
    assert done and done[-1]["step"] == 4096
    assert not (_run_dir(net, 1, run_id) / "checkpoints").exists() or \
        not any((_run_dir(net, 1, run_id) / "checkpoints").iterdir())


def test_a_killed_node_fails_the_run_and_stops_the_other(cli, net, project):
    result = cli("train", "long", "--host", "n0", "--host", "n1", "--detach", cwd=project)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result.stderr)
    log0 = _run_dir(net, 0, run_id) / "log"
    _wait(lambda: log0.exists() and "THRUST_METRICS" in log0.read_text(), 120, "both nodes training")
    pid = json.loads((_run_dir(net, 1, run_id) / "run.json").read_text())["pid"]
    killed = time.monotonic()
    net.kill_children(1, pid)  # node 1's workers crash (torchrun, their launcher, then fails the node)
    st = _wait(lambda: (s := _status(cli, project, run_id))["nodes"][0]["state"] != "RUNNING" and s, 60,
               "node 0 to stop", log0)
    assert time.monotonic() - killed < 35
    assert st["state"] == "FAILED"
    assert st["failed_node"]["node"] == 1 and st["failed_node"]["host"] == "n1"
    assert [n["state"] for n in st["nodes"]] == ["FAILED", "FAILED"]
    text = cli("status", run_id, cwd=project).stdout
    assert "n1" in text and "FAILED" in text


# ~25 s quiet: the link is cut while both nodes train, and the promise tested is the product's own
# deadline (a silent node is lost within ~20 s): the test has to wait it out.
def test_a_lost_link_fails_the_run_within_30_s_and_the_cli_names_the_lost_node(cli, net, project):
    runs_dir = net.hosts[0].workdir / ".thrust" / "runs"
    before = set(runs_dir.glob("long-*"))
    follow = subprocess.Popen([str(VENV_BIN / "thrust-remote"), "train", "long", "--host", "pair", "--no-fetch"],
                              cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log0 = _wait(lambda: next((p / "log" for p in set(runs_dir.glob("long-*")) - before
                                   if (p / "log").exists() and "THRUST_METRICS" in (p / "log").read_text()), None),
                     120, "both nodes training")
        run_id = log0.parent.name
        net.link_down(1)
        cut = time.monotonic()
        try:
            out, err = follow.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            follow.kill()
            out, err = follow.communicate()
            raise AssertionError(f"train did not end: {err}\n{out[-3000:]}") from None
    finally:
        follow.kill()
    assert time.monotonic() - cut < 40, err
    assert follow.returncode not in (0, None)
    assert "node 1 (n1)" in err + out, err
    state0 = json.loads(subprocess.run(
        [str(VENV_BIN / "python"), "-m", "thrust_remote.agent", "status", "--run-dir", str(log0.parent)],
        capture_output=True, text=True, check=True).stdout)
    assert state0["state"] == "FAILED" and state0["peer_failed"]["node"] == 1
    assert run_id in err + out


def test_two_nodes_on_one_machine_rank_in_the_order_given_and_bring_the_model_back(cli, sshd, tmp_path):
    """Loopback nodes (one sshd, two workdirs): each gets its own 127/8 address, so torchrun ranks
    them as given, and node 0 (rank 0) exports the model that comes back."""
    proj = tmp_path / "loop"
    proj.mkdir()
    first = sshd.thrust_yaml(tmp_path / "a.yaml", name="a", workdir=str(tmp_path / "wa"))
    second = sshd.thrust_yaml(tmp_path / "b.yaml", name="b", workdir=str(tmp_path / "wb"))
    hosts_b = second.read_text().split("hosts:\n", 1)[1]
    (proj / "thrust.yaml").write_text(first.read_text() + hosts_b)
    for args in (["init", "-q"], ["config", "user.email", "t@example.com"], ["config", "user.name", "t"],
                 ["add", "-A"], ["commit", "-q", "-m", "loop"]):
        subprocess.run(["git", "-C", str(proj), *args], check=True)
    result = cli("train", "cartpole", "--host", "a", "--host", "b", "--set", "total-steps=1024",
                 "--set", "num-envs=8", "--set", "target-return=0", cwd=proj)
    assert result.returncode == 0, result.stderr + result.stdout
    run_id = _run_id(result.stderr)
    assert "ranks the nodes by address" not in result.stderr
    meta = [json.loads((tmp_path / w / ".thrust" / "runs" / run_id / "run.json").read_text()) for w in ("wa", "wb")]
    assert "--local-addr=127.100.0.1" in meta[0]["argv"] and "--local-addr=127.101.0.1" in meta[1]["argv"]
    assert (proj / "web" / "public" / "cartpole.onnx").is_file()
