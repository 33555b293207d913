"""A cluster run that continues itself (agent/slurm.py continue_itself) puts its newest checkpoint where
its job reads it, `resume: {checkpoint_at: P}`, as `resume` does (agent/placing.py: a copy, verified,
inside the run's tree), not only in the next run's `resume/`: a job whose checkpoints glob is not P
(the checkpoints under $THRUST_RUN_DIR, or a numbered series) finds it there. On real directories: the
placing before the next attempt is submitted, and a P that leaves the tree is refused, said in run.json,
and submits nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

from thrust_remote.agent import slurm
from thrust_remote.agent.protocol import CHECKPOINT_AT, SELF_RETRY
from thrust_remote.agent.walk import list_files
from thrust_remote.backends.slurm import host_retry
from thrust_remote.core.config import parse_config_text


def _run(tmp_path: Path, at: str) -> tuple[Path, Path, dict]:
    """A run dir as a Slurm run's supervisor leaves it at Slurm's time-limit warning: its checkpoints
    (two, the newer one the one to continue from) in its tree's ckpt/, its job reading `at`."""
    tree, run_dir = tmp_path / "trees" / "own-1", tmp_path / "runs" / "own-1"
    (tree / "ckpt").mkdir(parents=True)
    run_dir.mkdir(parents=True)
    (tree / "ckpt" / "step-1.txt").write_text("step 1")
    (tree / "ckpt" / "step-2.txt").write_text("step 2")
    os.utime(tree / "ckpt" / "step-1.txt", (1, 1))
    meta = {"run_id": "own-1", "job": "own", "cwd": str(tree), "tree": str(tree),
            SELF_RETRY: {"on": ["timeout"], "max": 1, "attempt": 0, "checkpoints": "ckpt/*.txt",
                         CHECKPOINT_AT: at, "host": "hpc", "argv": ["sh", "job.sh"], "sbatch": []}}
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "time-limit").write_text("now")
    return tree, run_dir, meta


def _newest(tree: Path, run_dir: Path) -> dict:
    found = list_files(str(tree), str(run_dir), ["ckpt/*.txt"], None)["files"]
    return max(found, key=lambda f: (f["mtime"], f["path"]))


def test_the_plan_of_a_job_with_checkpoint_at_names_the_place():
    text = ("jobs:\n  own:\n    script: t.py\n    checkpoints: $THRUST_RUN_DIR/ckpt-*.pt\n"
            "    retry: {max: 2, on: [timeout]}\n    resume: {checkpoint_at: out/ckpt.pt}\n")
    job = parse_config_text(text).jobs["own"]
    plan = host_retry(job, [], "hpc")
    assert plan is not None and plan[CHECKPOINT_AT] == "out/ckpt.pt"


def test_the_newest_checkpoint_is_copied_where_the_job_reads_it(tmp_path):
    tree, run_dir, meta = _run(tmp_path, "out/resume.txt")
    newest = _newest(tree, run_dir)
    assert slurm.place_for_next(meta[SELF_RETRY], meta, str(tree), newest) is None
    placed = tree / "out" / "resume.txt"
    assert placed.read_text() == "step 2"
    assert not os.path.samefile(placed, tree / "ckpt" / "step-2.txt")  # a copy: a save in place changes only it
    assert [p.name for p in (tree / "out").iterdir()] == ["resume.txt"]  # no temporary file left beside it


def test_a_place_outside_the_tree_is_refused_said_and_nothing_is_submitted(tmp_path):
    tree, run_dir, meta = _run(tmp_path, "../elsewhere/ckpt.txt")
    assert slurm.continue_itself(str(run_dir), meta, {}) is None  # refused before any sbatch
    why = json.loads((run_dir / "run.json").read_text())["continue_error"]
    assert "../elsewhere/ckpt.txt" in why and "leaves the run's tree" in why, why
    assert not (tmp_path / "trees" / "elsewhere").exists()
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["own-1"]  # no next run dir
