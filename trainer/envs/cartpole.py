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
    def obs_dim(self) -> int:
        return CartPole.obs_dim

    @property
    def n_actions(self) -> int:
        return CartPole.n_actions

    @property
    def total_mass(self) -> float:
        return self.masspole + self.masscart

    @property
    def polemass_length(self) -> float:
        return self.masspole * self.length


class CartPole:
    """N CartPole-v1 envs. Actions: 0 = push left, 1 = push right.

    Speed notes (they decide the design; measured on a 2-core CPU at 65536 envs): every temporary
    tensor costs an allocation that is slower than the arithmetic, so `step` writes into preallocated
    buffers; drawing 4N uniforms costs more than the whole physics, so start states come from a pool
    redrawn every `_POOL_PERIOD` steps. No episode is shorter than 8 steps from gymnasium's start box
    (falling as fast as possible takes 8), so an env never takes two starts from one draw of the pool
    and start states stay i.i.d. uniform, as in gymnasium.

    The tensors `step` returns are buffers reused two calls later: copy them to keep them longer.
    """

    obs_dim = 4
    n_actions = 2
    name = "cartpole"
    _POOL_PERIOD = 8

    def __init__(self, num_envs: int, params: CartPoleParams | None = None, device: torch.device | str = "cpu") -> None:
        self.num_envs = num_envs
        self.params = params or CartPoleParams()
        self.max_return = float(self.params.max_steps)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(0)
        dev, n = self.device, num_envs

        def f(*shape: int) -> torch.Tensor:
            return torch.zeros(*shape, n, device=dev)

        self._states = (f(4), f(4))  # alternating: the current state and the next one
        self._finals = (f(4), f(4))
        self._which = 0
        self.state = self._states[0]
        self.steps = torch.zeros(n, dtype=torch.int32, device=dev)
        self._pool = f(4)
        self._pool_age = 0
        self._period = max(1, min(self._POOL_PERIOD, self.params.max_steps))
        self._cos, self._sin, self._force = f(), f(), f()
        self._temp, self._num, self._den, self._xacc = f(), f(), f(), f()
        self._abs = f(2)
        self._limits = torch.tensor([[self.params.x_threshold], [self.params.theta_threshold]], device=dev)
        self._over = torch.zeros(2, n, dtype=torch.bool, device=dev)
        self._terminated = torch.zeros(n, dtype=torch.bool, device=dev)
        self._truncated = torch.zeros(n, dtype=torch.bool, device=dev)
        self._done = torch.zeros(n, dtype=torch.bool, device=dev)
        self._done_f = f()
        self._reward = torch.ones(n, device=dev)

    def _refill_pool(self) -> None:
        b = self.params.reset_bound
        self._pool.uniform_(-b, b, generator=self.generator)
        self._pool_age = 0

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self._refill_pool()
        self.state.copy_(self._pool)
        self._refill_pool()
        self.steps.zero_()
        return self.state.t()

    def set_state(self, state: torch.Tensor, steps: torch.Tensor | None = None) -> None:
        """Put the envs into given states (`[N, 4]`), e.g. to compare with another implementation."""
        self.state.copy_(state.t().to(self.device, torch.float32))
        if steps is None:
            self.steps.zero_()
        else:
            self.steps.copy_(steps)

    def physics(self, state: torch.Tensor, actions: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """One Euler step of gymnasium's dynamics for `[4, N]` states, written into `out`."""
        p = self.params
        x, x_dot, theta, theta_dot = state
        cos, sin, force, temp = self._cos, self._sin, self._force, self._temp
        torch.cos(theta, out=cos)
        torch.sin(theta, out=sin)
        torch.mul(actions, 2 * p.force_mag, out=force).sub_(p.force_mag)
        # temp = (force + polemass_length * theta_dot^2 * sin) / total_mass
        torch.mul(theta_dot, theta_dot, out=temp).mul_(sin).mul_(p.polemass_length).add_(force).div_(p.total_mass)
        # thetaacc = (g * sin - cos * temp) / (length * (4/3 - masspole * cos^2 / total_mass))
        den = torch.mul(cos, cos, out=self._den).mul_(p.masspole).div_(p.total_mass).neg_()
        den.add_(4.0 / 3.0).mul_(p.length)
        thetaacc = torch.mul(cos, temp, out=self._num).neg_().add_(sin, alpha=p.gravity).div_(den)
        # xacc = temp - polemass_length * thetaacc * cos / total_mass
        xacc = torch.mul(thetaacc, cos, out=self._xacc).mul_(p.polemass_length).div_(p.total_mass).neg_()
        xacc.add_(temp)
        torch.add(x, x_dot, alpha=p.tau, out=out[0])
        torch.add(x_dot, xacc, alpha=p.tau, out=out[1])
        torch.add(theta, theta_dot, alpha=p.tau, out=out[2])
        torch.add(theta_dot, thetaacc, alpha=p.tau, out=out[3])
        return out

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        p = self.params
        self._which ^= 1
        final = self.physics(self.state, actions, self._finals[self._which])
        torch.abs(final[0::2], out=self._abs)
        torch.gt(self._abs, self._limits, out=self._over)
        terminated = torch.logical_or(self._over[0], self._over[1], out=self._terminated)
        self.steps += 1
        truncated = torch.ge(self.steps, p.max_steps, out=self._truncated)
        done = torch.logical_or(terminated, truncated, out=self._done)
        # Ended envs take a start state from the pool: blend, no host sync to find them.
        d = self._done_f.copy_(done)
        nxt = torch.sub(self._pool, final, out=self._states[self._which]).mul_(d).add_(final)
        self.steps.masked_fill_(done, 0)
        self.state = nxt
        self._pool_age += 1
        if self._pool_age >= self._period:
            self._refill_pool()
        return nxt.t(), self._reward, terminated.clone(), truncated.clone(), {"final_obs": final.t()}
