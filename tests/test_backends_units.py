"""The backend seam in this process (thrust_remote/backends/): the one table from a host's config to its
backend, and the one model of a run's nodes, whether hosts of their own or nodes a cluster's scheduler
gave one run (the real hosts and cluster: test_backends.py, test_slurm*.py, test_multinode*.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from thrust_remote.backends import RunNodes, backend_for, direct, slurm
from thrust_remote.core.config import parse_config_text
from thrust_remote.core.errors import UsageError
from thrust_remote.run.lifecycle import check_node, check_request
from thrust_remote.run.vocab import TrainRequest

CONFIG = """default_host: box
hosts:
  box:
    address: me@box
  box2:
    address: me@box2
  hpc:
    address: me@login
    scheduler: slurm
jobs:
  j:
    command: [echo, hi]
"""


def _config(tmp_path: Path):
    return parse_config_text(CONFIG, tmp_path / "thrust.yaml")


class _Session:
    """What the node model reads of a session: its host's name (and the host, for a start)."""

    def __init__(self, name: str, host: object = None) -> None:
        self.name, self.host = name, host


def test_the_one_table_gives_a_scheduler_host_its_backend_and_every_other_host_the_direct_one(tmp_path):
    config = _config(tmp_path)
    assert backend_for(config.hosts["box"]) is direct.BACKEND
    assert backend_for(config.hosts["local"]) is direct.BACKEND
    assert backend_for(config.hosts["hpc"]) is slurm.BACKEND
    # what generic code reads of them, never their kind
    assert direct.BACKEND.continues_on == () and set(slurm.BACKEND.continues_on) == {"timeout", "preempted"}
    assert direct.BACKEND.fields({"scheduler_job": "7"}) == {}
    assert slurm.BACKEND.fields({"scheduler_job": "7"}) == {"slurm_job": "7"}  # `status`'s slurm_job=7


def test_each_backend_checks_its_own_hosts_before_anything_connects(tmp_path):
    config = _config(tmp_path)
    job = config.jobs["j"]
    with pytest.raises(UsageError) as exc:  # --nodes on SSH boxes: the same words as ever
        check_request(TrainRequest(job=job, host=config.hosts["box"], nodes=2), [config.hosts["box"]])
    assert exc.value.message == "--nodes 2: nodes are a Slurm cluster's to give (box is not one)"
    with pytest.raises(UsageError) as exc:  # a cluster beside an SSH box: the cluster says why, whatever --nodes
        check_request(TrainRequest(job=job, host=config.hosts["box"], nodes=2),
                      [config.hosts["box"], config.hosts["hpc"]])
    assert exc.value.message.startswith("hpc is a Slurm cluster: a run there is one host")
    check_request(TrainRequest(job=job, host=config.hosts["box"], gpus="0,1"), [config.hosts["box"]])
    check_request(TrainRequest(job=job, host=config.hosts["hpc"], gpus="2"), [config.hosts["hpc"]])


def test_a_run_over_hosts_has_a_node_per_host_each_with_its_own_run_dir():
    a, b = _Session("a"), _Session("b")
    nodes = RunNodes.on_hosts("r", ["a", "b"], [a, None])  # type: ignore[list-item]
    assert nodes.many and nodes.names == ["a", "b"] and nodes.sessions == [a, None]
    assert [(n.host, n.part) for n in nodes.nodes] == [("a", ""), ("b", "")]  # each host's run dir itself
    assert nodes.watched() is nodes  # the laptop watches every node
    assert check_node(nodes, 1) == 1
    with pytest.raises(UsageError) as exc:
        check_node(nodes, 2)
    assert exc.value.message == "--node 2: run r has 2 nodes (a, b)"
    one = RunNodes.on_hosts("r", ["a"], [a])  # type: ignore[list-item]
    assert not one.many
    with pytest.raises(UsageError) as exc:
        check_node(one, 1)
    assert exc.value.message == "--node 1: run r ran on one host (a)"
    del b


def _cluster_status(**extra: Any) -> dict[str, Any]:
    """A login node's status answer for a run over two Slurm nodes (the agent's wire, unchanged)."""
    return {"run_id": "r", "state": "RUNNING", "host": "hpc", **extra,
            "slurm_nodes": [{"node": 0, "slurm_node": "n0", "state": "RUNNING"},
                            {"node": 1, "slurm_node": None, "state": "RUNNING"}]}


def test_a_cluster_run_has_its_schedulers_nodes_on_one_host_each_in_its_part_of_the_run_dir():
    hpc = _Session("hpc")
    nodes = slurm.BACKEND.nodes("r", hpc, _cluster_status())  # type: ignore[arg-type]
    assert nodes is not None and nodes.together and not nodes.many
    assert nodes.names == ["n0", "node 1"]  # Slurm's name, else the node's number
    assert [(n.host, n.session, n.part) for n in nodes.nodes] == [("hpc", hpc, ""), ("hpc", hpc, "nodes/1")]
    assert nodes.watched().nodes == nodes.nodes[:1]  # its scheduler ends them together: the host alone
    assert check_node(nodes, 1) == 1
    with pytest.raises(UsageError) as exc:
        check_node(nodes, 2)
    assert exc.value.message == "--node 2: run r has 2 nodes (n0, node 1)"
    # a run the host ran alone, and any host of the direct backend: no nodes of a scheduler's
    assert slurm.BACKEND.nodes("r", hpc, {"run_id": "r", "state": "RUNNING"}) is None  # type: ignore[arg-type]
    assert direct.BACKEND.nodes("r", hpc, _cluster_status()) is None  # type: ignore[arg-type]


def test_status_lists_a_cluster_runs_nodes_as_a_run_over_hosts_lists_its_own():
    shown = slurm.BACKEND.shown(_cluster_status(), "hpc")  # type: ignore[arg-type]
    assert "slurm_nodes" not in shown
    assert shown["nodes"] == [{"node": 0, "slurm_node": "n0", "state": "RUNNING", "host": "hpc"},
                              {"node": 1, "slurm_node": None, "state": "RUNNING", "host": "hpc"}]
    assert [slurm.BACKEND.node_label(n) for n in shown["nodes"]] == ["n0", "hpc"]
    assert direct.BACKEND.node_label({"node": 1, "host": "b", "slurm_node": "x"}) == "b"
    plain = {"run_id": "r", "state": "FINISHED"}
    assert slurm.BACKEND.shown(plain, "hpc") is plain  # type: ignore[arg-type]


def test_optimize_slots_come_from_the_hosts_backend(tmp_path):
    config = _config(tmp_path)
    facts = {"gpus": [{"index": 0}, {"index": 1}]}
    assert slurm.BACKEND.slots(facts, config.hosts["hpc"], "2", 3, 1) == [("job0", (0, 1)), ("job1", (0, 1)),
                                                                         ("job2", (0, 1))]
    with pytest.raises(UsageError):
        slurm.BACKEND.slots(facts, config.hosts["hpc"], "0,1", None, 1)
    assert direct.BACKEND.slots({}, config.hosts["box"], None, 2, 1) == [("cpu0", ()), ("cpu1", ())]


def test_the_launch_refusal_is_explained_in_the_clusters_words_and_only_there(tmp_path):
    config = _config(tmp_path)
    hpc = config.hosts["hpc"]
    said = slurm.BACKEND.explain({"error": "sbatch", "detail": "invalid partition"}, "r", hpc)
    assert said is not None and said.message == "Slurm refused run r on hpc: invalid partition"
    assert said.exit_code == 69 and "doctor" in (said.hint or "")
    assert slurm.BACKEND.explain({"error": "gpus-taken"}, "r", hpc) is None  # the generic refusals' own
    assert direct.BACKEND.explain({"error": "sbatch", "detail": "x"}, "r", config.hosts["box"]) is None


def test_a_train_request_is_checked_once_before_anything_connects(tmp_path, monkeypatch):
    """handle.train checks the request before the sessions are opened; the run's start does not again
    (it ran twice: issue 52, "the launch path bounces")."""
    from contextlib import contextmanager

    from thrust_remote.run import handle, lifecycle, stages
    from thrust_remote.run.vocab import NullReporter

    config = _config(tmp_path)
    checks: list[object] = []
    real = lifecycle.check_request
    monkeypatch.setattr(lifecycle, "check_request", lambda *a, **k: checks.append(a) or real(*a, **k))

    class Stop(Exception):
        pass

    def stop(*_a: object, **_k: object) -> None:
        raise Stop

    monkeypatch.setattr(stages, "check", stop)  # the first stage that would reach the host

    class _Fleet:
        config_path = None

        def __init__(self) -> None:
            self.config = config

        @contextmanager
        def sessions(self, hosts):  # noqa: ANN001, ANN202 - the one call handle.train makes
            yield [_Session(h.name, h) for h in hosts]

    host = config.hosts["box"]
    with pytest.raises(Stop):
        handle.train(_Fleet(), TrainRequest(job=config.jobs["j"], host=host), [host], NullReporter())  # type: ignore[arg-type]
    assert len(checks) == 1


def test_a_train_reads_its_params_file_once(tmp_path, monkeypatch):
    """The run's parameters are read once, for its arguments and for the local index alike (the file
    was read twice: issue 52, "the launch path bounces"); every stage that would reach a host is stubbed."""
    from types import SimpleNamespace

    from thrust_remote.run import arguments, lifecycle, stages
    from thrust_remote.run.vocab import Launched, NullReporter
    from thrust_remote.runs import control, trees

    config = _config(tmp_path)
    host = config.hosts["box"]
    params = tmp_path / "best.yaml"
    params.write_text("lr: 0.5\n")
    reads: list[Path] = []
    real = arguments.load_params  # the request's arguments are resolved in arguments.py (arguments.resolve)
    monkeypatch.setattr(arguments, "load_params", lambda path: reads.append(path) or real(path))
    session = _Session("box", host)
    session.paths = SimpleNamespace(workdir="/w")  # type: ignore[attr-defined]
    facts = SimpleNamespace(facts={})
    monkeypatch.setattr(stages, "check", lambda *a, **k: SimpleNamespace(session=session, report=facts))
    monkeypatch.setattr(stages, "set_up", lambda c, r: SimpleNamespace(session=session, host=host, report=facts,
                                                                       local=None))
    monkeypatch.setattr(control, "list_runs", lambda s: [])
    monkeypatch.setattr(trees, "keep_policy", lambda *a, **k: None)
    monkeypatch.setattr(stages, "launch_prepared", lambda prepared, *a, **k: Launched(
        "j-1", "/w/.thrust/runs/j-1", 1, "box", "j", None, None, None, False, {}))  # type: ignore[arg-type]
    request = TrainRequest(job=config.jobs["j"], host=host, params_file=params, detach=True, run_id="j-1")
    lifecycle.train(config, request, [session], NullReporter())  # type: ignore[list-item]
    assert reads == [params]
