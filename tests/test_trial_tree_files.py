"""A study's trial in a tree of its own (issue 53 item 18: named as its run, as a train's) has every file
there listed as its own, as any run with a tree: a checkpoint its tree came with or the setup made before
the trial started is not "older". A trial in the tree the study was prepared in (trials of a cargo job
share it) keeps the time window that tells its files from the others'. agent list-files, as the host
runs it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from thrust_remote.agent.listing import main as list_files


def _run(tmp_path: Path, tree_name: str, run_id: str = "study-t3") -> Path:
    """A trial's run dir whose cwd is the tree `tree_name`, holding out/ckpt.pt from before it started."""
    tree = tmp_path / "work" / ".thrust" / "trees" / tree_name
    run_dir = tmp_path / "work" / ".thrust" / "runs" / run_id
    (tree / "out").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    now = time.time()
    (run_dir / "run.json").write_text(json.dumps({
        "run_id": run_id, "cwd": str(tree), "tree": str(tree), "trial": 3, "started_ts": now - 100}))
    (run_dir / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_ts": now - 10}))
    (tree / "out" / "ckpt.pt").write_bytes(b"x")
    os.utime(tree / "out" / "ckpt.pt", (now - 500, now - 500))  # placed before the trial started
    return run_dir


def _listed(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert list_files(["--run-dir", str(run_dir), "--", "out/*.pt"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_trial_in_its_own_tree_has_every_file_there(tmp_path, capsys):
    got = _listed(_run(tmp_path, "study-t3"), capsys)
    assert [f["path"] for f in got["files"]] == ["out/ckpt.pt"], got


def test_a_trial_in_the_studys_shared_tree_keeps_the_time_window(tmp_path, capsys):
    got = _listed(_run(tmp_path, "zoo-tree-20260101-000000-abcd"), capsys)
    assert got["files"] == [] and got["older"] == 1, got
