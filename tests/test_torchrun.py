"""The trainer under `torchrun`: 2 CPU processes (gloo), restarts resume, parallel runs do not collide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import wait_until

from trainer.checkpoint import checkpoint_paths

pytestmark = pytest.mark.e2e  # the trainer under torchrun, for real

REPO = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def launch(run_dir: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    # --standalone: a local rendezvous on a free port chosen per run, so runs on one host never collide.
    return subprocess.Popen(
        [str(TORCHRUN), "--standalone", "--nproc-per-node=2", *extra, "-m", "trainer.train", "--env", "cartpole",
         "--total-steps", "4096", "--target-return", "0", "--log-interval", "0", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=run_dir.parent,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def lines(stdout: str, tag: str) -> list[dict]:
    return [json.loads(x.split(" ", 1)[1]) for x in stdout.splitlines() if x.startswith(tag + " ")]


def logged_rows(metrics: Path) -> int:
    """How many whole rows metrics.jsonl has (0 before the trainer made it; a row being written is not one)."""
    try:
        return metrics.read_text().count("\n")
    except FileNotFoundError:
        return 0


def check_run(out: str, run: Path) -> None:
    # Rank 0 alone prints and writes: one DONE line, one metrics line per report, one run dir.
    (done,) = lines(out, "THRUST_DONE")
    assert done["step"] == 4096
    assert done["run_dir"] == str(run)
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in metrics]
    assert steps == sorted(steps), "the step never goes back"
    assert steps[-1] == 4096
    state = torch.load(checkpoint_paths(run / "checkpoints")[0][1], weights_only=True)
    assert state["world_size"] == 2
    assert state["config"]["num_envs"] == 8
    assert not any(k.startswith("module.") for k in state["model"]), "state dicts are unwrapped"


@pytest.mark.slow
def test_two_parallel_ddp_runs_on_one_host_do_not_collide(tmp_path: Path) -> None:
    first, second = launch(tmp_path / "a"), launch(tmp_path / "b")
    out_a, err_a = first.communicate(timeout=240)
    out_b, err_b = second.communicate(timeout=240)
    assert first.returncode == 0, err_a[-3000:]
    assert second.returncode == 0, err_b[-3000:]
    check_run(out_a, tmp_path / "a")
    check_run(out_b, tmp_path / "b")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]
    assert not [i for i in lines(out_a, "THRUST_INFO") if "resumed_from" in i]


@pytest.mark.slow
def test_a_restart_by_torchrun_resumes_from_the_checkpoint(tmp_path: Path) -> None:
    proc = launch(tmp_path / "a", "--max-restarts=1", env={"THRUST_TEST_CRASH_AT_STEP": "2048"})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err[-3000:]
    check_run(out, tmp_path / "a")
    resumed = [i for i in lines(out, "THRUST_INFO") if "resumed_from" in i]
    assert resumed
    assert resumed[0]["step"] == 2048


def _rank_pid(agent_pid: int, rank: int, timeout: float = 60) -> int:
    import time

    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(agent_pid).children(recursive=True):
            try:
                if child.environ().get("RANK") == str(rank):
                    return child.pid
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        time.sleep(0.05)
    raise AssertionError(f"no rank {rank} process under {agent_pid}")


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_after_a_final_checkpoint(tmp_path: Path) -> None:
    """The stop decision is collective: rank 1 alone leaving the loop would leave rank 0 waiting in an
    allreduce (gloo: connection reset) and lose everything since the last periodic checkpoint."""
    import signal as sig

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [str(TORCHRUN), "--standalone", "--nproc-per-node=2", "-m", "trainer.train", "--env", "cartpole",
         "--total-steps", "5000000", "--target-return", "0", "--log-interval", "0", "--checkpoint-interval", "600",
         "--run-dir", str(run)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    # a few iterations in (one row each: --log-interval 0), long before the first periodic checkpoint (600 s)
    wait_until(lambda: logged_rows(run / "metrics.jsonl") >= 3, 120, "three iterations logged")
    os.kill(_rank_pid(proc.pid, 1), sig.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert "Connection reset" not in err
    (done,) = lines(out, "THRUST_DONE")
    assert done["stopped_by_signal"] == sig.SIGTERM
    saved = checkpoint_paths(run / "checkpoints")
    assert saved, "rank 0 wrote its final checkpoint"
    assert torch.load(saved[0][1], weights_only=True)["step"] == done["step"]
