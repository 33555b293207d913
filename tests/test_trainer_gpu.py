"""CUDA paths: the envs agree with the CPU envs, and a short training run works on the GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.envs import CartPole, Snake, SnakeParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_cartpole_on_cuda_steps_like_on_cpu() -> None:
    states = torch.rand(1000, 4) * 0.1 - 0.05
    actions = torch.randint(0, 2, (1000,))
    out = []
    for device in ("cpu", "cuda"):
        env = CartPole(1000, device=device)
        env.reset(seed=0)
        env.set_state(states.to(device))
        _, _, term, _, info = env.step(actions.to(device))
        out.append((info["final_obs"].cpu(), term.cpu()))
    torch.testing.assert_close(out[0][0], out[1][0], atol=1e-5, rtol=0)
    assert torch.equal(out[0][1], out[1][1])


def test_snake_on_cuda_follows_the_same_rules() -> None:
    env = Snake(2, SnakeParams(grid_size=6), device="cuda", auto_reset=False)
    env.reset(seed=0)
    env.set_board(0, body=[[2, 2], [2, 1], [2, 0]], direction=1, apple=[2, 3])
    env.set_board(1, body=[[0, 2], [0, 1], [0, 0]], direction=0, apple=[5, 5])
    _, reward, term, _, _ = env.step(torch.tensor([0, 0], device="cuda"))
    assert reward.tolist() == [1.0, -1.0]
    assert term.tolist() == [False, True]
    assert env.snapshot(0)["length"] == 4


@pytest.mark.e2e  # the trainer on CUDA
def test_short_cuda_training_run(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.train",
            "--env",
            "snake",
            "--device",
            "cuda",
            "--num-envs",
            "auto",
            "--total-steps",
            "200000",
            "--run-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    metrics = [json.loads(x.split(" ", 1)[1]) for x in res.stdout.splitlines() if x.startswith("THRUST_METRICS ")]
    assert "gpu_mem_gb" in metrics[-1]


def test_compiled_snake_step_on_cuda_is_the_eager_step() -> None:
    """The same bit-for-bit check tests/test_snake_compile.py makes on the CPU, on the GPU's kernels."""
    records = []
    for compiled in (False, True):
        env = Snake(4096, SnakeParams(grid_size=10), device="cuda")
        if compiled:
            env.compile_step("max-autotune-no-cudagraphs")
        env.reset(seed=3)
        gen = torch.Generator(device="cuda").manual_seed(1)
        rec = []
        for _ in range(100):
            obs, reward, term, trunc, info = env.step(torch.randint(0, 3, (4096,), device="cuda", generator=gen))
            rec.append([t.clone() for t in (obs, reward, term, trunc, info["final_obs"], env.cells, env.apple)])
        records.append(rec)
    for t, (a, b) in enumerate(zip(*records, strict=True)):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), f"step {t} differs"


@pytest.mark.e2e  # the trainer on CUDA
def test_bf16_compiled_cuda_run_exports_an_fp32_model(tmp_path: Path) -> None:
    flags = ["--device", "cuda", "--num-envs", "4096", "--total-steps", "400000", "--precision", "bf16", "--compile"]
    res = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--env", "snake", *flags, "--run-dir", str(tmp_path),
         "--export", str(tmp_path / "model.onnx")],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    done = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("THRUST_DONE ")).split(" ", 1)[1])
    assert done["export"] and not done["export_error"]
    import onnx

    model = onnx.load(done["export"])
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
