"""The trainer's speed flags: host syncs per iteration, `--precision bf16`, `--compile`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from trainer.args import parse_args
from trainer.envs import Snake
from trainer.policy import CNNPolicy, MLPPolicy, compile_mode, compile_policy
from trainer.ppo import LOSS_NAMES
from trainer.train import Trainer

# Tensor methods that copy a value to the host: on CUDA each one waits for the GPU to catch up.
HOST_READS = {"tolist", "item", "__bool__", "__float__", "__int__", "__index__", "nonzero", "cpu", "numpy"}


class CountHostReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = getattr(func, "__name__", "")
        if name in HOST_READS:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.fixture
def in_process() -> Iterator[None]:
    """A Trainer run inside pytest installs signal handlers and sets torch's threads: put them back."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    threads = torch.get_num_threads()
    yield
    for s, h in handlers.items():
        signal.signal(s, h)
    torch.set_num_threads(threads)


def cartpole_trainer(tmp_path: Path, iterations: int) -> Trainer:
    # 8 envs x 32 steps per iteration; one report, at the last iteration (--log-interval is long).
    args = parse_args(["--env", "cartpole", "--total-steps", str(256 * iterations), "--target-return", "0",
                       "--log-interval", "100000", "--run-dir", str(tmp_path / "run")])
    trainer = Trainer(args)
    trainer.setup()
    return trainer


@pytest.mark.e2e  # the trainer, for real
def test_one_host_sync_per_iteration_and_one_per_report(tmp_path: Path, in_process: None) -> None:
    """Losses and episode statistics stay on the device between reports (before: 3 reads per iteration)."""
    trainer = cartpole_trainer(tmp_path, iterations=6)
    # the env's torch ops, as on a GPU: on a CPU its step reads numpy views of its own memory, no sync
    trainer.env._np = None
    with CountHostReads() as reads:
        trainer.loop()
    trainer.finish()
    assert trainer.iteration == 6
    # per iteration: the truncated steps' `nonzero` (trainer/ppo.py); per report: one `tolist`
    assert sorted(reads.seen) == sorted(["nonzero"] * 6 + ["tolist"])


@pytest.mark.e2e  # the trainer, for real
def test_report_figures_equal_those_read_every_iteration(tmp_path: Path, in_process: None) -> None:
    """The report's episodes, means and losses are the ones a plain per-step loop over the rollouts
    finds (the old way read them every iteration; now they are summed on the device)."""
    trainer = cartpole_trainer(tmp_path, iterations=5)
    ppo = trainer.ppo
    rollouts: list[tuple[torch.Tensor, torch.Tensor]] = []
    updates: list[list[float]] = []
    collect, update = ppo.collect, ppo.update

    def recording_collect() -> None:
        collect()
        rollouts.append((ppo.buf.rewards.clone(), ppo.buf.dones.clone()))

    def recording_update(lr: float | None = None) -> torch.Tensor:
        out = update(lr)
        updates.append(out.tolist())
        return out

    ppo.collect, ppo.update = recording_collect, recording_update  # type: ignore[method-assign]
    # the episode in progress when the trainer starts: none (a fresh reset)
    running = [0.0] * 8
    trainer.loop()
    trainer.finish()
    total, lengths, count = 0.0, 0, 0
    steps = [0] * 8
    for rewards, dones in rollouts:
        for t in range(rewards.shape[0]):
            for j in range(8):
                running[j] += float(rewards[t, j])
                steps[j] += 1
                if dones[t, j]:
                    total, lengths, count = total + running[j], lengths + steps[j], count + 1
                    running[j], steps[j] = 0.0, 0
    (row,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert row["episodes"] == count > 0
    assert row["return_mean"] == pytest.approx(total / count, rel=1e-6)
    assert row["length_mean"] == pytest.approx(lengths / count, rel=1e-6)
    assert [row[k] for k in LOSS_NAMES] == pytest.approx(updates[-1], rel=1e-6)


def train(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer.train", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})


def tagged(stdout: str, tag: str) -> list[dict]:
    return [json.loads(x[len(tag) + 1 :]) for x in stdout.splitlines() if x.startswith(tag + " ")]


@pytest.mark.e2e  # the trainer, for real
def test_bf16_run_records_it_and_exports_an_fp32_model_that_passes_parity(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = train("--env", "snake", "--grid-size", "6", "--num-envs", "16", "--num-steps", "16", "--total-steps",
                "1024", "--precision", "bf16", "--run-dir", str(run), "--export", str(tmp_path / "m.onnx"))
    assert res.returncode == 0, res.stderr[-2000:]
    (info,) = tagged(res.stdout, "THRUST_INFO")
    assert info["precision"] == "bf16"
    (done,) = tagged(res.stdout, "THRUST_DONE")
    assert done["export_error"] is None
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["inputs"][0]["dtype"] == "float32"
    assert json.loads((run / "config.json").read_text())["precision"] == "bf16"
    state = torch.load(done["checkpoint"], weights_only=True)
    assert state["config"]["precision"] == "bf16"
    assert all(t.dtype == torch.float32 for t in state["model"].values()), "fp32 master weights"


def test_an_unknown_precision_is_refused() -> None:
    res = train("--env", "cartpole", "--precision", "fp16")
    assert res.returncode == 2
    assert "invalid choice" in res.stderr


@pytest.mark.e2e  # torch.compile builds C++ with g++ (~5 s each): a native build, as test_snake_compile's
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_compiled_policy_gives_the_eager_actions_and_values(kind: str) -> None:
    """Same weights, fixed inputs. Tolerance 1e-5 (abs and rel): inductor may sum a matmul's products
    in another order, so float32 results can differ in the last bits; greedy actions must agree."""
    torch.manual_seed(0)
    g = 6
    policy = MLPPolicy(3 * g * g + 8, 3, hidden=64) if kind == "mlp" else CNNPolicy(g, 3, hidden=32, channels=8)
    obs = torch.rand(64, 3 * g * g + 8, generator=torch.Generator().manual_seed(1))
    compiled = compile_policy(policy, torch.device("cpu"))
    with torch.no_grad():
        logits, value = policy(obs)
        c_logits, c_value = compiled(obs)
    torch.testing.assert_close(c_logits, logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(c_value, value, atol=1e-5, rtol=1e-5)
    assert torch.equal(c_logits.argmax(1), logits.argmax(1))
    assert list(compiled.parameters())[0] is list(policy.parameters())[0], "the wrapper shares the weights"
    assert compile_mode(torch.device("cpu")) is None
    assert compile_mode(torch.device("cuda")) == "max-autotune-no-cudagraphs"


@pytest.mark.e2e  # a trainer process that imports torch and inductor (~6 s): beside the compile tests
def test_compile_without_a_cpp_compiler_exits_1_before_training(tmp_path: Path) -> None:
    # A fresh inductor cache: a cached kernel would need no compiler.
    res = train("--env", "cartpole", "--compile", "--run-dir", str(tmp_path / "run"),
                env={"CXX": "/nonexistent/c++", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode == 1, res.stderr[-2000:]
    assert "--compile: torch.compile failed on cpu" in res.stderr
    assert "C++ compiler" in res.stderr
    assert "Traceback" not in res.stderr
    assert not tagged(res.stdout, "THRUST_METRICS")


@pytest.mark.e2e  # the trainer, for real
def test_compile_compiles_the_env_step_where_the_env_can(
    tmp_path: Path, in_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`compile_step(mode)` is called on an env that has it (snake), then the run starts from a fresh
    reset: the warm-up step leaves no trace. An env whose compile fails stops the run with exit 1."""
    calls: list[str | None] = []
    monkeypatch.setattr(Snake, "compile_step", lambda _self, mode=None: calls.append(mode), raising=False)
    argv = ["--env", "snake", "--grid-size", "6", "--num-envs", "4", "--total-steps", "128", "--compile",
            "--run-dir", str(tmp_path / "run")]
    trainer = Trainer(parse_args(argv))
    trainer.setup()
    assert calls == [None]  # inductor's default mode on CPU
    assert trainer.ppo.act_model is trainer.ppo.train_model is not trainer.policy
    fresh = Snake(4, trainer.env.params)
    torch.testing.assert_close(trainer.ppo.obs, fresh.reset(seed=1000))  # --seed 1: seed * 1000 + rank
    trainer.loop()
    assert trainer.finish() == 0

    def broken(_self: Any, mode: str | None = None) -> None:
        raise RuntimeError("no compiler for the env")

    monkeypatch.setattr(Snake, "compile_step", broken, raising=False)
    from trainer.train import main

    assert main([*argv[:-1], str(tmp_path / "run2")]) == 1


@pytest.mark.e2e  # the trainer, for real
@pytest.mark.slow
def test_compiled_cartpole_run_solves_end_to_end(tmp_path: Path) -> None:
    """`--compile` on CPU, from the command line (~25 s on 2 cores: most of it compiling)."""
    res = train("--env", "cartpole", "--compile", "--run-dir", str(tmp_path / "run"), "--log-interval", "0")
    assert res.returncode == 0, res.stderr[-2000:]
    (info,) = tagged(res.stdout, "THRUST_INFO")
    assert info["compile"] is True
    metrics = tagged(res.stdout, "THRUST_METRICS")
    assert metrics and all(m["loss_value"] is not None for m in metrics)
    (done,) = tagged(res.stdout, "THRUST_DONE")
    assert done["solved"] is True, done
