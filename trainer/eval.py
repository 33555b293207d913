"""Evaluate a policy for N episodes: the number model quality is judged by.

`python -m trainer.eval PATH [--episodes 100] [--seed 0] [--json] [--random]`, where PATH is a
checkpoint file, a run directory (its latest checkpoint) or an exported `.onnx` model (its env is read
from the `manifest.json` beside it, else inferred from the input width).

Each of the N episodes runs in its own env of one batch, with argmax actions, until it ends (CartPole:
at most 500 steps; snake: death, win, or hunger truncation; a gymnasium id: its own termination or
time limit). Score: the return for CartPole and gymnasium ids, apples eaten for snake. Output: mean,
its standard error (`sem`: how far the mean may move on another N episodes), median, max, min of the
score, mean episode length, and for snake `full_board_fraction` (episodes that filled the board).
`--random` scores a uniform random policy on the same envs, for comparison.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.envs.registry import close_env, get_spec, skip_final_obs, spec_for_dims

ActFn = Callable[[torch.Tensor], torch.Tensor]  # obs [B, obs_dim] -> actions [B]


def evaluate(
    act: ActFn,
    env_name: str,
    episodes: int = 100,
    seed: int = 0,
    device: str = "cpu",
    max_steps: int = 1_000_000,
    **settings: Any,
) -> dict[str, Any]:
    """Run `episodes` episodes (one per env, in parallel) and summarise their scores.

    `settings`: the env's (its spec's `settings`, e.g. `grid_size=6`); None or absent: its default."""
    return evaluate_groups(act, env_name, 1, episodes, seed, device, max_steps, **settings)[0]


def evaluate_groups(
    act: ActFn,
    env_name: str,
    groups: int,
    episodes: int,
    seed: int = 0,
    device: str = "cpu",
    max_steps: int = 1_000_000,
    **settings: Any,
) -> list[dict[str, Any]]:
    """`evaluate` for `groups` players at once: one batch of `groups * episodes` envs, rows
    `[g * episodes, (g + 1) * episodes)` played by player g (`act` answers for all of them, e.g.
    `stacked_actor`), and one summary per player. Why: a greedy evaluation steps its whole batch until
    the longest game ends, and on a CPU each step of a few hundred envs costs mostly its fixed overhead,
    so five players of 100 games cost about what one of 500 does (the games differ from a
    single-player evaluation's: the apples are drawn for the whole batch)."""
    spec = get_spec(env_name)
    params = spec.params(settings)
    n = groups * episodes
    env = spec.make(n, device=device, **spec.settings_of(params))
    skip_final_obs(env)  # greedy play never bootstraps (snake: ~15% of an evaluation's time)
    obs = env.reset(seed=seed)
    score = torch.zeros(n)
    length = torch.zeros(n)
    won = torch.zeros(n, dtype=torch.bool)
    running = torch.ones(n, dtype=torch.bool)
    for step in range(max_steps):
        actions = act(obs)
        obs, reward, terminated, truncated, _ = env.step(actions)
        reward, terminated, truncated = reward.cpu(), terminated.cpu(), truncated.cpu()
        score += spec.episode_score(reward) * running
        length += running.to(torch.float32)
        won_now = spec.won(reward, terminated)
        if won_now is not None:
            won |= running & won_now
        running &= ~(terminated | truncated)
        if step % 50 == 49 and not running.any():
            break
    close_env(env)
    rows = [slice(g * episodes, (g + 1) * episodes) for g in range(groups)]
    return [summary(spec, params, env_name, score[r], length[r], won[r], running[r]) for r in rows]


def summary(spec: Any, params: Any, env_name: str, score: torch.Tensor, length: torch.Tensor, won: torch.Tensor,
            running: torch.Tensor) -> dict[str, Any]:
    """One player's result: the score's mean, spread and extremes over its episodes."""
    episodes = score.shape[0]
    std = float(score.std()) if episodes > 1 else 0.0
    result: dict[str, Any] = {
        "env": env_name,
        "episodes": episodes,
        "mean": float(score.mean()),
        "median": float(score.median()),
        "max": float(score.max()),
        "min": float(score.min()),
        "std": std,
        # How far the mean itself may move on another set of games: a 100-game snake score moves by
        # ~2 apples (its games end either full or early).
        "sem": std / math.sqrt(episodes),
        "length_mean": float(length.mean()),
        "unfinished": int(running.sum()),
    }
    result.update(spec.eval_fields(params))
    if spec.win_metric is not None:
        result[spec.win_metric] = float(won.float().mean())
    return result


def torch_actor(policy: torch.nn.Module) -> ActFn:
    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        return policy.logits(obs).argmax(dim=1)

    return act


class _Greedy(torch.nn.Module):
    """`policy.logits` as a module's forward, so `torch.func.functional_call` can run it."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self.policy = policy

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.logits(obs)


def stacked_actor(policies: list[torch.nn.Module]) -> ActFn:
    """Argmax actions of K policies of one architecture for `evaluate_groups(..., groups=K)`: rows
    `[k * B / K, (k + 1) * B / K)` of a batch of B observations are policy k's. One vmapped forward over
    the stacked weights (torch.func), not K calls: on a CPU the K small forwards cost mostly overhead."""
    from torch.func import functional_call, stack_module_state, vmap

    params, buffers = stack_module_state(policies)
    stacked = {f"policy.{k}": v for k, v in {**params, **buffers}.items()}
    shell = _Greedy(copy.deepcopy(policies[0]).to("meta"))
    forward = vmap(lambda weights, obs: functional_call(shell, weights, (obs,)))
    k = len(policies)

    @torch.no_grad()
    def act(obs: torch.Tensor) -> torch.Tensor:
        return forward(stacked, obs.reshape(k, obs.shape[0] // k, -1)).argmax(dim=-1).reshape(-1)

    return act


def onnx_session(path: Path) -> Any:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def onnx_actor(path: Path, session: Any = None) -> ActFn:
    """Argmax actions of the model at `path` (through `session` when one is open already)."""
    session = session if session is not None else onnx_session(path)

    def act(obs: torch.Tensor) -> torch.Tensor:
        (logits,) = session.run(["logits"], {"obs": obs.cpu().numpy()})
        return torch.from_numpy(logits).argmax(dim=1)

    return act


def random_actor(n_actions: int, seed: int = 0) -> ActFn:
    gen = torch.Generator().manual_seed(seed)

    def act(obs: torch.Tensor) -> torch.Tensor:
        return torch.randint(0, n_actions, (obs.shape[0],), generator=gen)

    return act


def onnx_meta(path: Path, session: Any) -> dict[str, Any]:
    """The env and its settings for an exported model: from manifest.json, else from its shapes."""
    manifest = path.with_name("manifest.json")
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        if m.get("file") in (None, path.name):
            spec = get_spec(m["env"])
            return {"env": spec.name, **spec.settings_of(spec.params(m))}
    obs_dim = session.get_inputs()[0].shape[1]
    n_actions = session.get_outputs()[0].shape[1]
    spec, settings = spec_for_dims(obs_dim, n_actions)
    return {"env": spec.name, **settings}


def check_onnx_width(path: Path, session: Any, meta: dict[str, Any]) -> None:
    """ValueError when the model's input is not the width of the observation its manifest's settings
    give (e.g. a snake model of the space features, 3*G*G+11 inputs, beside a manifest without them)."""
    spec = get_spec(meta["env"])
    want = spec.obs_dim(spec.params({k: v for k, v in meta.items() if k != "env"}))
    width = session.get_inputs()[0].shape[1]
    if isinstance(width, int) and width != want:
        settings = json.dumps({k: v for k, v in meta.items() if k != "env"})
        raise ValueError(
            f"{path} takes {width} inputs, but {meta['env']}'s observation here has {want} "
            f"(settings {settings}): the model and its manifest disagree"
        )


def load_actor(path: str) -> tuple[ActFn, dict[str, Any]]:
    """An acting function and `{"env": name, **its settings}` for a checkpoint, run dir or .onnx file."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist")
    if p.suffix == ".onnx":
        session = onnx_session(p)  # one load serves the shapes, the check and the actor
        meta = onnx_meta(p, session)
        check_onnx_width(p, session, meta)
        return onnx_actor(p, session), meta
    from trainer.export import load_checkpoint, policy_from_checkpoint

    state = load_checkpoint(p)
    cfg = state["config"]
    spec = get_spec(cfg["env"])
    return torch_actor(policy_from_checkpoint(state)), {"env": spec.name, **spec.settings_of(spec.params(cfg))}


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
    env_name, settings = meta["env"], {k: v for k, v in meta.items() if k != "env"}
    result = evaluate(act, env_name, args.episodes, args.seed, **settings)
    result["path"] = args.path
    if args.random:
        spec = get_spec(env_name)
        n_actions = spec.n_actions(spec.params(settings))
        result["random"] = evaluate(random_actor(n_actions, args.seed), env_name, args.episodes, args.seed, **settings)
    if args.json:
        print(json.dumps(result))
    else:
        keys = ("mean", "sem", "median", "max", "min", "length_mean", "full_board_fraction")
        print(" ".join(f"{k}={result[k]:.3f}" for k in keys if k in result))
        if args.random:
            print("random: " + " ".join(f"{k}={result['random'][k]:.3f}" for k in keys if k in result["random"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
