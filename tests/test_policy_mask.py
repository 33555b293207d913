"""`--mask 1`: a snake policy never picks a move its danger values mark deadly while another move is
open: in the rollout (so in training), in greedy play, and in the exported ONNX model the page runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO

from trainer.envs.registry import get_spec
from trainer.envs.snake import Snake, SnakeParams, danger_at, obs_size
from trainer.policy import build_policy, mask_deadly
from trainer.ppo import PPO, PPOConfig

G = 6


def straight_lover(mask: bool, seed: int = 0) -> torch.nn.Module:
    """An untrained MLP whose actor prefers "straight" by far: unmasked, it drives into the wall."""
    torch.manual_seed(seed)
    policy = build_policy("mlp", obs_size(G), 3, 16, mask_at=danger_at(G) if mask else None)
    with torch.no_grad():
        policy.actor[-1].bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    return policy


def states(n: int = 256, steps: int = 40) -> torch.Tensor:
    """Observations of games played by random moves, from many board positions."""
    env = Snake(n, SnakeParams(grid_size=G))
    obs = env.reset(seed=3)
    seen = [obs.clone()]
    gen = torch.Generator().manual_seed(5)
    for _ in range(steps):
        obs, *_ = env.step(torch.randint(0, 3, (n,), generator=gen))
        seen.append(obs.clone())
    return torch.cat(seen)


def test_the_danger_values_are_where_the_mask_reads_them() -> None:
    # docs/snake.md: three planes of G*G, the direction one-hot (4), then danger straight/left/right
    assert danger_at(G) == 3 * G * G + 4
    assert get_spec("snake").mask_at(SnakeParams(grid_size=G)) == danger_at(G)
    assert get_spec("snake").mask_at(SnakeParams(grid_size=G, action_mode="absolute")) is None
    assert get_spec("cartpole").mask_at(get_spec("cartpole").params({})) is None


def test_greedy_play_never_picks_a_deadly_move_while_another_is_open() -> None:
    obs = states()
    danger = obs[:, danger_at(G) : danger_at(G) + 3]
    open_somewhere = danger.sum(dim=1) < 3
    raw = straight_lover(mask=False).logits(obs).argmax(dim=1)
    masked = straight_lover(mask=True).logits(obs).argmax(dim=1)
    chosen_deadly = danger.gather(1, masked[:, None])[:, 0] > 0
    assert int((danger.gather(1, raw[:, None])[:, 0] > 0)[open_somewhere].sum()) > 50  # the test can fail
    assert not bool(chosen_deadly[open_somewhere].any())
    # where no move is deadly the mask changes nothing; where all are, the policy's own choice stands
    untouched = (danger.sum(dim=1) == 0) | ~open_somewhere
    assert torch.equal(masked[untouched], raw[untouched])


def test_masked_logits_keep_the_softmax_finite_in_fp32_and_bf16() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    obs = torch.zeros(3, 10)
    obs[0, 4:7] = torch.tensor([0.0, 1.0, 1.0])  # only straight open
    obs[2, 4:7] = 1.0  # trapped: nothing masked
    for dtype in (torch.float32, torch.bfloat16):
        out = mask_deadly(logits.to(dtype), obs.to(dtype), 4).float()
        logp = torch.log_softmax(out, dim=1)
        entropy = -(logp.exp() * logp).sum(dim=1)
        assert torch.isfinite(logp).all() and torch.isfinite(entropy).all()
        assert logp[0, 0].item() == pytest.approx(0.0, abs=1e-6)  # the one open move, for sure
        assert entropy[0].item() == pytest.approx(0.0, abs=1e-6)
        assert torch.allclose(out[1:], logits[1:].float(), atol=0.02)


def test_a_masked_rollout_dies_only_when_trapped() -> None:
    env = Snake(64, SnakeParams(grid_size=G))
    rollouts = {}
    for mask in (False, True):
        cfg = PPOConfig(num_envs=64, num_steps=64)
        ppo = PPO(env, straight_lover(mask), cfg)
        ppo.start(seed=1)
        ppo.collect()
        buf = ppo.buf
        deaths = buf.terminated & (buf.rewards < 0)
        danger = buf.obs[..., danger_at(G) : danger_at(G) + 3]
        rollouts[mask] = (int(deaths.sum()), int((deaths & (danger.sum(dim=-1) < 3)).sum()))
    assert rollouts[False][1] > 20  # unmasked: it drives into walls with a way out
    assert rollouts[True][1] == 0  # masked: every death had no way out


def test_the_exported_model_masks_as_torch_does(tmp_path: Path) -> None:
    import onnxruntime as ort

    from trainer.export import export_onnx

    policy = straight_lover(mask=True)
    out = export_onnx(policy, tmp_path / "m.onnx", env_name="snake", grid_size=G, action_mode="relative")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["mask"] is True
    obs = states(64, 20)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (onnx_logits,) = session.run(["logits"], {"obs": obs.numpy()})
    want = policy.logits(obs).argmax(dim=1).numpy()
    assert np.array_equal(onnx_logits.argmax(axis=1), want)


def run_trainer(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainer.train", *flags], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("flags", [("--env", "cartpole"), ("--env", "snake", "--action-mode", "absolute")])
def test_mask_on_an_env_without_danger_values_is_refused(tmp_path: Path, flags: tuple[str, ...]) -> None:
    done = run_trainer(*flags, "--mask", "1", "--total-steps", "64", "--run-dir", str(tmp_path / "r"))
    assert done.returncode == 64, done.stderr
    assert "--mask 1" in done.stderr and "relative actions" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_masked_run_trains_exports_and_resumes_only_masked(tmp_path: Path) -> None:
    run = tmp_path / "run"
    base = ("--env", "snake", "--grid-size", str(G), "--num-envs", "16", "--candidates", "1", "--run-dir", str(run))
    first = run_trainer(*base, "--mask", "1", "--total-steps", "2048", "--export", str(tmp_path / "m.onnx"))
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "manifest.json").read_text())["mask"] is True
    evaluated = subprocess.run([sys.executable, "-m", "trainer.eval", str(run), "--episodes", "20", "--json"],
                               cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(evaluated.stdout.splitlines()[-1])["episodes"] == 20
    again = run_trainer(*base, "--mask", "0", "--total-steps", "4096", "--resume")
    assert again.returncode == 64
    assert "mask=1" in again.stderr and "--mask 1" in again.stderr
