"""Batched environments: every env of a batch lives in the same tensors on one device.

Both envs share one interface (see `BatchedEnv`): `reset(seed) -> obs`, `step(actions) ->
(obs, reward, terminated, truncated, info)`, with auto-reset and `info["final_obs"]` holding the
observation of the state that ended, so truncated episodes can bootstrap from its value.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from trainer.envs.cartpole import CartPole, CartPoleParams
from trainer.envs.snake import Snake, SnakeParams


class BatchedEnv(Protocol):
    num_envs: int
    obs_dim: int
    n_actions: int
    device: torch.device

    def reset(self, seed: int | None = None) -> torch.Tensor: ...

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]: ...


def make_env(
    name: str, num_envs: int, device: torch.device | str = "cpu", grid_size: int = 10, **kwargs: Any
) -> BatchedEnv:
    """Build an env by name ("cartpole" or "snake")."""
    if name == "cartpole":
        return CartPole(num_envs, device=device)
    if name == "snake":
        return Snake(num_envs, SnakeParams(grid_size=grid_size, **kwargs), device=device)
    raise ValueError(f"unknown env {name!r}: expected 'cartpole' or 'snake'")


__all__ = ["BatchedEnv", "CartPole", "CartPoleParams", "Snake", "SnakeParams", "make_env"]
