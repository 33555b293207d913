"""Runs over several hosts, the parts that need no network: the torchrun argv of a node, the run's
state over its nodes, the nodes' agreement, groups in thrust.yaml, the agent's network answers."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from thrust_remote.agent import netinfo
from thrust_remote.core.config import HostConfig, JobConfig, parse_config_text
from thrust_remote.core.errors import ConfigError, ExitCode, ThrustError, UsageError
from thrust_remote.run import multinode
from thrust_remote.run.jobs import Rendezvous, job_argv

HOSTS = """\
hosts:
  a: {address: u@10.0.0.1, rdzv_address: 10.0.0.1, rdzv_port: 29500, ifname: eth0}
  b: {address: u@10.0.0.2}
  c: {address: u@10.0.0.3}
groups:
  pair: [a, b]
"""


def test_a_node_runs_torchrun_with_the_c10d_rendezvous_at_node_0():
    rdzv = Rendezvous(nnodes=2, node_rank=1, address="10.0.0.1", port=29500, run_id="r1", local_addr="10.0.0.2")
    argv = job_argv(JobConfig(name="ddp", kind="python", script="train.py"), "/v/bin/python", ["--x", "1"],
                    run_dir="/w/r1", nproc=1, rdzv=rdzv)
    assert argv[:4] == ["/v/bin/python", "-u", "-m", "torch.distributed.run"]
    assert "--standalone" not in argv
    assert not any(a.startswith("--node-rank") for a in argv)  # c10d ignores it, with a warning
    for flag in ("--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29500",
                 "--rdzv-id=r1", "--rdzv-conf=is_host=false", "--local-addr=10.0.0.2", "--nproc-per-node=1"):
        assert flag in argv
    assert argv[-3:] == ["train.py", "--x", "1"]
    six = Rendezvous(nnodes=2, node_rank=0, address="fd00::1", port=1, run_id="r", is_host=True)
    assert "--rdzv-endpoint=[fd00::1]:1" in six.argv() and "--rdzv-conf=is_host=true" in six.argv()


def test_nodes_are_numbered_in_torchruns_rank_order_which_is_by_address():
    given = multinode.Plan("10.0.0.9", 29500, ("eth0", "eth1", "eth2"), ("10.0.0.9", "10.0.0.10", None),
                           (("10.0.0.9", 22), ("10.0.0.10", 22), ("10.0.0.11", 22)))
    assert given.order() == [1, 0, 2]  # "10.0.0.10" < "10.0.0.9" as strings; unknown last
    ranked = given.ranked()
    assert ranked.ifnames == ("eth1", "eth0", "eth2") and ranked.rdzv_host == 1
    assert ranked.rendezvous(1, "r", 0).is_host and not ranked.rendezvous(0, "r", 0).is_host
    assert ranked.rendezvous(0, "r", 0).local_addr == "10.0.0.10"


def test_groups_expand_in_node_order_and_a_host_named_twice_is_refused():
    config = parse_config_text(HOSTS)
    assert [h.name for h in config.host_list(["pair", "c"])] == ["a", "b", "c"]
    assert config.hosts["a"].rdzv_port == 29500 and config.hosts["a"].ifname == "eth0"
    with pytest.raises(UsageError, match="named twice"):
        config.host_list(["pair", "a"])
    with pytest.raises(UsageError, match="group of hosts"):
        config.host("pair")


@pytest.mark.parametrize(("text", "expected"), [
    ("groups: {g: [a, zz]}\n", "groups.g: 'zz' is not a host"),
    ("groups: {a: [b]}\n", "also a host's name"),
    ("groups: {g: [a, a]}\n", "listed twice"),
    ("  d: {address: u@x, rdzv_port: 70000}\n", "rdzv_port: expected a TCP port"),
    ("  d: {address: u@x, ifname: 'eth0;rm'}\n", "ifname: expected a network interface name"),
])
def test_bad_groups_and_network_keys_name_the_line(text, expected):
    base = HOSTS.replace("groups:\n  pair: [a, b]\n", "")  # ends inside `hosts:`: "  d:" adds a host
    with pytest.raises(ConfigError, match=expected) as info:
        parse_config_text(base + text)
    assert "<config>:" in str(info.value)


def _node(state: str, code: int | None = None, ended: float | None = None, verdict: dict | None = None) -> dict:
    return {"run_id": "r", "job": "j", "state": state, "exit_code": code, "ended_ts": ended, "pid": 1,
            **({"peer_failed": verdict} if verdict else {})}


def test_the_run_is_running_finished_or_failed_naming_the_node_that_failed_first():
    names = ["a", "b", "c"]
    assert multinode.aggregate(names, [_node("RUNNING")] * 3)["state"] == "RUNNING"
    assert multinode.aggregate(names, [_node("FINISHED", 0)] * 3)["state"] == "FINISHED"
    st = multinode.aggregate(names, [_node("FAILED", 143, 20.0), _node("FAILED", 1, 10.0), _node("RUNNING")])
    assert st["state"] == "FAILED" and st["failed_node"]["node"] == 1 and st["exit_code"] == 1
    # node 1 unreachable and node 0 stopped itself for it: node 1 is the one that failed
    lost = {"node": 1, "host": "b", "why": "10.0.0.2:22 unreachable for 15 s"}
    st = multinode.aggregate(names, [_node("FAILED", 143, 5.0, lost), None, _node("FAILED", 143, 6.0)])
    assert st["failed_node"] == lost and st["nodes"][1]["state"] == "UNREACHABLE"
    # one node that does not answer right now is not yet a failure
    assert multinode.aggregate(names, [_node("RUNNING"), None, _node("RUNNING")])["state"] == "RUNNING"
    assert multinode.aggregate(names, [_node("STOPPED", 143)] * 3)["state"] == "STOPPED"


@dataclass
class _Report:
    facts: dict


@dataclass
class _Paths:
    workdir: str


@dataclass
class _Session:
    name: str
    paths: _Paths = field(default_factory=lambda: _Paths("~/thrust"))

    @property
    def host(self) -> HostConfig:
        return HostConfig(name=self.name, address=f"u@{self.name}")


@dataclass
class _Checked:
    session: _Session
    report: _Report


def _checked(name: str, **facts) -> _Checked:
    base = {"torch": "2.13.0", "cuda_available": False, "python": "3.11.7", "hostname": name}
    return _Checked(_Session(name), _Report({**base, **facts}))


def test_nodes_that_disagree_on_torch_are_refused_with_69_naming_each():
    multinode.agree([_checked("a"), _checked("b", python="3.11.9")])  # patch releases may differ
    with pytest.raises(ThrustError) as info:
        multinode.agree([_checked("a"), _checked("b", torch="2.4.0")])
    assert info.value.exit_code == ExitCode.UNAVAILABLE
    assert "2.13.0 on a (node 0)" in str(info.value) and "2.4.0 on b (node 1)" in str(info.value)
    with pytest.raises(ThrustError, match="CUDA"):
        multinode.agree([_checked("a"), _checked("b", cuda_available=True)])
    with pytest.raises(UsageError, match="one machine with one workdir"):
        multinode.agree([_checked("a"), _checked("b", hostname="a")])


def test_only_trainer_and_python_jobs_span_hosts_and_local_is_no_node():
    config = parse_config_text(HOSTS)
    hosts = config.host_list(["pair"])
    command = multinode.TrainRequest(job=JobConfig(name="x", kind="command", command=("sh",)), host=hosts[0])
    with pytest.raises(UsageError, match="command job"):
        multinode.check_request(command, hosts)
    trainer = multinode.TrainRequest(job=JobConfig(name="t"), host=hosts[0])
    with pytest.raises(UsageError, match="local"):
        multinode.check_request(trainer, [hosts[0], parse_config_text("").host("local")])


def test_the_agent_finds_the_interface_of_its_own_address_and_a_free_port():
    own = netinfo.route_dev("127.0.0.1")
    assert own["local"] is True and own["dev"] == "lo"
    port = netinfo.free_port("127.0.0.1")["port"]
    assert port > 0
    assert "not an address of this host" in netinfo.free_port("203.0.113.77")["error"]


def test_the_agent_listens_and_reaches_like_doctor_does():
    import threading

    port = netinfo.free_port("0.0.0.0")["port"]
    heard: dict = {}
    listener = threading.Thread(target=lambda: heard.update(netinfo.listen(port, 1, 10.0)))
    listener.start()
    answer = netinfo.reach("127.0.0.1", port, 5.0)  # retried while the listener is not up yet
    listener.join()
    assert answer["ok"] is True and answer["dev"] == "lo"
    assert heard["accepted"] == ["127.0.0.1"]
    closed = netinfo.reach("127.0.0.1", netinfo.free_port("127.0.0.1")["port"], 0.5)
    assert closed["ok"] is False and closed["error"] == "connection refused"


def test_max_restarts_on_one_host_is_refused_not_ignored(cli, tmp_path):
    result = cli("train", "cartpole", "--max-restarts", "2", cwd=tmp_path)
    assert result.returncode == ExitCode.USAGE
    assert "several hosts" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / ".thrust").exists()  # refused before anything ran


# ------------------------------------------------------------------ the plan, asked beside the set-up

def _a_plan(port: int) -> multinode.Plan:
    return multinode.Plan("10.0.0.1", port, ("eth0", "eth0"), ("10.0.0.1", "10.0.0.2"),
                          (("10.0.0.1", 22), ("10.0.0.2", 22)))


def test_a_plan_asked_ahead_is_the_plan_and_its_error_reaches_the_launch(monkeypatch):
    import threading

    gate = threading.Event()

    def slow_plan(sessions, reporter):
        gate.wait(10)  # the set-up goes on meanwhile: result() waits for it
        return _a_plan(29500)

    monkeypatch.setattr(multinode, "plan", slow_plan)
    ahead = multinode.PlanAhead(["s0", "s1"], None)
    gate.set()
    assert ahead.result() == _a_plan(29500)

    def refused(sessions, reporter):
        raise UsageError("the rendezvous host (a) is reached at 127.0.0.1, which the other nodes cannot use")

    monkeypatch.setattr(multinode, "plan", refused)
    with pytest.raises(UsageError, match="rendezvous host"):  # raised where the launch takes the plan
        multinode.PlanAhead(["s0", "s1"], None).result()


def test_a_plan_taken_long_after_it_was_asked_gets_its_port_asked_again(monkeypatch):
    asked: list[tuple[str, str]] = []
    monkeypatch.setattr(multinode, "plan", lambda sessions, reporter: _a_plan(29500))
    monkeypatch.setattr(multinode, "rendezvous_port", lambda head, address: asked.append((head, address)) or 29611)
    fresh = multinode.PlanAhead(["s0", "s1"], None)
    assert fresh.result().port == 29500 and asked == []  # taken at once: the port found free stands
    stale = multinode.PlanAhead(["s0", "s1"], None)
    stale._asked -= multinode.PlanAhead.FRESH_S + 1  # as if a venv was built in between
    assert stale.result() == _a_plan(29611) and asked == [("s0", "10.0.0.1")]


def test_once_the_followed_node_finished_a_node_still_tearing_down_is_asked_again_not_counted_running(
        monkeypatch):
    """Node 0 FINISHED; node 1's processes take a moment more to exit: its RUNNING is asked again until it
    ends (the run FINISHED, exit 0), within END_GRACE_S; one still going after that stays RUNNING."""
    answers = iter([[None, {"state": "RUNNING"}], [None, {"state": "RUNNING"}], [None, {"state": "FINISHED"}]])
    monkeypatch.setattr(multinode, "node_states", lambda sessions, run_id: next(answers))
    now = [0.0]
    got = multinode.states_at_end([object(), object()], "r1", 0, clock=lambda: now[0],
                                  sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert got == [None, {"state": "FINISHED"}] and now[0] == 2 * multinode.END_POLL_S
    assert multinode.aggregate(["a", "b"], [{"state": "FINISHED"}, got[1]])["state"] == "FINISHED"
    monkeypatch.setattr(multinode, "node_states", lambda sessions, run_id: [None, {"state": "RUNNING"}])
    now[0] = 0.0
    stuck = multinode.states_at_end([object(), object()], "r1", 0, clock=lambda: now[0],
                                    sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert stuck[1]["state"] == "RUNNING" and now[0] >= multinode.END_GRACE_S


def test_a_followed_node_that_stopped_stops_the_others_and_waits_for_them_not_a_running_run(monkeypatch):
    """Node 0 ended STOPPED (its max_duration:) before node 1's own stop came: node 1 is told to stop
    (no verdict: a stop, not a failure) and asked until it ends, so the run is STOPPED for node 0's
    reason, never `ended RUNNING (exit code 1)` (seen on a busy machine). A FAILED node 0 stops nobody
    here: the caller names what failed."""
    stopped: list[tuple[list, object]] = []
    monkeypatch.setattr(multinode, "stop_all", lambda sessions, run_id, verdict: stopped.append((sessions, verdict)))
    answers = iter([[None, {"state": "RUNNING"}], [None, {"state": "STOPPED", "reason": "user"}]])
    monkeypatch.setattr(multinode, "node_states", lambda sessions, run_id: next(answers))
    monkeypatch.setattr(multinode, "END_POLL_S", 0.0)
    s0, s1 = object(), object()
    got = multinode.others_at_end([s0, s1], "r1", 0, "STOPPED", None)
    assert stopped == [([s1], None)] and got == [None, {"state": "STOPPED", "reason": "user"}]
    node0 = {"state": "STOPPED", "exit_code": 143, "reason": "max-duration", "reason_detail": "its max_duration"}
    run = multinode.aggregate(["a", "b"], [node0, got[1]])
    assert (run["state"], run["reason"]) == ("STOPPED", "max-duration")
    stopped.clear()
    monkeypatch.setattr(multinode, "node_states", lambda sessions, run_id: [None, {"state": "RUNNING"}])
    assert multinode.others_at_end([s0, s1], "r1", 0, "FAILED", None) == [None, {"state": "RUNNING"}]
    assert stopped == []
