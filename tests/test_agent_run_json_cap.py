"""A run's JSON files are read up to RUN_JSON_MAX by the agent, a Slurm run's as any other's
(docs/architecture.md, "Security"): agent/runjson.py is the one reader. A Slurm run's files used to go
through agent/slurm.py's own reader, without the cap: a node's run.json of megabytes was read whole
and its contents taken as the node's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thrust_remote.agent import slurm
from thrust_remote.agent.protocol import RUN_JSON_MAX
from thrust_remote.host import payload

PADDING = "x" * (2 << 20)  # twice the cap


@pytest.fixture(scope="module")
def pyz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("agent") / "agent.pyz"
    path.write_bytes(payload.agent().data)
    return path


def _agent(pyz: Path, *args: str) -> object:
    # -I: isolated, as on a host where thrust_remote is not importable
    done = subprocess.run([sys.executable, "-I", str(pyz), *args], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _slurm_run(runs: Path, run_id: str, nodes: int, **extra: object) -> Path:
    """A Slurm run's directory as its supervisors leave it after a finished job: its run.json, its end,
    and the scheduler's last word kept (so no squeue is asked)."""
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    now = time.time()
    meta = {"run_id": run_id, "job": "j", "pid": 4241, "started_ts": now - 60, "started_at": "2026-12-01T00:00:00Z",
            "scheduler": {"kind": "slurm", "job_id": "77", "nodes": nodes, "submitted_ts": now - 70}, **extra}
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_at": "2026-12-01T00:01:00Z",
                                                   "ended_ts": now}))
    (run_dir / slurm.END).write_text(json.dumps({"state": "COMPLETED", "reason": ""}))
    return run_dir


def test_a_slurm_nodes_run_json_over_the_cap_is_refused_like_a_runs_own(pyz, tmp_path):
    """status of a run over two of a cluster's nodes whose node 1 left a run.json of 2 MB: not read (its
    pid is not taken from it), and the answer says where (`oversize`), which the laptop refuses (74)."""
    run_dir = _slurm_run(tmp_path / "runs", "two-nodes", 2)
    node1 = run_dir / "nodes" / "1"
    node1.mkdir(parents=True)
    (node1 / "run.json").write_text(json.dumps({"pid": 4242, "slurm_node_name": "n1", "padding": PADDING}))
    (node1 / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_at": "2026-12-01T00:01:00Z"}))
    st = _agent(pyz, "status", "--run-dir", str(run_dir))
    assert isinstance(st, dict)
    assert st["oversize"] == str(node1 / "run.json"), st
    parts = {p["node"]: p for p in st["slurm_nodes"]}
    assert parts[1]["pid"] is None and parts[1]["slurm_node"] is None and parts[1]["oversize"] == st["oversize"]
    assert parts[0]["pid"] == 4241 and "oversize" not in parts[0]


def test_a_slurm_runs_own_run_json_over_the_cap_is_refused_by_status_and_list(pyz, tmp_path):
    runs = tmp_path / "runs"
    big = _slurm_run(runs, "big", 1, padding=PADDING)
    _slurm_run(runs, "small", 1)
    st = _agent(pyz, "status", "--run-dir", str(big))
    assert isinstance(st, dict) and st["oversize"] == str(big / "run.json") and st["pid"] is None
    listed = _agent(pyz, "list", "--runs-dir", str(runs))
    assert isinstance(listed, list)
    by_id = {r["run_id"]: r for r in listed}
    assert by_id["big"]["oversize"] == str(big / "run.json")
    assert "oversize" not in by_id["small"] and by_id["small"]["state"] == "FINISHED"


def test_a_slurm_runs_run_json_over_the_cap_is_never_read_whole_to_be_updated(tmp_path):
    """The login node records the job id, the allocation the pid, each by reading run.json, changing it
    and writing it whole: one past the cap is refused, not read whole nor written over as if empty."""
    run_dir = _slurm_run(tmp_path / "runs", "big", 1, padding=PADDING)
    before = (run_dir / "run.json").read_bytes()
    assert len(before) > RUN_JSON_MAX
    with pytest.raises(OSError, match="not read"):
        slurm.update_meta(str(run_dir), {"pid": 9}, job_id="78")
    assert (run_dir / "run.json").read_bytes() == before
