"""The benchmarks' peers do the work ours does: bench/gym_snake.py (the snake rows' gymnasium peer in
bench/bench_envs.py) gives our Snake's observations step by step, so its steps/s compare like for like."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.envs import Snake, SnakeParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from gym_snake import GymSnake  # noqa: E402


def _apple(env: Snake) -> int:
    return int(env.apple[0])


@pytest.mark.parametrize("space", [False, True])
def test_the_gymnasium_snake_peer_sees_what_our_snake_sees_over_whole_episodes(space: bool) -> None:
    ours, peer = Snake(1, SnakeParams(grid_size=6, space=space)), GymSnake(grid=6, space=space)
    obs = ours.reset(seed=1)
    peer.reset(seed=1)
    peer.apple = _apple(ours)  # the apples are random on each side: the peer takes ours
    rng = np.random.default_rng(0)
    ends = apples = 0
    for _ in range(400):
        np.testing.assert_array_equal(peer._obs(), obs[0].numpy())
        action = int(rng.choice(3, p=[0.6, 0.2, 0.2]))
        obs, reward, terminated, truncated, info = ours.step(torch.tensor([action]))
        peer_obs, peer_reward, peer_term, peer_trunc, _ = peer.step(action)
        assert (peer_reward, peer_term, peer_trunc) == (float(reward[0]), bool(terminated[0]), bool(truncated[0]))
        apples += peer_reward > 0
        if peer_term or peer_trunc:
            np.testing.assert_array_equal(peer_obs, info["final_obs"][0].numpy())
            peer.reset()
            ends += 1
        elif peer_reward > 0:
            np.testing.assert_array_equal(peer_obs[: 2 * 36], obs[0, : 2 * 36].numpy())  # all but the apple
        peer.apple = _apple(ours)
    assert ends >= 5 and apples >= 3, "the walk ended episodes and ate apples: those paths were compared"
