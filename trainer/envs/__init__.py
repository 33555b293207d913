"""Batched environments: every env of a batch lives in the same tensors on one device.

Both envs share one interface (see `BatchedEnv`): `reset(seed) -> obs`, `step(actions) ->
(obs, reward, terminated, truncated, info)`, with auto-reset and `info["final_obs"]` holding the
observation of the state that ended, so truncated episodes can bootstrap from its value. What each env
is (sizes, settings, score, export facts) is its spec in `trainer.envs.registry`. An env whose final
observation is costly (snake's space features) has `final_obs_wanted`: a consumer that never reads
`info["final_obs"]` sets it False, and the env then leaves it None.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from trainer.envs.cartpole import CartPole, CartPoleParams
from trainer.envs.registry import SPECS, EnvSpec, get_spec
from trainer.envs.snake import Snake, SnakeParams


class BatchedEnv(Protocol):
    num_envs: int
    obs_dim: int
    n_actions: int
    device: torch.device
    generator: torch.Generator  # the env's random stream (checkpointed with the run)
    max_return: float  # the best return one episode can get (bounds a greedy evaluation)

    def reset(self, seed: int | None = None) -> torch.Tensor: ...

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]: ...


def make_env(name: str, num_envs: int, device: torch.device | str = "cpu", **settings: Any) -> BatchedEnv:
    """Build `num_envs` envs of the env called `name`; `settings` as in its spec (e.g. grid_size)."""
    return get_spec(name).make(num_envs, device=device, **settings)


__all__ = [
    "SPECS",
    "BatchedEnv",
    "CartPole",
    "CartPoleParams",
    "EnvSpec",
    "Snake",
    "SnakeParams",
    "get_spec",
    "make_env",
]
