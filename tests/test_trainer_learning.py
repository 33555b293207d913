"""PPO learns: CartPole to >= 475 on gymnasium, snake on a 6x6 board far above a random policy.

Fixed seeds (1, 2, 3), not picked for luck: the CartPole defaults solved every seed tried.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from trainer.eval import evaluate, load_actor, random_actor

pytestmark = pytest.mark.e2e  # real training to a score


def run_train(*args: str) -> dict:
    res = subprocess.run(
        [sys.executable, "-m", "trainer.train", *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert res.returncode == 0, res.stderr[-2000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("THRUST_DONE "))
    return json.loads(line.split(" ", 1)[1])


def gymnasium_score(act, episodes: int = 20, seed: int = 123) -> float:  # noqa: ANN001
    env = gym.make_vec("CartPole-v1", num_envs=episodes, vectorization_mode="vector_entry_point")
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(episodes)
    running = np.ones(episodes, dtype=bool)
    while running.any():
        actions = act(torch.as_tensor(obs, dtype=torch.float32)).numpy()
        obs, reward, term, trunc, _ = env.step(actions)
        returns += reward * running
        running &= ~(term | trunc)
    return float(returns.mean())


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cartpole_defaults_reach_475_on_gymnasium_within_100k_steps(tmp_path: Path, seed: int) -> None:
    done = run_train("--env", "cartpole", "--seed", str(seed), "--run-dir", str(tmp_path))
    assert done["solved"], done
    assert done["step"] <= 100_000
    # The solve's own clock (bench/bench_ppo.py splits the time from process start with it): inside the
    # run's time, and not all of it (the imports come before the loop).
    assert 0 < done["train_s"] < done["wall_s"], done
    act, meta = load_actor(str(tmp_path))
    assert meta["env"] == "cartpole"
    assert gymnasium_score(act) >= 475


@pytest.mark.slow
def test_snake_on_a_small_board_learns_far_above_random(tmp_path: Path) -> None:
    done = run_train(
        "--env",
        "snake",
        "--grid-size",
        "6",
        "--num-envs",
        "128",
        "--num-steps",
        "32",
        "--hidden",
        "64",
        "--learning-rate",
        "2e-3",
        "--total-steps",
        "300000",
        "--seed",
        "1",
        "--run-dir",
        str(tmp_path),
    )
    assert done["step"] >= 300_000
    act, meta = load_actor(str(tmp_path))
    settings = {k: v for k, v in meta.items() if k != "env"}  # the checkpoint's: 6x6, and the preset's space
    assert settings == {"grid_size": 6, "action_mode": "relative", "space": True}
    trained = evaluate(act, "snake", episodes=100, seed=7, **settings)
    rand = evaluate(random_actor(3), "snake", episodes=100, seed=7, **settings)
    assert rand["mean"] < 1.0
    assert trained["mean"] >= 5.0, trained
    assert trained["mean"] >= 10 * max(rand["mean"], 0.1)
