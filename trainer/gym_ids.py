"""Which gymnasium ids the trainer can train, told without torch (thrust-remote asks on the laptop).

The trainer takes any registered gymnasium id whose action space is `Discrete` and whose observation
is a flat `Box` (one axis): `CartPole-v1`, `Acrobot-v1`, `MountainCar-v0`, `LunarLander-v3` with box2d.
`gym_facts(id)` builds one env to read its spaces and returns them with the registry's facts
(`reward_threshold`, `max_episode_steps`); `GymEnvError` says plainly why an id is refused. An id that
is registered but needs a package this machine lacks (box2d, mujoco) gives facts with `missing` set:
the laptop cannot check its spaces, the host (which may have the package) does.

gymnasium is imported here, lazily: `trainer.args` calls this only for names that are not built in.
See docs/architecture.md ("The trainer's flags and envs").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


class GymEnvError(ValueError):
    """An env id the trainer cannot train (not registered, wrong spaces, gymnasium missing)."""


class NotRegistered(GymEnvError):
    """No gymnasium env has this id (the message is gymnasium's, with its "Did you mean" hint)."""


@dataclass(frozen=True)
class GymFacts:
    env_id: str
    obs_dim: int | None  # None when `missing`
    n_actions: int | None
    action_start: int = 0  # Discrete(n, start=s): the policy's action i is s + i
    reward_threshold: float | None = None  # gymnasium's "solved" return, when the registry has one
    max_episode_steps: int | None = None
    missing: str | None = None  # why the env cannot be built on this machine (a missing package)


def _gymnasium():  # noqa: ANN202 - the module, typed by its own stubs
    try:
        import gymnasium
    except ImportError:
        raise GymEnvError("gymnasium ids need the gymnasium package: pip install 'gymnasium>=1.0'") from None
    return gymnasium


def space_problem(env_id: str, obs_space: object, action_space: object) -> str | None:
    """Why the trainer cannot train an env with these spaces, or None when it can."""
    from gymnasium import spaces

    if not isinstance(action_space, spaces.Discrete):
        return f"{env_id} has a {action_space} action space; the trainer needs a discrete one (Discrete(n))"
    if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
        return f"{env_id} observes {obs_space}; the trainer needs a flat Box observation (one axis)"
    return None


@functools.cache
def gym_facts(env_id: str) -> GymFacts:
    """The facts of a trainable gymnasium id; GymEnvError when it is not one."""
    gym = _gymnasium()
    try:
        reg = gym.spec(env_id)
    except gym.error.Error as e:
        raise NotRegistered(str(e)) from None
    base = {"reward_threshold": reg.reward_threshold, "max_episode_steps": reg.max_episode_steps}
    try:
        env = gym.make(env_id, disable_env_checker=True)
    except (gym.error.DependencyNotInstalled, ImportError) as e:
        return GymFacts(env_id, None, None, missing=str(e), **base)
    except Exception as e:  # an env's own constructor failing: say which env and why
        raise GymEnvError(f"gymnasium could not build {env_id}: {type(e).__name__}: {e}") from None
    try:
        problem = space_problem(env_id, env.observation_space, env.action_space)
        if problem:
            raise GymEnvError(problem)
        return GymFacts(
            env_id,
            int(env.observation_space.shape[0]),
            int(env.action_space.n),
            action_start=int(env.action_space.start),
            **base,
        )
    finally:
        env.close()
