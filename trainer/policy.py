"""Actor-critic networks. `forward(obs) -> (logits [B, n_actions], value [B, 1])`; `logits(obs)` is the
first alone (greedy play), `value(obs)` the second.

- `MLPPolicy`: separate actor and critic MLPs (a shared trunk made PPO on CartPole less stable).
- `CNNPolicy`: for snake. The first `3*G*G` observation values are reshaped to `[3, G, G]` planes, two
  3x3 convolutions read them, and the 8 trailing features (direction, danger, hunger) are appended to
  the flattened maps before a shared hidden layer and the two heads.

Either network may mask moves (`mask_at`, the trainer's `--mask 1` for snake): the observation's three
danger values (straight, left, right: 1.0 where that move ends the game next step) push those moves'
logits down by `MASK_PENALTY`, unless all three are deadly. The mask is part of `forward` and `logits`,
so sampling, the update's log-probabilities, greedy play and the exported ONNX graph (what the page
runs) all apply the same one.

`compile_policy` wraps a policy in `torch.compile` for `--compile` (mode per device: `compile_mode`).

Action sampling lives here too (`sample_actions`), written with plain tensor ops: importing
`torch.distributions` is cheap but its validation and object creation cost per call adds up at 8 envs.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainer.envs.snake import FEATURES, PLANES, SPACE_FEATURES, obs_size

# Large enough that softmax gives a masked move probability 0 in fp32 and bf16; finite, so the entropy's
# p * log p is 0 * -1e9 = 0 rather than 0 * -inf = NaN.
MASK_PENALTY = 1e9

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "silu": nn.SiLU}


def _init(layer: nn.Linear | nn.Conv2d, gain: float) -> nn.Module:
    # Orthogonal weights and zero bias: the usual PPO initialisation; small gain on the policy head
    # keeps the first policy close to uniform.
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(sizes: list[int], activation: str, out_gain: float) -> nn.Sequential:
    act = ACTIVATIONS[activation]
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 2):
        layers += [_init(nn.Linear(sizes[i], sizes[i + 1]), math.sqrt(2)), act()]
    layers.append(_init(nn.Linear(sizes[-2], sizes[-1]), out_gain))
    return nn.Sequential(*layers)


def mask_deadly(logits: torch.Tensor, obs: torch.Tensor, at: int | None) -> torch.Tensor:
    """`logits` with the moves that `obs[:, at:at+3]` marks deadly pushed down by MASK_PENALTY, unless
    every move is deadly (the game ends whatever is chosen: the policy's own preference stands)."""
    if at is None:
        return logits
    danger = obs[:, at : at + logits.shape[1]]
    # plain arithmetic, not masked_fill: the same few ops in torch, under autocast and in ONNX
    open_move = (danger.sum(dim=1, keepdim=True) < logits.shape[1] - 0.5).to(danger.dtype)
    return logits - (MASK_PENALTY * danger * open_move).to(logits.dtype)


class MLPPolicy(nn.Module):
    def __init__(
        self, obs_dim: int, n_actions: int, hidden: int = 64, layers: int = 2, activation: str = "tanh",
        mask_at: int | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        sizes = [obs_dim] + [hidden] * layers
        self.actor = _mlp([*sizes, n_actions], activation, 0.01)
        self.critic = _mlp([*sizes, 1], activation, 1.0)
        self.mask_at = mask_at  # a plain attribute: the weights (state_dict) are the same either way

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logits(obs), _layers(self.critic, obs)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The actor's output alone: what greedy play needs (half the work of `forward`)."""
        return mask_deadly(_layers(self.actor, obs), obs, self.mask_at)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return _layers(self.critic, obs)


def _layers(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    # Each layer's own `forward`, not `Module.__call__`: the call's hook checks cost ~5 us a layer,
    # about a third of a CartPole policy's forward at 8-20 envs (rollouts and greedy evaluations run
    # thousands of them in a run that solves in ~0.5 s). So hooks on the inner layers do not run: hook
    # the policy itself.
    for layer in seq:
        x = layer.forward(x)
    return x


class CNNPolicy(nn.Module):
    def __init__(
        self, grid_size: int, n_actions: int, hidden: int = 256, channels: int = 32, space: bool = False,
        mask_at: int | None = None,
    ) -> None:
        super().__init__()
        self.g = grid_size
        self.mask_at = mask_at
        g2 = grid_size * grid_size
        self.planes = PLANES * g2
        self.conv = nn.Sequential(
            _init(nn.Conv2d(PLANES, channels // 2, 3, padding=1), math.sqrt(2)),
            nn.ReLU(),
            _init(nn.Conv2d(channels // 2, channels, 3, padding=1), math.sqrt(2)),
            nn.ReLU(),
            nn.Flatten(),
        )
        features = FEATURES + (SPACE_FEATURES if space else 0)
        self.trunk = nn.Sequential(_init(nn.Linear(channels * g2 + features, hidden), math.sqrt(2)), nn.ReLU())
        self.actor = _init(nn.Linear(hidden, n_actions), 0.01)
        self.critic = _init(nn.Linear(hidden, 1), 1.0)

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        planes = obs[:, : self.planes].reshape(-1, PLANES, self.g, self.g)
        return self.trunk(torch.cat((self.conv(planes), obs[:, self.planes :]), dim=1))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self._features(obs)
        return mask_deadly(self.actor(h), obs, self.mask_at), self.critic(h)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return mask_deadly(self.actor(self._features(obs)), obs, self.mask_at)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self._features(obs))


def build_policy(
    kind: str, obs_dim: int, n_actions: int, hidden: int, grid_size: int | None = None, activation: str = "tanh",
    mask_at: int | None = None,
) -> nn.Module:
    """The policy named by `--policy` ("mlp" or "cnn"; "cnn" needs the snake grid size); `mask_at`: where
    the observation's danger values start, to mask deadly moves (`mask_deadly`), or None."""
    if kind == "mlp":
        return MLPPolicy(obs_dim, n_actions, hidden=hidden, activation=activation, mask_at=mask_at)
    if kind == "cnn":
        if grid_size is None or obs_dim not in (obs_size(grid_size), obs_size(grid_size, space=True)):
            raise ValueError("the cnn policy reads snake observations: it needs --env snake")
        space = obs_dim == obs_size(grid_size, space=True)
        return CNNPolicy(grid_size, n_actions, hidden=hidden, space=space, mask_at=mask_at)
    raise ValueError(f"unknown policy {kind!r}: expected 'mlp' or 'cnn'")


def sample_actions(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One categorical sample per row (Gumbel-max: argmax of logits + Gumbel noise).

    `logits` may be unnormalised or log-probabilities: the argmax is the same.
    """
    return torch.argmax(logits + gumbel_noise(logits.shape, logits.device, generator), dim=1)


def gumbel_noise(shape: tuple[int, ...] | torch.Size, device: torch.device, generator: torch.Generator | None = None
                 ) -> torch.Tensor:
    """Standard Gumbel samples, -log(-log(U)). Drawn for a whole rollout at once (`[T, N, A]`), they
    equal T draws of `[N, A]` bit for bit (the generator fills a tensor in order and the transforms
    are elementwise), in 4 ops instead of 4 a step."""
    u = torch.rand(shape, device=device, generator=generator)
    return torch.log(-torch.log(u.clamp_(min=1e-20))).neg_()


def log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of `actions` and the entropy, per row."""
    logp_all = torch.log_softmax(logits, dim=1)
    logp = logp_all.gather(1, actions[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(dim=1)
    return logp, entropy


def compile_mode(device: torch.device) -> str | None:
    """`torch.compile`'s mode for `--compile` on `device`: inductor's default on CPU; on CUDA
    "max-autotune-no-cudagraphs" (Triton autotuning pays off for the many small matmuls of PPO; CUDA
    graphs wait for a GPU to test them on: issue 14)."""
    return "max-autotune-no-cudagraphs" if device.type == "cuda" else None


def compile_policy(policy: nn.Module, device: torch.device) -> nn.Module:
    """`policy` wrapped by `torch.compile` (compiled lazily, at its first call). The wrapper shares the
    policy's parameters: train it, and checkpoint and export the plain `policy`."""
    return torch.compile(policy, mode=compile_mode(device))


def load_weights(policy: nn.Module, weights: dict[str, Any], fits: str) -> None:
    """`policy.load_state_dict(weights)`, or ValueError naming what the weights do not fit (`fits`) and
    the first mismatch, e.g. a checkpoint trained before the env's observation changed."""
    try:
        policy.load_state_dict(weights)
    except RuntimeError as e:
        detail = next((line.strip() for line in str(e).splitlines() if "size mismatch" in line), str(e).splitlines()[0])
        raise ValueError(f"the checkpoint's network does not fit {fits}: {detail}") from None
