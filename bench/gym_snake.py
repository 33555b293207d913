"""The peer for the snake rows of bench_envs.py: docs/snake.md's Snake as a plain gymnasium.Env (numpy,
one board), stepped N at a time by gymnasium's SyncVectorEnv. Gymnasium has no Snake of its own and no
vectorised way to run one it does not know, so this is how a gymnasium user runs N boards: the same
rules and the same observation (relative actions), written the straightforward way. Not a test oracle:
tests/test_snake_env.py and the web page's parity fixture prove our env's rules; tests/test_bench_peers.py
holds this peer to the same observations step by step.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np

_DR = (-1, 0, 1, 0)  # up, right, down, left
_DC = (0, 1, 0, -1)


class GymSnake(gym.Env):
    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, grid: int = 10, space: bool = False) -> None:
        self.g = grid
        self.space = space
        self.max_hunger = grid * grid
        n = 3 * grid * grid + (11 if space else 8)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.occupied = np.zeros(grid * grid, dtype=bool)
        self.body: deque[int] = deque()  # flat cells, head first
        # space: a Python-int bitboard, rows of g bits and a guard bit, so a shift by 1 never wraps
        self.bit = [1 << (c // grid * (grid + 1) + c % grid) for c in range(grid * grid)]

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        g = self.g
        mid = (g // 2) * g + g // 2
        self.body = deque([mid, mid - 1, mid - 2])
        self.occupied[:] = False
        self.occupied[list(self.body)] = True
        self.direction, self.hunger = 1, 0
        self._place_apple()
        return self._obs(), {}

    def _place_apple(self) -> None:
        empty = np.flatnonzero(~self.occupied)
        self.apple = int(empty[self.np_random.integers(len(empty))]) if len(empty) else -1

    def _deadly(self, direction: int) -> bool:
        head = self.body[0]
        r, c = head // self.g + _DR[direction], head % self.g + _DC[direction]
        if not (0 <= r < self.g and 0 <= c < self.g):
            return True
        cell = r * self.g + c
        return bool(self.occupied[cell]) and cell != self.body[-1]

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.direction = (self.direction + (0, 3, 1)[int(action)]) % 4
        if self._deadly(self.direction):
            return self._obs(), -1.0, True, False, {}
        head = self.body[0]
        new = (head // self.g + _DR[self.direction]) * self.g + head % self.g + _DC[self.direction]
        if new == self.apple:
            self.body.appendleft(new)
            self.occupied[new] = True
            self.hunger = 0
            if len(self.body) == self.g * self.g:
                self.apple = -1
                return self._obs(), 1.0, True, False, {}
            self._place_apple()
            return self._obs(), 1.0, False, False, {}
        self.occupied[self.body.pop()] = False
        self.body.appendleft(new)
        self.occupied[new] = True
        self.hunger += 1
        return self._obs(), 0.0, False, self.hunger >= self.max_hunger, {}

    def _obs(self) -> np.ndarray:
        gg = self.g * self.g
        obs = np.zeros(self.observation_space.shape, dtype=np.float32)
        length = len(self.body)
        obs[self.body[0]] = 1.0
        obs[gg + np.fromiter(self.body, dtype=np.int64, count=length)] = np.arange(length, 0, -1) / length
        if self.apple >= 0:
            obs[2 * gg + self.apple] = 1.0
        obs[3 * gg + self.direction] = 1.0
        for k, turn in enumerate((0, 3, 1)):  # danger straight, left, right
            obs[3 * gg + 4 + k] = self._deadly((self.direction + turn) % 4)
        obs[3 * gg + 7] = self.hunger / self.max_hunger
        if self.space:
            empty = sum(self.bit[c] for c in np.flatnonzero(~self.occupied))
            for k, turn in enumerate((0, 3, 1)):  # space straight, left, right
                obs[3 * gg + 8 + k] = self._space((self.direction + turn) % 4, empty)
        return obs

    def _space(self, direction: int, empty: int) -> float:
        """docs/snake.md's space feature of one move on this board (`empty`: its empty cells' bits)."""
        if self._deadly(direction):
            return 0.0
        g, w, bit = self.g, self.g + 1, self.bit
        body = list(self.body)
        length = len(body)
        head = body[0]
        x = bit[(head // g + _DR[direction]) * g + head % g + _DC[direction]]
        open_ = empty | bit[body[-1]]  # the tail leaves at move 1
        for d in range(2, 2 * g + 1):
            if length - d >= 0:
                open_ |= bit[body[length - d]]  # segment L - d has counter d
            x = (x | x << 1 | x >> 1 | x << w | x >> w) & open_
        return x.bit_count() / (g * g)
