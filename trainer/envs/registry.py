"""What each env is, in one place: an `EnvSpec` per env, looked up by name with `get_spec`.

train, eval, export and the PPO loop ask the spec, never the env's name: how to build a batch of it,
its observation size and action count, which trainer flags configure it (`settings`, TrainArgs field
names that are also fields of its params class), how an episode's score is counted, what a won
episode is, and what the export manifest and an evaluation record about it. Adding an env is adding
one spec here (and its preset in trainer/args.py). See docs/architecture.md.

Besides the built-in names, `get_spec` takes any gymnasium id the trainer can train (trainer.gym_ids
checks it): a `GymSpec`, stepping gymnasium's own vector env through trainer/envs/gym.py.

`settings` travel as plain dicts (`{"grid_size": 6, "action_mode": "relative"}`): from TrainArgs, from
a checkpoint's config, from a manifest. `spec.params(values)` keeps the keys the env reads, drops the
rest and those that are None (its params class' default then applies).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from trainer.envs.cartpole import CartPole, CartPoleParams
from trainer.envs.gym import GymVectorEnv
from trainer.envs.snake import PLANES, Snake, SnakeParams, danger_at, obs_size
from trainer.gym_ids import GymEnvError, GymFacts, NotRegistered, gym_facts

ScoreFn = Callable[[torch.Tensor], torch.Tensor]
LostFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class EnvSpec:
    """Facts about one env. Subclass, override what differs from these defaults, and register it."""

    name: ClassVar[str]
    params_cls: ClassVar[type[Any]]
    settings: ClassVar[tuple[str, ...]] = ()
    # Per-step points of an episode's score from its rewards, or None: the env has no score apart
    # from its return (the trainer then reports no `score_mean`).
    score: ClassVar[ScoreFn | None] = None
    # Which steps lose their episode, from (reward, terminated): what --death-cost makes cost more; None:
    # the env has no such end apart from its rewards (the flag is refused).
    lost: ClassVar[LostFn | None] = None
    # The eval result key for the fraction of won episodes, when the env can be won (see `won`).
    win_metric: ClassVar[str | None] = None
    # Whether the web page can play a model of this env (manifest.json `playable`): snake only.
    playable: ClassVar[bool] = False

    def params(self, values: Mapping[str, Any] | None = None, **more: Any) -> Any:
        """The params for these settings (keys this env does not read are ignored)."""
        given = {**(values or {}), **more}
        return self.params_cls(**{k: given[k] for k in self.settings if given.get(k) is not None})

    def settings_of(self, params: Any) -> dict[str, Any]:
        return {k: getattr(params, k) for k in self.settings}

    def build(self, num_envs: int, params: Any, device: torch.device | str) -> Any:
        raise NotImplementedError

    def make(self, num_envs: int, device: torch.device | str = "cpu", seed: int = 0, **settings: Any) -> Any:
        """`num_envs` envs on `device`, their random stream seeded with `seed` (reset(seed) reseeds)."""
        env = self.build(num_envs, self.params(settings), device)
        env.generator.manual_seed(seed)
        return env

    def run_options(self, args: Any) -> dict[str, Any]:
        """Keyword arguments of `make` for the training env that are not settings (how, not what, to step)."""
        return {}

    def obs_dim(self, params: Any) -> int:
        return int(params.obs_dim)

    def n_actions(self, params: Any) -> int:
        return int(params.n_actions)

    def episode_score(self, rewards: torch.Tensor) -> torch.Tensor:
        """Per-step score points: `score(rewards)`, or the rewards themselves when there is no score."""
        return rewards if self.score is None else self.score(rewards)

    def won(self, reward: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor | None:
        """Which envs won their episode this step; None when the env cannot be won."""
        return None

    def cnn_grid(self, params: Any) -> int | None:
        """The board side the cnn policy reads, or None: the env's observations are not a board."""
        return None

    def mask_at(self, params: Any) -> int | None:
        """Where the observation's danger values start (one per action: 1.0 = that action ends the
        game), for the policy's `--mask 1`; None: this env has none."""
        return None

    def manifest_fields(self, params: Any) -> dict[str, Any]:
        """The env's fields of an exported model's manifest.json (the web page reads them)."""
        return {"grid_size": None, "action_mode": None}

    def eval_fields(self, params: Any) -> dict[str, Any]:
        """Facts an evaluation result records about the env it ran."""
        return {}

    def settings_from_dims(self, obs_dim: int, n_actions: int) -> dict[str, Any] | None:
        """Settings under which this env has these sizes (a model without a manifest), else None."""
        return None


class CartPoleSpec(EnvSpec):
    name = "cartpole"
    params_cls = CartPoleParams

    def build(self, num_envs: int, params: Any, device: torch.device | str) -> CartPole:
        return CartPole(num_envs, params, device=device)

    def settings_from_dims(self, obs_dim: int, n_actions: int) -> dict[str, Any] | None:
        return {} if obs_dim == CartPoleParams().obs_dim else None


def _death(reward: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
    """Snake's lost episodes: a death is the only termination that comes with a reward of -1."""
    return terminated & (reward < 0)


def _apples(rewards: torch.Tensor) -> torch.Tensor:
    """Snake's score is apples eaten: the +1 rewards (a death's -1 takes none away)."""
    return rewards.clamp(min=0)


class SnakeSpec(EnvSpec):
    name = "snake"
    params_cls = SnakeParams
    settings = ("grid_size", "action_mode", "space")
    score = staticmethod(_apples)
    lost = staticmethod(_death)
    win_metric = "full_board_fraction"
    playable = True

    def build(self, num_envs: int, params: Any, device: torch.device | str) -> Snake:
        return Snake(num_envs, params, device=device)

    def make(self, num_envs: int, device: torch.device | str = "cpu", seed: int = 0, late_starts: float = 0.0,
             **settings: Any) -> Snake:
        env = super().make(num_envs, device, seed, **settings)
        env.late_starts = late_starts  # how it steps, not what: read by every step
        return env

    def run_options(self, args: Any) -> dict[str, Any]:
        # the curriculum is the training env's only: evaluations start every game afresh
        return {"late_starts": args.late_starts}

    def won(self, reward: torch.Tensor, terminated: torch.Tensor) -> torch.Tensor:
        # A win (a full board) is the only termination that comes with a reward of +1.
        return terminated & (reward > 0)

    def cnn_grid(self, params: Any) -> int:
        return int(params.grid_size)

    def mask_at(self, params: Any) -> int | None:
        # the danger values (straight, left, right) are in the relative actions' order
        return danger_at(params.grid_size) if params.action_mode == "relative" else None

    def manifest_fields(self, params: Any) -> dict[str, Any]:
        return {"grid_size": params.grid_size, "action_mode": params.action_mode, "space": params.space}

    def eval_fields(self, params: Any) -> dict[str, Any]:
        return {"grid_size": params.grid_size}

    def settings_from_dims(self, obs_dim: int, n_actions: int) -> dict[str, Any] | None:
        # 3*G*G + 8 and 3*H*H + 11 never meet (G*G - H*H = 1 has no board), so the width tells both
        for space in (False, True):
            g = math.isqrt(max(0, obs_dim - obs_size(0, space)) // PLANES)
            if g >= 4 and obs_size(g, space) == obs_dim:
                return {"grid_size": g, "action_mode": "relative" if n_actions == 3 else "absolute", "space": space}
        return None


@dataclass(frozen=True)
class GymParams:
    env_id: str
    obs_dim: int
    n_actions: int


class GymSpec(EnvSpec):
    """A gymnasium id: no settings (the id is the env); `--vector` picks sync or async stepping."""

    params_cls = GymParams

    def __init__(self, facts: GymFacts) -> None:
        self.facts = facts
        self.name = facts.env_id  # type: ignore[misc] - per instance: one spec per id

    def params(self, values: Mapping[str, Any] | None = None, **more: Any) -> GymParams:
        return GymParams(self.facts.env_id, int(self.facts.obs_dim or 0), int(self.facts.n_actions or 0))

    def make(
        self, num_envs: int, device: torch.device | str = "cpu", seed: int = 0, vector: str = "sync", **settings: Any
    ) -> GymVectorEnv:
        env = GymVectorEnv(self.facts, num_envs, device, vector)
        env.generator.manual_seed(seed)
        return env

    def run_options(self, args: Any) -> dict[str, Any]:
        return {"vector": args.vector}

    def manifest_fields(self, params: Any) -> dict[str, Any]:
        import gymnasium

        return {**super().manifest_fields(params), "gymnasium_version": gymnasium.__version__}


SPECS: dict[str, EnvSpec] = {spec.name: spec for spec in (CartPoleSpec(), SnakeSpec())}


@functools.cache
def _gym_spec(env_id: str) -> GymSpec:
    facts = gym_facts(env_id)
    if facts.missing:
        raise GymEnvError(f"{env_id} needs a package this machine lacks: {facts.missing}")
    return GymSpec(facts)


def get_spec(name: str) -> EnvSpec:
    """The spec of the env called `name` (a built-in name or a gymnasium id); ValueError saying why not."""
    if name in SPECS:
        return SPECS[name]
    try:
        return _gym_spec(name)
    except NotRegistered as e:
        known = ", ".join(map(repr, sorted(SPECS)))
        raise ValueError(f"unknown env {name!r}: expected one of {known}, or a gymnasium id ({e})") from None


def close_env(env: Any) -> None:
    """Release what an env holds (a gymnasium vector env's worker processes); the torch envs hold nothing."""
    close = getattr(env, "close", None)
    if close is not None:
        close()


def skip_final_obs(env: Any) -> None:
    """Tell an env that no one reads its `info["final_obs"]` (PPO without truncation bootstrap, greedy
    play): one with a costly final observation (snake: `final_obs_wanted`) then leaves it None."""
    if hasattr(env, "final_obs_wanted"):
        env.final_obs_wanted = False


def spec_for_dims(obs_dim: int, n_actions: int) -> tuple[EnvSpec, dict[str, Any]]:
    """The first env (in SPECS order) with these sizes, and its settings; ValueError if none has them."""
    for spec in SPECS.values():
        settings = spec.settings_from_dims(obs_dim, n_actions)
        if settings is not None:
            return spec, settings
    raise ValueError(f"cannot tell the env of a model with {obs_dim} inputs")
