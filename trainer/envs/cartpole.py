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

import numpy as np
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

    On a CPU the step runs through numpy on the same memory (`_NumpyStep`): at a few thousand envs a
    step is ~30 small elementwise ops and its cost is each op's dispatch, several times cheaper in
    numpy than in torch's eager dispatcher (one thread, 256 envs: 4.4M steps/s against 1.6M; equal from
    16k envs on). Above `_NUMPY_ALWAYS_UP_TO` envs with more than one torch thread, and on CUDA, the
    torch ops (`physics`) run instead.

    The tensors `step` returns are buffers reused two calls later: copy them to keep them longer.
    """

    obs_dim = 4
    n_actions = 2
    name = "cartpole"
    _POOL_PERIOD = 8
    # Up to this many envs numpy's step beats torch's on a CPU whatever torch's thread count; above it,
    # only against one torch thread (numpy runs on one core: 0.6-0.8x two torch threads at 65k-262k envs)
    _NUMPY_ALWAYS_UP_TO = 16384

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
        # alternating, as the states are: what `step` returns stays valid for one more call
        self._terminated = tuple(torch.zeros(n, dtype=torch.bool, device=dev) for _ in range(2))
        self._truncated = tuple(torch.zeros(n, dtype=torch.bool, device=dev) for _ in range(2))
        self._done = torch.zeros(n, dtype=torch.bool, device=dev)
        self._done_f = f()
        self._reward = torch.ones(n, device=dev)
        self._np = _NumpyStep(self) if self.device.type == "cpu" else None

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
        self._which ^= 1
        w = self._which
        if self._np is not None and (self._np.always or torch.get_num_threads() == 1):
            self._np.step(actions.numpy(), w)
        else:
            self._step_torch(actions, w)
        nxt, final = self._states[w], self._finals[w]
        self.state = nxt
        self._pool_age += 1
        if self._pool_age >= self._period:
            self._refill_pool()
        return nxt.t(), self._reward, self._terminated[w], self._truncated[w], {"final_obs": final.t()}

    def _step_torch(self, actions: torch.Tensor, w: int) -> None:
        final = self.physics(self.state, actions, self._finals[w])
        torch.abs(final[0::2], out=self._abs)
        torch.gt(self._abs, self._limits, out=self._over)
        terminated = torch.logical_or(self._over[0], self._over[1], out=self._terminated[w])
        self.steps += 1
        truncated = torch.ge(self.steps, self.params.max_steps, out=self._truncated[w])
        done = torch.logical_or(terminated, truncated, out=self._done)
        # Ended envs take a start state from the pool: blend, no host sync to find them.
        d = self._done_f.copy_(done)
        torch.sub(self._pool, final, out=self._states[w]).mul_(d).add_(final)
        self.steps.masked_fill_(done, 0)


class _NumpyStep:
    """`CartPole.step`'s work on a CPU, in numpy ufuncs writing into numpy views of the env's own tensors
    (no copy: `Tensor.numpy()` shares memory), so everything else (reset, set_state, the start pool,
    the returned tensors) is unchanged. Constants are folded so the step is 30 ufunc calls; the result
    equals `physics` up to float32 rounding (tests/test_cartpole_env.py holds both to gymnasium)."""

    def __init__(self, env: CartPole) -> None:
        p = env.params
        tm, pml = p.total_mass, p.polemass_length
        self.tau, self.max_steps = p.tau, p.max_steps
        self.k_temp = pml / tm  # temp = k_temp * theta_dot^2 * sin + force / total_mass
        self.k_den, self.c_den = -p.length * p.masspole / tm, 4.0 * p.length / 3.0  # den = c + k * cos^2
        self.gravity = p.gravity
        self.force = np.array([-p.force_mag / tm, p.force_mag / tm], dtype=np.float32)  # per action
        self.states = tuple(t.numpy() for t in env._states)
        self.finals = tuple(t.numpy() for t in env._finals)
        self.terminated = tuple(t.numpy() for t in env._terminated)
        self.truncated = tuple(t.numpy() for t in env._truncated)
        self.steps, self.pool, self.done = env.steps.numpy(), env._pool.numpy(), env._done.numpy()
        self.limits, self.over, self.abs = env._limits.numpy(), env._over.numpy(), env._abs.numpy()
        n = env.num_envs
        self.always = n <= CartPole._NUMPY_ALWAYS_UP_TO
        self.cos, self.sin, self.temp, self.den, self.num, self.f = (np.empty(n, np.float32) for _ in range(6))
        self.acc = np.empty((2, n), np.float32)  # xacc, thetaacc: the rates of x_dot and theta_dot

    def step(self, actions: np.ndarray, w: int) -> None:
        """From state `w ^ 1` (the env's current one: the two alternate) into final `w` and state `w`."""
        cos, sin, temp, den, acc = self.cos, self.sin, self.temp, self.den, self.acc
        st, final, tau = self.states[w ^ 1], self.finals[w], self.tau
        np.cos(st[2], out=cos)
        np.sin(st[2], out=sin)
        np.multiply(st[3], st[3], out=temp)
        np.multiply(temp, sin, out=temp)
        np.multiply(temp, self.k_temp, out=temp)
        np.add(temp, np.take(self.force, actions, out=self.f), out=temp)
        np.multiply(cos, cos, out=den)
        np.multiply(den, self.k_den, out=den)
        np.add(den, self.c_den, out=den)
        np.multiply(sin, self.gravity, out=acc[1])  # thetaacc = (g sin - cos temp) / den
        np.subtract(acc[1], np.multiply(cos, temp, out=self.num), out=acc[1])
        np.divide(acc[1], den, out=acc[1])
        np.multiply(acc[1], cos, out=acc[0])  # xacc = temp - k_temp thetaacc cos
        np.multiply(acc[0], -self.k_temp, out=acc[0])
        np.add(acc[0], temp, out=acc[0])
        np.multiply(st[1::2], tau, out=final[0::2])  # x += tau x_dot, theta += tau theta_dot
        np.add(final[0::2], st[0::2], out=final[0::2])
        np.multiply(acc, tau, out=final[1::2])  # x_dot += tau xacc, theta_dot += tau thetaacc
        np.add(final[1::2], st[1::2], out=final[1::2])
        np.abs(final[0::2], out=self.abs)
        np.greater(self.abs, self.limits, out=self.over)
        terminated, truncated, done, steps = self.terminated[w], self.truncated[w], self.done, self.steps
        np.logical_or(self.over[0], self.over[1], out=terminated)
        np.add(steps, 1, out=steps)
        np.greater_equal(steps, self.max_steps, out=truncated)
        np.logical_or(terminated, truncated, out=done)
        nxt = self.states[w]
        np.copyto(nxt, final)
        np.copyto(nxt, self.pool, where=done)  # ended envs take a start state from the pool
        np.copyto(steps, 0, where=done)
