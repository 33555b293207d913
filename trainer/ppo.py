"""PPO (clipped objective, GAE) as importable functions and one small driver class.

Reads top to bottom: `PPOConfig` (one line per field), `Adam` (a tiny hand-written optimizer) and
`FusedAdam` (torch's, for CUDA; see `make_optimizer`), `RolloutBuffer` (preallocated `[num_steps,
num_envs]` storage), `compute_gae`, `ppo_update`, and `PPO`, which ties an env, a policy and an
optimizer together: `collect()` then `update()`.

Truncation is not termination: when an episode is cut by a time limit (CartPole's 500 steps), its last
reward is followed by `gamma * V(final_obs)`, the value of the state it was cut in, not by 0. Only
terminated steps stop the bootstrap. `bootstrap_truncated=False` makes truncation end the returns like a
termination: for a limit the observation shows (snake's hunger), where the state says the game is over.

Host syncs (at each, the host waits for the GPU to catch up): none per env step. Per iteration there
is one, the `nonzero` in `_next_values` (which steps were truncated, to evaluate only those final
observations), and one per epoch when target-KL early stopping is on (`float(kl)`). Losses (`update`
returns a device tensor, `LOSS_NAMES`) and episode statistics (`pop_episode_stats`, a device tensor)
stay on the device: trainer/train.py accumulates them there and reads them once per report (under
DDP it also reads the stop flag that rides on the iteration's one collective, so every rank leaves
together). The env's step may add its own; greedy evaluation (`evaluate_greedy`) checks every 25
steps; checkpoints copy to the host. tests/test_trainer_speed.py counts them.

Speed settings (`PPOConfig`): `precision` "bf16" runs the policy's forward passes (collect and update)
under `torch.autocast(bfloat16)` with fp32 master weights, and computes log-probabilities, losses,
advantages and GAE in fp32 (logits and values are cast to float first). `optimizer` picks the Adam
implementation (`make_optimizer`). A `torch.compile`d policy comes in as `act_model` / `train_model`
(trainer/policy.py `compile_policy`); the plain `policy` keeps the weights either way.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from trainer.args import TrainArgs, default_of
from trainer.envs.registry import skip_final_obs
from trainer.policy import gumbel_noise, log_prob_entropy


@dataclass
class PPOConfig:
    """The update's settings. Defaults and help of the ones that are trainer flags come from
    trainer.args.TrainArgs (`PPOConfig.from_args` builds one from parsed flags)."""

    num_envs: int = default_of("num_envs")
    """environments stepped together (on this rank)"""
    num_steps: int = default_of("num_steps")
    learning_rate: float = default_of("learning_rate")
    anneal_lr: bool = bool(default_of("anneal_lr"))
    anneal_ent: bool = bool(default_of("anneal_ent"))
    gamma: float = default_of("gamma")
    gae_lambda: float = default_of("gae_lambda")
    num_minibatches: int = default_of("num_minibatches")
    update_epochs: int = default_of("update_epochs")
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: float = default_of("clip_coef")
    clip_vloss: bool = bool(default_of("clip_vloss"))
    ent_coef: float = default_of("ent_coef")
    vf_coef: float = default_of("vf_coef")
    max_grad_norm: float = default_of("max_grad_norm")
    bootstrap_truncated: bool = bool(default_of("bootstrap_truncated"))
    death_cost: float = default_of("death_cost")
    death_cost_at: float = default_of("death_cost_at")
    point_gamma: float = default_of("point_gamma")
    target_kl: float | None = None
    """stop the epochs of one update once the approximate KL exceeds this (None: never; flag 0 = off)"""
    precision: str = default_of("precision")
    optimizer: str = "auto"
    """Adam: "auto" (see `make_optimizer`), "foreach" (the hand-written `Adam`) or "fused" (`FusedAdam`)"""

    @classmethod
    def from_args(cls, args: TrainArgs, num_envs: int) -> PPOConfig:
        """The config for parsed trainer flags, with this rank's share of the envs."""
        names = {f.name for f in fields(cls)} & {f.name for f in fields(args)}
        values = {name: getattr(args, name) for name in names}
        values.update(
            num_envs=num_envs,
            anneal_lr=bool(args.anneal_lr),
            anneal_ent=bool(args.anneal_ent),
            clip_vloss=bool(args.clip_vloss),
            bootstrap_truncated=bool(args.bootstrap_truncated),
            target_kl=args.target_kl if args.target_kl and args.target_kl > 0 else None,
        )
        return cls(**values)


class Adam:
    """Adam (Kingma & Ba) over a list of parameters, using torch's multi-tensor `_foreach` ops.

    Why not `torch.optim.Adam`: in torch 2.13 constructing the first `torch.optim` optimizer imports
    torch._dynamo and sympy, about 1 s on a small CPU — as long as solving CartPole takes. This one is
    the same algorithm (bias-corrected moments, eps added to the corrected sqrt of the second moment).
    """

    def __init__(
        self, params: Iterable[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-5
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.lr = lr
        self.betas = betas
        self.eps = eps
        self.t = 0
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        b1, b2 = self.betas
        self.t += 1
        torch._foreach_lerp_(self.exp_avg, grads, 1 - b1)
        torch._foreach_mul_(self.exp_avg_sq, b2)
        torch._foreach_addcmul_(self.exp_avg_sq, grads, grads, value=1 - b2)
        bias1 = 1 - b1**self.t
        bias2 = 1 - b2**self.t
        denom = torch._foreach_sqrt(self.exp_avg_sq)
        torch._foreach_div_(denom, math.sqrt(bias2))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(self.params, self.exp_avg, denom, value=-self.lr / bias1)

    def state_dict(self) -> dict[str, Any]:
        return {
            "lr": self.lr,
            "betas": self.betas,
            "eps": self.eps,
            "t": self.t,
            "exp_avg": [t.detach().cpu() for t in self.exp_avg],
            "exp_avg_sq": [t.detach().cpu() for t in self.exp_avg_sq],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError("optimizer state does not match the model's parameters")
        self.lr, self.betas, self.eps, self.t = state["lr"], tuple(state["betas"]), state["eps"], state["t"]
        for dst, src in zip(self.exp_avg + self.exp_avg_sq, state["exp_avg"] + state["exp_avg_sq"], strict=True):
            dst.copy_(src)


class FusedAdam:
    """`torch.optim.Adam(fused=True)` (one kernel for all parameters) behind `Adam`'s interface.

    `state_dict` is written in `Adam`'s format and `load_state_dict` reads it, so a checkpoint of
    either optimizer resumes with the other (a run moved from a CPU to a GPU, or back).
    """

    def __init__(
        self, params: Iterable[nn.Parameter], lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-5
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=lr, betas=betas, eps=eps, fused=True)

    @property
    def lr(self) -> float:
        return float(self.opt.param_groups[0]["lr"])

    @lr.setter
    def lr(self, value: float) -> None:
        self.opt.param_groups[0]["lr"] = value

    def zero_grad(self) -> None:
        self.opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        self.opt.step()

    def state_dict(self) -> dict[str, Any]:
        group = self.opt.param_groups[0]
        states = [self.opt.state.get(p) or {} for p in self.params]
        return {
            "lr": group["lr"],
            "betas": tuple(group["betas"]),
            "eps": group["eps"],
            "t": int(states[0]["step"]) if states and states[0] else 0,
            "exp_avg": [s["exp_avg"].detach().cpu() if s else torch.zeros_like(p, device="cpu")
                        for s, p in zip(states, self.params, strict=True)],
            "exp_avg_sq": [s["exp_avg_sq"].detach().cpu() if s else torch.zeros_like(p, device="cpu")
                           for s, p in zip(states, self.params, strict=True)],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["exp_avg"]) != len(self.params):
            raise ValueError("optimizer state does not match the model's parameters")
        group = self.opt.param_groups[0]
        group.update(lr=state["lr"], betas=tuple(state["betas"]), eps=state["eps"])
        for p, m, v in zip(self.params, state["exp_avg"], state["exp_avg_sq"], strict=True):
            # torch keeps a fused Adam's step count as a float32 tensor on the parameter's device
            self.opt.state[p] = {
                "step": torch.tensor(float(state["t"]), dtype=torch.float32, device=p.device),
                "exp_avg": m.to(p.device, p.dtype, copy=True),
                "exp_avg_sq": v.to(p.device, p.dtype, copy=True),
            }


def make_optimizer(params: Iterable[nn.Parameter], lr: float, kind: str, device: torch.device) -> Adam | FusedAdam:
    """The Adam named by `PPOConfig.optimizer`; "auto" is `FusedAdam` on CUDA, the hand-written `Adam`
    on CPU.

    Why not fused on CPU too (torch 2.13 has a fused CPU kernel): measured on a shared 2-core AVX2 CPU
    (1 thread, median of 10 interleaved iterations), a PPO iteration of the snake preset (128 envs x 32
    steps, 8 minibatch steps) took 160 ms with the hand-written Adam and 161 ms with the fused one
    (CartPole, 8 envs: 36 vs 37 ms) - no gain - while the first `torch.optim` optimizer costs 1.7-2.2 s
    of imports: CartPole's time to solve from process start, seeds 1-5, went from a median 4.2 s (3.8
    to 5.8) to 6.6 s (5.5 to 7.4) with the same steps to solve.
    """
    if kind == "auto":
        kind = "fused" if device.type == "cuda" else "foreach"
    if kind == "fused":
        return FusedAdam(params, lr=lr)
    if kind == "foreach":
        return Adam(params, lr=lr)
    raise ValueError(f"unknown optimizer {kind!r}: expected 'auto', 'foreach' or 'fused'")


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """The context of a policy forward pass: bf16 autocast for `precision` "bf16", else nothing.

    bf16 is for GPUs (tensor cores, half the memory traffic). On a CPU without bf16 instructions it
    is slower: on this project's 2-core AVX2 machine (no avx512_bf16) a PPO iteration of the snake
    preset (128 envs, 1 thread) took a median 491 ms in bf16 against 160 ms in fp32 (3.1x slower).
    """
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    if precision != "fp32":
        raise ValueError(f"unknown precision {precision!r}: expected 'fp32' or 'bf16'")
    return contextlib.nullcontext()


class RolloutBuffer:
    """`[num_steps, num_envs, ...]` storage for one rollout, allocated once."""

    def __init__(
        self, num_steps: int, num_envs: int, obs_dim: int, device: torch.device, final_obs: bool = True
    ) -> None:
        shape = (num_steps, num_envs)
        self.obs = torch.zeros(*shape, obs_dim, device=device)
        # The observations truncated steps bootstrap from; None when truncations are not bootstrapped.
        self.final_obs = torch.zeros(*shape, obs_dim, device=device) if final_obs else None
        self.actions = torch.zeros(shape, dtype=torch.int64, device=device)
        self.logprobs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.rewards = torch.zeros(shape, device=device)
        self.terminated = torch.zeros(shape, dtype=torch.bool, device=device)
        self.truncated = torch.zeros(shape, dtype=torch.bool, device=device)
        self.dones = torch.zeros(shape, dtype=torch.bool, device=device)
        # whether an episode that ended at this step counts in the episode statistics (the env's
        # info["counted"]; snake's late starts are not whole games)
        self.counted = torch.ones(shape, dtype=torch.bool, device=device)


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float | torch.Tensor,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns, all tensors `[T, N]`.

    `gamma` discounts what follows each step: one number, or one per step `[T, N]` (`PPO.discounts`).

    `next_values[t]` is the value of the state after step t *of the same episode*: V(obs[t+1]) when
    the episode goes on, V(final_obs[t]) when it was truncated; it is ignored where `terminated`.
    `dones` (terminated or truncated) cuts the GAE recursion at episode boundaries.
    """
    not_term = (~terminated).to(values.dtype)
    not_done = (~dones).to(values.dtype)
    deltas = rewards + gamma * next_values * not_term - values
    advantages = torch.zeros_like(values)
    last = torch.zeros_like(values[0])
    per_step = isinstance(gamma, torch.Tensor)
    for t in range(values.shape[0] - 1, -1, -1):
        last = deltas[t] + (gamma[t] if per_step else gamma) * gae_lambda * not_done[t] * last
        advantages[t] = last
    return advantages, advantages + values


LOSS_NAMES = ("loss_policy", "loss_value", "entropy", "approx_kl", "clipfrac")


def ppo_update(
    model: nn.Module,
    optimizer: Adam | FusedAdam,
    batch: dict[str, torch.Tensor],
    cfg: PPOConfig,
    kl_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ent_coef: float | None = None,
) -> torch.Tensor:
    """Several epochs of clipped-PPO minibatch steps on one flattened rollout batch.

    Returns the means over minibatches of `LOSS_NAMES`, a `[5]` tensor on the batch's device (read it
    when reporting: reading it here would be a host sync per iteration).
    `kl_reduce` averages the approximate KL across ranks so every DDP rank stops at the same epoch.
    `ent_coef` overrides `cfg.ent_coef` (an annealed weight, `PPO.ent_at`).
    """
    ent_weight = cfg.ent_coef if ent_coef is None else ent_coef
    size = batch["obs"].shape[0]
    mb_size = max(1, size // cfg.num_minibatches)
    device = batch["obs"].device
    sums = torch.zeros(len(LOSS_NAMES), device=device)
    # One minibatch's rows, gathered into the same tensors each time: a fresh 1 MB gather output cost
    # its allocation again every minibatch (the snake preset's update ~2% shorter).
    mb = {k: v.new_empty((mb_size, *v.shape[1:])) for k, v in batch.items()}
    n_mb = 0
    for _ in range(cfg.update_epochs):
        perm = torch.randperm(size, device=device)
        epoch_kl = torch.zeros((), device=device)
        for start in range(0, size - mb_size + 1, mb_size):
            idx = perm[start : start + mb_size]
            # index_select, not batch[k][idx]: the same rows, gathered faster on a CPU (1024 snake
            # observations of 4096: 68 against 279 us hot in cache; a preset update 4% shorter).
            for k, v in batch.items():
                torch.index_select(v, 0, idx, out=mb[k])
            with autocast(device, cfg.precision):
                logits, new_values = model(mb["obs"])
            # Losses in fp32 whatever the forward ran in.
            new_logp, entropy = log_prob_entropy(logits.float(), mb["actions"])
            logratio = new_logp - mb["logprobs"]
            ratio = logratio.exp()
            adv = mb["advantages"]
            if cfg.norm_adv and adv.numel() > 1:
                adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            pg_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
            new_values = new_values[:, 0].float()
            returns = mb["returns"]
            if cfg.clip_vloss:
                old_values = mb["values"]
                clipped = old_values + (new_values - old_values).clamp(-cfg.clip_coef, cfg.clip_coef)
                v_loss = 0.5 * torch.max((new_values - returns) ** 2, (clipped - returns) ** 2).mean()
            else:
                v_loss = 0.5 * ((new_values - returns) ** 2).mean()
            ent = entropy.mean()
            loss = pg_loss - ent_weight * ent + cfg.vf_coef * v_loss
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(optimizer.params, cfg.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                approx_kl = ((ratio - 1) - logratio).mean()
                clipfrac = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
                sums += torch.stack((pg_loss.detach(), v_loss.detach(), ent.detach(), approx_kl, clipfrac))
                epoch_kl = approx_kl
            n_mb += 1
        if cfg.target_kl is not None:
            kl = kl_reduce(epoch_kl) if kl_reduce is not None else epoch_kl
            if float(kl) > cfg.target_kl:  # a host sync per epoch, only with target-KL on
                break
    return sums / max(n_mb, 1)


class PPO:
    """One env batch + one policy + Adam. One iteration = `collect()` a rollout, then `update()`.

    `score` turns a rollout's rewards into per-step score points (the env spec's `score`, e.g. apples
    for snake); None: an episode's score is its return. `act_model` runs the rollout's forward passes
    (a compiled policy; default `policy`), `train_model` the update's (DDP and/or compiled).
    """

    def __init__(
        self,
        env: Any,
        policy: nn.Module,
        cfg: PPOConfig,
        train_model: nn.Module | None = None,
        kl_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        score: Callable[[torch.Tensor], torch.Tensor] | None = None,
        act_model: nn.Module | None = None,
        lost: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> None:
        self.env = env
        self.score = score
        self.policy = policy
        self.train_model = train_model if train_model is not None else policy  # a DDP wrapper, if any
        self.act_model = act_model if act_model is not None else policy
        self.cfg = cfg
        # The entropy weight of the next update: the trainer sets it from `ent_at` each iteration.
        self.ent_coef = cfg.ent_coef
        # What a lost episode costs beyond the env's own reward in the next rollout (`death_at`), and
        # which steps are losses (the env spec's `lost`).
        self.death_extra = 0.0
        self.lost = lost
        self.kl_reduce = kl_reduce
        self.device = env.device
        autocast(self.device, cfg.precision)  # refuses an unknown precision now, not mid-rollout
        self.optimizer = make_optimizer(policy.parameters(), cfg.learning_rate, cfg.optimizer, self.device)
        self.buf = RolloutBuffer(cfg.num_steps, env.num_envs, env.obs_dim, self.device, cfg.bootstrap_truncated)
        if not cfg.bootstrap_truncated:
            skip_final_obs(env)  # nothing reads it (`_next_values`)
        self.obs: torch.Tensor | None = None
        n = env.num_envs
        self.ep_return = torch.zeros(n, device=self.device)
        self.ep_length = torch.zeros(n, device=self.device)
        self.ep_score = torch.zeros(n, device=self.device)
        # Finished-episode sums since the last `pop_episode_stats`: return, length, score, count.
        self.finished = torch.zeros(4, device=self.device)

    def start(self, seed: int) -> None:
        self.obs = self.env.reset(seed=seed)
        self.ep_return.zero_()
        self.ep_length.zero_()
        self.ep_score.zero_()

    @torch.no_grad()
    def collect(self) -> None:
        assert self.obs is not None, "call start(seed) first"
        buf, env, policy = self.buf, self.env, self.act_model
        obs = self.obs
        noise = None
        for t in range(self.cfg.num_steps):
            with autocast(self.device, self.cfg.precision):
                logits, value = policy(obs)
            logp_all = torch.log_softmax(logits.float(), dim=1)
            if noise is None:  # the rollout's sampling noise in one draw: the same actions as a draw a step
                noise = gumbel_noise((self.cfg.num_steps, *logp_all.shape), logp_all.device)
            action = torch.argmax(logp_all + noise[t], dim=1)  # Gumbel-max, as `sample_actions`
            buf.obs[t] = obs
            buf.actions[t] = action
            buf.logprobs[t] = logp_all.gather(1, action[:, None])[:, 0]
            buf.values[t] = value[:, 0]
            obs, reward, terminated, truncated, info = env.step(action)
            if self.death_extra and self.lost is not None:
                reward = reward - self.death_extra * self.lost(reward, terminated).to(reward.dtype)
            buf.rewards[t] = reward
            buf.terminated[t] = terminated
            buf.truncated[t] = truncated
            if buf.final_obs is not None:
                buf.final_obs[t] = info["final_obs"]
            if "counted" in info:
                buf.counted[t] = info["counted"]
        self.obs = obs
        torch.bitwise_or(buf.terminated, buf.truncated, out=buf.dones)
        self._track_episodes()

    def _track_episodes(self) -> None:
        """Add the episodes that ended in this rollout to `finished`, vectorised over [T, N].

        An episode ending at step t started after the previous done of its env (or carried over from
        the previous rollout, `ep_*`): its return is a difference of cumulative sums.
        """
        buf = self.buf
        steps = buf.rewards.shape[0]
        done = buf.dones
        t_idx = torch.arange(steps, device=self.device)[:, None]
        last_done = torch.where(done, t_idx, -1).cummax(dim=0).values  # last done index <= t
        prev = torch.cat((torch.full_like(last_done[:1], -1), last_done[:-1]))  # last done index < t
        fresh = (prev < 0).to(buf.rewards.dtype)
        d = done.to(buf.rewards.dtype)
        scored = d * buf.counted  # the episodes that end here and count in the statistics
        carried = (self.ep_return, self.ep_score, self.ep_length)
        points = buf.rewards if self.score is None else self.score(buf.rewards)
        series = (buf.rewards, points, torch.ones_like(buf.rewards))
        totals = []
        for i, (carry, x) in enumerate(zip(carried, series, strict=True)):
            c = torch.cat((torch.zeros_like(x[:1]), x.cumsum(dim=0)))  # c[k] = sum of x[:k]
            start = c.gather(0, prev + 1)
            per_step = c[1:] - start + fresh * carry  # the episode's total so far, at every step
            totals.append((per_step * scored).sum())
            # What carries into the next rollout: the running total of each env's current episode.
            end = per_step[-1] * (1 - d[-1])
            carried[i].copy_(end)
        self.finished += torch.stack((totals[0], totals[2], totals[1], scored.sum()))

    def pop_episode_stats(self) -> torch.Tensor:
        """[sum of returns, sum of lengths, sum of scores, count] of the episodes finished since the last
        call: a tensor on the env's device (no host sync; the trainer reads it once per report)."""
        out = self.finished.clone()
        self.finished.zero_()
        return out

    @torch.no_grad()
    def _next_values(self) -> torch.Tensor:
        buf = self.buf
        # `value` is the plain module's method: eager, in the rollout's precision.
        with autocast(self.device, self.cfg.precision):
            last_value = self.policy.value(self.obs)[:, 0].float()
        next_values = torch.cat((buf.values[1:], last_value[None]), dim=0)
        if not self.cfg.bootstrap_truncated:
            return next_values  # truncations count as terminations (`update`): nothing to bootstrap
        # Truncated steps bootstrap from the value of the state they were cut in (one host sync).
        where = (buf.truncated & ~buf.terminated).nonzero(as_tuple=True)
        if where[0].numel() > 0:
            with autocast(self.device, self.cfg.precision):
                next_values[where] = self.policy.value(buf.final_obs[where])[:, 0].float()
        return next_values

    def advantages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE advantages and returns `[T, N]` of the last rollout."""
        buf = self.buf
        return compute_gae(
            buf.rewards,
            buf.values,
            self._next_values(),
            buf.terminated if self.cfg.bootstrap_truncated else buf.dones,
            buf.dones,
            self.discounts(buf.rewards),
            self.cfg.gae_lambda,
        )

    def discounts(self, rewards: torch.Tensor) -> float | torch.Tensor:
        """What follows each step is discounted by: --gamma, and with --point-gamma G also G for each
        point the step scored (the env spec's `score`: snake's apples), so a detour of a few steps costs
        little and the risk of losing the apples to come costs as much as ever."""
        if self.cfg.point_gamma == 1.0 or self.score is None:
            return self.cfg.gamma
        return self.cfg.gamma * self.cfg.point_gamma ** self.score(rewards)

    def update(self, lr: float | None = None) -> torch.Tensor:
        """GAE, then `ppo_update` with `ent_coef` as the entropy weight; returns its `[5]` device tensor
        of mean losses (`LOSS_NAMES`). `lr`: this iteration's learning rate (`lr_at`)."""
        if lr is not None:
            self.optimizer.lr = lr
        buf = self.buf
        advantages, returns = self.advantages()
        batch = {
            "obs": buf.obs.reshape(-1, buf.obs.shape[-1]),
            "actions": buf.actions.reshape(-1),
            "logprobs": buf.logprobs.reshape(-1),
            "values": buf.values.reshape(-1),
            "advantages": advantages.reshape(-1),
            "returns": returns.reshape(-1),
        }
        return ppo_update(self.train_model, self.optimizer, batch, self.cfg, self.kl_reduce, self.ent_coef)

    def lr_at(self, iteration: int, num_iterations: int) -> float:
        """Linear annealing: full rate at iteration 0, approaching 0 at `num_iterations`."""
        return _annealed(self.cfg.learning_rate, self.cfg.anneal_lr, iteration, num_iterations)

    def ent_at(self, iteration: int, num_iterations: int) -> float:
        """The entropy weight: constant, or with `anneal_ent` on the LR's schedule (greedy play wants a
        sharp policy at the end; exploration matters most early)."""
        return _annealed(self.cfg.ent_coef, self.cfg.anneal_ent, iteration, num_iterations)

    def death_at(self, iteration: int, num_iterations: int) -> float:
        """The extra cost of a lost episode in the rollout after `iteration`: --death-cost minus the
        env's own 1 once `death_cost_at` of the iterations are done, else 0. A run learns to play
        first; later, losses that save a few steps cost more than the discount makes them (issue 54)."""
        late = iteration >= self.cfg.death_cost_at * num_iterations
        return self.cfg.death_cost - 1.0 if late and self.cfg.death_cost != 1.0 else 0.0


def _annealed(start: float, anneal: bool, iteration: int, num_iterations: int) -> float:
    """`start`, or with `anneal` linear from it at iteration 0 towards 0 at `num_iterations`."""
    return start * max(0.0, 1.0 - iteration / max(num_iterations, 1)) if anneal else start


@torch.no_grad()
def evaluate_greedy(
    policy: nn.Module,
    env: Any,
    episodes: int,
    seed: int,
    max_steps: int = 100_000,
    target: float | None = None,
    max_return: float | None = None,
) -> torch.Tensor:
    """Returns of the first episode of each of `episodes` envs under argmax actions of `policy.logits`.

    With `target` and `max_return` (the best return one episode can get), the evaluation gives up as
    soon as the mean can no longer reach `target`; unfinished episodes then keep their partial return,
    so the mean stays below `target`. That makes frequent "is it solved yet?" checks cheap. When the
    env's rewards are never positive (`env.rewards_never_positive`, e.g. Acrobot-v1's -1 per step), an
    unfinished episode's return can only fall, so what it has lost already counts too.
    """
    skip_final_obs(env)
    obs = env.reset(seed=seed)
    returns = torch.zeros(env.num_envs, device=env.device)
    running = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    allowed_loss = None if target is None or max_return is None else episodes * (max_return - target)
    only_falls = bool(getattr(env, "rewards_never_positive", False))
    for step in range(max_steps):
        obs, reward, terminated, truncated, _ = env.step(policy.logits(obs).argmax(dim=1))
        returns += reward * running
        running &= ~(terminated | truncated)
        # Check only now and then: each check is a host sync.
        if step % 25 == 24:
            if not bool(running.any()):
                break
            if allowed_loss is not None:
                lost = float(((max_return - returns) * (~running | only_falls)).sum())
                if lost > allowed_loss:
                    break
    return returns[:episodes]
