"""Any gymnasium id with a discrete action space and a flat Box observation, as a batched torch env.

`GymVectorEnv` wraps gymnasium's vector env (`gymnasium.make_vec`, `sync`: every env in this
process; `async`: one process each, `--vector async`) in the interface of the torch envs
(trainer/envs/__init__.py `BatchedEnv`): `reset(seed) -> obs`, `step(actions) -> (obs, reward,
terminated, truncated, info)` as float32/bool tensors on the trainer's device.

Autoreset: gymnasium 1.x vector envs default to NEXT_STEP (an ended env returns its final observation,
and is reset by the *next* `step`, whose action is ignored). The trainer's contract is the torch envs'
one, which is gymnasium's SAME_STEP: an ended env is reset within the step that ended it, the returned
observation is the new episode's first, and the last state's observation is in `info["final_obs"]` (all
envs; rows of envs that did not end equal `obs`). So the vector env is built with
`autoreset_mode=SAME_STEP` (supported by SyncVectorEnv and AsyncVectorEnv since gymnasium 1.1) and the
mode is checked in its metadata. Truncation (a TimeLimit, e.g. CartPole-v1's 500 steps) stays apart
from termination: PPO bootstraps a truncated step from V(final_obs) (trainer/ppo.py).

Seeding: `reset(seed)` seeds env i with `seed + i` (gymnasium's rule); `reset()` draws that seed from
`generator`, so a run is reproducible from its seed as with the torch envs. The facts (spaces,
`reward_threshold`) come from trainer.gym_ids. See docs/architecture.md ("The trainer's flags and envs").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from trainer.gym_ids import GymEnvError, GymFacts

# The best return one episode can get, for ids where it is known, and whether their rewards are never
# positive: they let the trainer's greedy "is it solved yet?" evaluation give up as soon as the target
# is out of reach (trainer/ppo.py evaluate_greedy). Other ids: unbounded (the evaluation runs on).
MAX_RETURN = {"CartPole-v0": 200.0, "CartPole-v1": 500.0, "Acrobot-v1": 0.0, "MountainCar-v0": 0.0}
NEVER_POSITIVE = frozenset({"Acrobot-v1", "MountainCar-v0"})


class GymVectorEnv:
    """`num_envs` copies of one gymnasium env behind the batched torch interface."""

    def __init__(
        self, facts: GymFacts, num_envs: int, device: torch.device | str = "cpu", vector: str = "sync"
    ) -> None:
        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        if facts.missing:
            raise GymEnvError(f"{facts.env_id} needs a package this machine lacks: {facts.missing}")
        if vector not in ("sync", "async"):
            raise ValueError(f"vector must be sync or async, not {vector!r}")
        self.name = facts.env_id
        self.num_envs = num_envs
        self.obs_dim = int(facts.obs_dim or 0)
        self.n_actions = int(facts.n_actions or 0)
        self.action_start = facts.action_start
        self.device = torch.device(device)
        self.max_return = MAX_RETURN.get(facts.env_id, float("inf"))
        self.rewards_never_positive = facts.env_id in NEVER_POSITIVE
        self.generator = torch.Generator()
        self.generator.manual_seed(0)
        self.env = gym.make_vec(
            facts.env_id,
            num_envs=num_envs,
            vectorization_mode=vector,
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        )
        mode = self.env.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            self.env.close()
            raise GymEnvError(f"{facts.env_id}: gymnasium gave a vector env with autoreset mode {mode}, not SAME_STEP")

    def _tensor(self, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, (), generator=self.generator))
        obs, _ = self.env.reset(seed=seed)
        return self._tensor(obs, torch.float32)

    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        acts = actions.detach().to("cpu", torch.int64).numpy() + self.action_start
        obs, reward, terminated, truncated, info = self.env.step(acts)
        final = np.array(obs, dtype=np.float32)
        ended = info.get("_final_obs")
        if ended is not None and ended.any():
            final[ended] = np.stack([np.asarray(o, dtype=np.float32) for o in info["final_obs"][ended]])
        return (
            self._tensor(obs, torch.float32),
            self._tensor(reward, torch.float32),
            self._tensor(terminated, torch.bool),
            self._tensor(truncated, torch.bool),
            {"final_obs": self._tensor(final, torch.float32)},
        )

    def close(self) -> None:
        self.env.close()
