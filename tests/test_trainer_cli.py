"""`python -m trainer.train` end to end: output lines, metrics.jsonl, checkpoints, resume, export."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import torch
from helpers import wait_until

from trainer.checkpoint import checkpoint_paths

REPO = Path(__file__).resolve().parents[1]
EXIT_USAGE = 64

METRIC_KEYS = {
    "step", "sps", "return_mean", "length_mean", "loss_policy", "loss_value", "entropy", "approx_kl", "total_steps",
}


def train(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.train", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def tagged(stdout: str, tag: str) -> list[dict]:
    prefix = tag + " "
    return [json.loads(line[len(prefix):]) for line in stdout.splitlines() if line.startswith(prefix)]


@pytest.mark.e2e  # the trainer, for real
def test_metrics_lines_jsonl_done_line_and_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = train("--env", "cartpole", "--total-steps", "2048", "--target-return", "0", "--log-interval", "0",
                "--run-dir", str(run))
    assert res.returncode == 0, res.stderr
    metrics = tagged(res.stdout, "THRUST_METRICS")
    assert len(metrics) == 8  # 2048 steps / (8 envs x 32 steps), one report per iteration
    assert metrics[0].keys() >= METRIC_KEYS
    assert [m["step"] for m in metrics] == [256 * (i + 1) for i in range(8)]
    assert metrics[-1]["total_steps"] == 2048
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines == metrics
    (done,) = tagged(res.stdout, "THRUST_DONE")
    assert done["step"] == 2048
    assert done["run_dir"] == str(run)
    assert Path(done["checkpoint"]).is_file()
    state = torch.load(done["checkpoint"], weights_only=True)
    assert {"model", "optimizer", "step", "torch_rng", "config", "world_size"} <= state.keys()
    assert state["step"] == 2048
    assert state["world_size"] == 1
    assert res.stdout.splitlines()[-1].startswith("THRUST_DONE ")


@pytest.mark.e2e  # the trainer, for real
def test_resume_continues_and_the_step_never_goes_back(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    common = ["--env", "cartpole", "--target-return", "0", "--log-interval", "0", "--run-dir", run]
    assert train(*common, "--total-steps", "1024").returncode == 0
    res = train(*common, "--total-steps", "2048", "--resume", "true")  # the --set KEY=VALUE form
    assert res.returncode == 0, res.stderr
    (info,) = [i for i in tagged(res.stdout, "THRUST_INFO") if "resumed_from" in i]
    assert info["step"] == 1024
    steps = [m["step"] for m in tagged(res.stdout, "THRUST_METRICS")]
    assert steps[0] > 1024
    assert steps[-1] == 2048
    # Asking for fewer steps than already done trains nothing and keeps the step.
    res = train(*common, "--total-steps", "512", "--resume")
    assert res.returncode == 0, res.stderr
    assert tagged(res.stdout, "THRUST_DONE")[0]["step"] == 2048
    assert max(s for s, _ in checkpoint_paths(Path(run) / "checkpoints")) == 2048


@pytest.mark.e2e  # the trainer, for real
def test_resume_refuses_a_checkpoint_of_another_network(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    common = ["--env", "cartpole", "--target-return", "0", "--total-steps", "512", "--run-dir", run]
    assert train(*common).returncode == 0
    res = train(*common, "--hidden", "32", "--resume")
    assert res.returncode == 64
    assert "hidden" in res.stderr


def edit_newest_checkpoint(run: Path, edit: Callable[[dict], None]) -> None:
    """Load the run's newest checkpoint, let `edit` change it in place, and write it back."""
    newest = checkpoint_paths(run / "checkpoints")[0][1]
    state = torch.load(newest, weights_only=True)
    edit(state)
    torch.save(state, newest)


@pytest.mark.e2e  # the trainer, for real
def test_resume_takes_a_checkpoint_written_before_a_setting_existed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    common = ["--env", "snake", "--grid-size", "6", "--num-envs", "8", "--run-dir", str(run)]
    assert train(*common, "--space", "0", "--total-steps", "256").returncode == 0
    edit_newest_checkpoint(run, lambda state: state["config"].pop("space"))  # as a trainer before `--space`
    # The preset now reads the space features: such a checkpoint is refused with the flag that fits it.
    res = train(*common, "--total-steps", "512", "--resume")
    assert res.returncode == 64
    assert "has space=0, this run 1 (pass --space 0 to continue it)" in res.stderr
    common.extend(["--space", "0"])
    res = train(*common, "--total-steps", "512", "--resume")
    assert res.returncode == 0, res.stderr
    assert tagged(res.stdout, "THRUST_DONE")[0]["step"] == 512
    def other_observation(state: dict) -> None:
        assert state["config"]["space"] == 0, "the resumed run wrote the setting"
        state["config"]["space"] = 1  # a checkpoint of the other observation is refused by name

    edit_newest_checkpoint(run, other_observation)
    res = train(*common, "--total-steps", "1024", "--resume")
    assert res.returncode == 64
    assert "has space=1, this run 0 (pass --space 1 to continue it)" in res.stderr


@pytest.mark.e2e  # the trainer, for real
def test_resume_refuses_a_checkpoint_whose_network_reads_another_observation(tmp_path: Path) -> None:
    run = tmp_path / "run"
    common = ["--env", "snake", "--grid-size", "6", "--num-envs", "8", "--total-steps", "256", "--run-dir", str(run)]
    assert train(*common).returncode == 0
    # A checkpoint whose config matches but whose layers read 3 values fewer (as a network of an
    # observation of another version would): the weights are refused, not half loaded.
    def narrow(state: dict) -> None:
        for name in ("actor.0.weight", "critic.0.weight"):
            state["model"][name] = state["model"][name][:, :-3].clone()

    edit_newest_checkpoint(run, narrow)
    res = train(*common, "--resume")
    assert res.returncode == 64, res.stderr
    assert "does not fit this run's snake observation (119 values)" in res.stderr  # 3 * 36 + 11: the preset reads space
    assert "train it again without --resume" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.e2e  # the trainer, for real
def test_default_run_dir_and_usage_errors(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--env", "cartpole", "--total-steps", "256", "--target-return", "0"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert res.returncode == 0, res.stderr
    (done,) = tagged(res.stdout, "THRUST_DONE")
    assert done["run_dir"].startswith("runs/cartpole-")
    assert (tmp_path / done["run_dir"] / "metrics.jsonl").is_file()
    assert train("--env", "pong").returncode == 2  # argparse usage error
    assert train("--env", "snake", "--grid-size", "3").returncode == 64


@pytest.mark.e2e  # the trainer, for real
def test_num_envs_auto_prints_its_choice(tmp_path: Path) -> None:
    res = train("--env", "cartpole", "--num-envs", "auto", "--total-steps", "256", "--target-return", "0",
                "--run-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    info = tagged(res.stdout, "THRUST_INFO")[0]
    assert info["num_envs"] == 8
    assert "num_envs_auto" in info


@pytest.mark.e2e  # the trainer, for real
def test_tensorboard_flag_fails_clearly_when_not_installed(tmp_path: Path) -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        res = train("--env", "cartpole", "--tensorboard", "--run-dir", str(tmp_path / "r"))
        assert res.returncode == 1
        assert "pip install" in res.stderr
    else:
        res = train("--env", "cartpole", "--tensorboard", "--total-steps", "512", "--target-return", "0",
                    "--run-dir", str(tmp_path / "r"))
        assert res.returncode == 0, res.stderr
        assert any((tmp_path / "r" / "tensorboard").iterdir())


@pytest.mark.e2e  # the trainer, for real
def test_snake_run_exports_onnx_with_manifest(tmp_path: Path) -> None:
    out = tmp_path / "web" / "snake.onnx"
    res = train("--env", "snake", "--grid-size", "6", "--num-envs", "16", "--num-steps", "16", "--total-steps",
                "512", "--run-dir", str(tmp_path / "r"), "--export", str(out), "--policy", "cnn", "--hidden", "32")
    assert res.returncode == 0, res.stderr
    (done,) = tagged(res.stdout, "THRUST_DONE")
    assert done["export"] == str(out)
    manifest = json.loads((out.parent / "manifest.json").read_text())
    assert manifest["env"] == "snake"
    assert manifest["grid_size"] == 6
    assert (manifest["obs_dim"], manifest["space"]) == (3 * 36 + 11, True)  # the preset reads the space features
    assert manifest["policy"] == "cnn"
    assert manifest["steps"] == 512
    assert "score_mean" in tagged(res.stdout, "THRUST_METRICS")[-1]


@pytest.mark.e2e  # the trainer, for real
@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_143(tmp_path: Path) -> None:
    run = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.train", "--env", "snake", "--grid-size", "6", "--num-envs", "32",
         "--total-steps", "100000000", "--run-dir", str(run), "--log-interval", "0"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("THRUST_METRICS"):
            break
    proc.terminate()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143
    done = tagged(out, "THRUST_DONE")[0]
    assert done["stopped_by_signal"] == 15
    assert checkpoint_paths(run / "checkpoints")


def test_resume_without_run_dir_and_zero_counts_are_usage_errors(tmp_path: Path) -> None:
    res = train("--env", "cartpole", "--resume")
    assert res.returncode == EXIT_USAGE
    assert "--run-dir" in res.stderr
    for flag in ("--eval-every", "--num-minibatches"):
        res = train("--env", "cartpole", flag, "0", "--run-dir", str(tmp_path / "r"))
        assert res.returncode == EXIT_USAGE, res.stderr
        assert "must be >= 1" in res.stderr


def test_death_cost_on_an_env_without_deaths_is_a_usage_error(tmp_path: Path) -> None:
    res = train("--env", "cartpole", "--death-cost", "5", "--run-dir", str(tmp_path / "r"))
    assert res.returncode == EXIT_USAGE, res.stderr
    assert "--death-cost 5: cartpole has no lost episodes to cost more" in res.stderr
    assert "Traceback" not in res.stderr



def test_point_gamma_on_an_env_without_a_score_is_a_usage_error(tmp_path: Path) -> None:
    res = train("--env", "cartpole", "--point-gamma", "0.97", "--run-dir", str(tmp_path / "r"))
    assert res.returncode == EXIT_USAGE, res.stderr
    assert "--point-gamma 0.97: cartpole has no score whose points could discount" in res.stderr
    assert "Traceback" not in res.stderr


def _logged_steps(run: Path) -> list[int]:
    """The steps of metrics.jsonl's whole rows (a row being written is not one yet)."""
    try:
        text = (run / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(row)["step"] for row in text[:text.rfind("\n") + 1].splitlines()]


def _logged_past_checkpoint(run: Path) -> bool:
    """metrics.jsonl has rows past the newest checkpoint: what a crash now would leave for a resume to trim."""
    saved = checkpoint_paths(run / "checkpoints")
    logged = _logged_steps(run)
    return bool(saved and logged and logged[-1] > saved[0][0])


def _kill_when_logged_past_checkpoint(proc: subprocess.Popen[str], run: Path, timeout: float = 120) -> None:
    """SIGKILL the trainer at a moment it has logged past its newest checkpoint. A checkpoint is written
    right after a row (every second here), so the files are checked again with the trainer stopped
    (SIGSTOP): one written between a check and the kill would leave nothing past it."""
    def stopped_past_checkpoint() -> bool:
        if not _logged_past_checkpoint(run):
            return False
        proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED, 10, "the trainer stopped")
        if _logged_past_checkpoint(run):
            return True
        proc.send_signal(signal.SIGCONT)
        return False

    wait_until(stopped_past_checkpoint, timeout, "metrics logged past the newest checkpoint")
    proc.kill()
    proc.wait()


@pytest.mark.e2e  # the trainer, for real
@pytest.mark.slow
def test_metrics_steps_never_go_back_after_a_crash_and_resume(tmp_path: Path) -> None:
    """A SIGKILLed attempt logged past its last checkpoint; the resumed run drops those rows."""
    run = tmp_path / "run"
    args = ["--env", "cartpole", "--total-steps", "400000", "--target-return", "0", "--log-interval", "0",
            "--checkpoint-interval", "1", "--run-dir", str(run)]
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    # wait for a checkpoint and some metrics past it, then crash
    _kill_when_logged_past_checkpoint(proc, run)
    logged = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    newest = checkpoint_paths(run / "checkpoints")[0][0]
    assert max(logged) > newest, f"the crash left no rows past its newest checkpoint ({newest}): {logged}"
    res = train(*[a if a != "400000" else str(max(logged) + 20000) for a in args], "--resume")
    assert res.returncode == 0, res.stderr[-2000:]
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(steps), "the curve never doubles back"
    assert len(steps) == len(set(steps))
