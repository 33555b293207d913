"""Evaluate a policy for N episodes: the number model quality is judged by.

`python -m trainer.eval PATH [--episodes 100] [--seed 0] [--json] [--random]`, where PATH is a
checkpoint file, a run directory (its latest checkpoint) or an exported `.onnx` model (its env is read
from the `manifest.json` beside it, else inferred from the input width).

Each of the N episodes runs in its own env of one batch, with argmax actions, until it ends (CartPole:
at most 500 steps; snake: death, win, or hunger truncation). Score: the return for CartPole, apples
eaten for snake. Output: mean, median, max, min of the score, mean episode length, and for snake
`full_board_fraction` (episodes that filled the board). `--random` scores a uniform random policy on
the same envs, for comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.envs import make_env

ActFn = Callable[[torch.Tensor], torch.Tensor]  # obs [B, obs_dim] -> actions [B]


def evaluate(
    act: ActFn,
    env_name: str,
    episodes: int = 100,
    seed: int = 0,
    grid_size: int = 10,
    action_mode: str = "relative",
    device: str = "cpu",
    max_steps: int = 1_000_000,
) -> dict[str, Any]:
    """Run `episodes` episodes (one per env, in parallel) and summarise their scores."""
    extra = {"action_mode": action_mode} if env_name == "snake" else {}
    env = make_env(env_name, episodes, device=device, grid_size=grid_size, **extra)
    obs = env.reset(seed=seed)
    score = torch.zeros(episodes)
    length = torch.zeros(episodes)
    won = torch.zeros(episodes, dtype=torch.bool)
    running = torch.ones(episodes, dtype=torch.bool)
    for step in range(max_steps):
        actions = act(obs)
        obs, reward, terminated, truncated, _ = env.step(actions)
        reward, terminated, truncated = reward.cpu(), terminated.cpu(), truncated.cpu()
        gained = reward if env_name == "cartpole" else reward.clamp(min=0)
        score += gained * running
        length += running.to(torch.float32)
        if env_name == "snake":
            # A win is the only termination that comes with a reward of +1.
            won |= running & terminated & (reward > 0)
        running &= ~(terminated | truncated)
        if step % 50 == 49 and not running.any():
            break
    result: dict[str, Any] = {
        "env": env_name,
        "episodes": episodes,
        "mean": float(score.mean()),
        "median": float(score.median()),
        "max": float(score.max()),
        "min": float(score.min()),
        "std": float(score.std()) if episodes > 1 else 0.0,
        "length_mean": float(length.mean()),
        "unfinished": int(running.sum()),
    }
    if env_name == "snake":
        result["grid_size"] = grid_size
        result["full_board_fraction"] = float(won.float().mean())
    return result


def torch_actor(policy: torch.nn.Module) -> ActFn:
    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        logits, _ = policy(obs)
        return logits.argmax(dim=1)

    return act


def onnx_actor(path: Path) -> ActFn:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def act(obs: torch.Tensor) -> torch.Tensor:
        (logits,) = session.run(["logits"], {"obs": obs.cpu().numpy()})
        return torch.from_numpy(logits).argmax(dim=1)

    return act


def random_actor(n_actions: int, seed: int = 0) -> ActFn:
    gen = torch.Generator().manual_seed(seed)

    def act(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, n_actions, (obs.shape[0],), generator=gen)

    return act


def onnx_meta(path: Path) -> dict[str, Any]:
    """env, grid_size, action_mode of an exported model: from manifest.json, else from its shapes."""
    manifest = path.with_name("manifest.json")
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if m.get("file") in (None, path.name):
            return {"env": m["env"], "grid_size": m.get("grid_size") or 10, "action_mode": m.get("action_mode")}
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    obs_dim = session.get_inputs()[0].shape[1]
    n_actions = session.get_outputs()[0].shape[1]
    if obs_dim == 4:
        return {"env": "cartpole", "grid_size": 10, "action_mode": None}
    g = math.isqrt((obs_dim - 8) // 3)
    if 3 * g * g + 8 != obs_dim:
        raise ValueError(f"cannot tell the env of a model with {obs_dim} inputs")
    return {"env": "snake", "grid_size": g, "action_mode": "relative" if n_actions == 3 else "absolute"}


def load_actor(path: str) -> tuple[ActFn, dict[str, Any]]:
    """An acting function and the env settings for a checkpoint, run directory or .onnx file."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if p.suffix == ".onnx":
        return onnx_actor(p), onnx_meta(p)
    from trainer.export import load_checkpoint, policy_from_checkpoint

    state = load_checkpoint(p)
    cfg = state["config"]
    meta = {"env": cfg["env"], "grid_size": cfg.get("grid_size", 10), "action_mode": cfg.get("action_mode")}
    return torch_actor(policy_from_checkpoint(state)), meta


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.eval", description="score a policy over N episodes")
    p.add_argument("path", help="checkpoint file, run directory, or .onnx model")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--random", action="store_true", help="also score a uniform random policy")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        act, meta = load_actor(args.path)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    kw = {"grid_size": meta["grid_size"] or 10, "action_mode": meta["action_mode"] or "relative"}
    result = evaluate(act, meta["env"], args.episodes, args.seed, **kw)
    result["path"] = args.path
    if args.random:
        n_actions = 2 if meta["env"] == "cartpole" else (3 if kw["action_mode"] == "relative" else 4)
        result["random"] = evaluate(random_actor(n_actions, args.seed), meta["env"], args.episodes, args.seed, **kw)
    if args.json:
        print(json.dumps(result))
    else:
        keys = ("mean", "median", "max", "min", "length_mean", "full_board_fraction")
        print(" ".join(f"{k}={result[k]:.3f}" for k in keys if k in result))
        if args.random:
            print("random: " + " ".join(f"{k}={result['random'][k]:.3f}" for k in keys if k in result["random"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
