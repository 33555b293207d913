"""The agent's one seam to a cluster's scheduler (agent/scheduled.py): run.json's `scheduler.kind` names
the module that speaks to it, the run modules ask the table and name no scheduler themselves, and a
kind's modules are imported only for a run of that kind."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from import_graph import AGENT, ROOT, agent_imports, import_circle

from thrust_remote.agent import scheduled, slurm
from thrust_remote.agent.__main__ import main as agent_main


def test_the_run_modules_name_no_scheduler_but_through_the_table():
    """Slurm's words live in the agent's Slurm modules (slurm*.py); elsewhere only the seam's one table
    entry and the doctor's subcommand names (the wire) spell them."""
    allowed = {("scheduled.py", 'KINDS: dict[str, Kind] = {"slurm": Kind("slurm", "slurmstep", "slurm-check")}'),
               ("__main__.py", '"slurm-check": ("slurmcheck", True),'),
               ("__main__.py", '"slurm-probe": ("slurmcheck", True),')}
    found = []
    for path in sorted(AGENT.glob("*.py")):
        if path.name.startswith("slurm"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search("slurm|sbatch", line, re.IGNORECASE) and \
                    not any(path.name == name and line.strip().startswith(text) for name, text in allowed):
                found.append(f"{path.name}:{n}: {line.strip()}")
    assert not found, "\n".join(found)


def test_no_import_circle_through_the_table():
    """The table's modules are imported by name (importlib), which the agent's import graph cannot see:
    added here, the graph still has no circle (a kind's step imports supervisor.py, which asks the table)."""
    graph = agent_imports()
    graph["scheduled"] = graph["scheduled"] | {k.module for k in scheduled.KINDS.values()}
    graph["batchstep"] = graph["batchstep"] | {k.step for k in scheduled.KINDS.values()}
    circle = import_circle(sorted(graph), graph.__getitem__)
    assert circle is None, "agent import circle: " + " -> ".join(circle or ())


def test_the_lookup():
    assert scheduled.of({"scheduler": {"kind": "slurm", "job_id": "7"}}) is slurm
    assert scheduled.of({}) is None  # the direct case
    assert scheduled.of({"scheduler": {"kind": "pbs"}}) is None  # a kind this agent does not know
    assert scheduled.of({"scheduler": "slurm"}) is None  # not a record
    assert scheduled.launch_kind({"slurm": True, "queue": False}) == "slurm"
    assert scheduled.launch_kind({"slurm": False}) is None
    for name in ("launch", "view", "status_fields", "cancel"):  # what scheduled.Scheduler promises
        assert callable(getattr(slurm, name)), name


def test_a_plain_runs_status_imports_no_schedulers_module(tmp_path):
    """A `status` of a run on a plain host (every 2 s of a follow) reads no scheduler's module; one of a
    cluster's run reads its kind's."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "run.json").write_text(json.dumps({"run_id": "plain", "pid": 1, "started_ts": 1.0}))
    (plain / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_at": "2026-12-01T00:00:00Z"}))
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "run.json").write_text(json.dumps({"run_id": "cluster", "pid": 1, "scheduler": {
        "kind": "slurm", "job_id": "7", "nodes": 1, "submitted_ts": 1.0}}))
    (cluster / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_at": "2026-12-01T00:00:00Z"}))
    (cluster / slurm.END).write_text(json.dumps({"state": "COMPLETED", "reason": ""}))

    def loaded(run_dir: Path) -> set[str]:
        code = ("import contextlib, io, json, sys\n"
                "from thrust_remote.agent.__main__ import main\n"
                "with contextlib.redirect_stdout(io.StringIO()):\n"
                f"    main(['status', '--run-dir', {str(run_dir)!r}])\n"
                "print(json.dumps(sorted(m for m in sys.modules if m.startswith('thrust_remote.agent.'))))\n")
        done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True,
                              check=True, env={"PYTHONPATH": str(ROOT)})
        return set(json.loads(done.stdout))

    assert not {m for m in loaded(plain) if m.startswith("thrust_remote.agent.slurm")}
    assert "thrust_remote.agent.slurm" in loaded(cluster)


def test_supervise_of_a_run_that_names_no_scheduler_starts_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"run_id": "run", "argv": ["touch", str(tmp_path / "ran")]}))
    assert agent_main(["supervise", "--run-dir", str(run_dir)]) == 2
    assert "names no scheduler" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists() and not (run_dir / "exit_code").exists()
