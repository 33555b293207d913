"""CartPole-v1 for N envs at once, as float32 tensors on one device.

The dynamics are gymnasium's CartPole-v1 (Euler integrator, reward 1.0 on every step including the
one that terminates, termination when |x| > 2.4 or |theta| > 12 degrees, truncation after 500 steps,
reset state uniform in [-0.05, 0.05]^4). The state is kept as `[4, N]` (feature-major): on a CPU the
elementwise step over contiguous rows beat the `[N, 4]` layout. `obs` is returned as an `[N, 4]` view.

Auto-reset: an env that terminates or truncates is reset inside the same `step`; the observation of
its last state is in `info["final_obs"]` (all envs; rows of envs that did not end equal `obs`).
No Python loop over envs and no host sync in `step`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class CartPoleParams:
    """Physical constants; the defaults are gymnasium's CartPole-v1."""

    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5  # half the pole's length
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_steps: int = 500
    reset_bound: float = 0.05

    @property
    def total_mass(self) -> float:
        return self.masspole + self.masscart

    @property
    def polemass_length(self) -> float:
        return self.masspole * self.length


class CartPole:
    """N CartPole-v1 envs. Actions: 0 = push left, 1 = push right."""

    obs_dim = 4
    n_actions = 2
    name = "cartpole"

    def __init__(self, num_envs: int, params: CartPoleParams | None = None, device: torch.device | str = "cpu") -> None:
        self.num_envs = num_envs
        self.params = params or CartPoleParams()
        self.max_return = float(self.params.max_steps)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(0)
        self.state = torch.zeros(4, num_envs, device=self.device)
        self.steps = torch.zeros(num_envs, dtype=torch.int32, device=self.device)
        self._noise = torch.empty(4, num_envs, device=self.device)

    def _random_states(self, out: torch.Tensor) -> torch.Tensor:
        b = self.params.reset_bound
        out.uniform_(-b, b, generator=self.generator)
        return out

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self._random_states(self.state)
        self.steps.zero_()
        return self.state.t()

    def set_state(self, state: torch.Tensor, steps: torch.Tensor | None = None) -> None:
        """Put the envs into given states (`[N, 4]`), e.g. to compare with another implementation."""
        self.state.copy_(state.t().to(self.device, torch.float32))
        if steps is None:
            self.steps.zero_()
        else:
            self.steps.copy_(steps)

    def physics(self, state: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """One Euler step of the dynamics for `[4, N]` states; returns the new `[4, N]` states."""
        p = self.params
        x, x_dot, theta, theta_dot = state
        force = actions.to(torch.float32).mul(2 * p.force_mag).sub_(p.force_mag)
        costheta = torch.cos(theta)
        sintheta = torch.sin(theta)
        temp = (force + p.polemass_length * theta_dot * theta_dot * sintheta) / p.total_mass
        thetaacc = (p.gravity * sintheta - costheta * temp) / (
            p.length * (4.0 / 3.0 - p.masspole * costheta * costheta / p.total_mass)
        )
        xacc = temp - p.polemass_length * thetaacc * costheta / p.total_mass
        return torch.stack(
            (x + p.tau * x_dot, x_dot + p.tau * xacc, theta + p.tau * theta_dot, theta_dot + p.tau * thetaacc)
        )

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        p = self.params
        new = self.physics(self.state, actions)
        terminated = (new[0].abs() > p.x_threshold) | (new[2].abs() > p.theta_threshold)
        self.steps += 1
        truncated = self.steps >= p.max_steps
        done = terminated | truncated
        final_obs = new.t()
        # Fresh start states for every env, kept only where one ended: no host sync to find them.
        fresh = self._random_states(self._noise)
        self.state = torch.where(done, fresh, new)
        self.steps.masked_fill_(done, 0)
        reward = torch.ones(self.num_envs, device=self.device)
        return self.state.t(), reward, terminated, truncated, {"final_obs": final_obs}
