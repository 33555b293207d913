"""Snake's step on a CPU in numpy: `Snake._advance` for the same state, bit for bit.

What it buys: at the trainer's 128 envs a torch step is ~130 eager ops on tiny tensors, and each op's
dispatch (1-3 us) costs more than its work; the same step in numpy ufuncs and fancy indexing on
numpy views of the env's own tensors (`Tensor.numpy()` shares memory) takes a fraction of that
(bench/bench_envs.py, BENCHMARKS.md). Moves come from a neighbour table (one lookup per env instead
of row/column arithmetic and bound checks), and new apples are placed only for the envs that need
one. The randomness is the env's own (one uniform per env from its torch generator, drawn by
`Snake.step`), so the two paths play the same games; tests/test_snake_env.py holds them equal step by
step. Everything that is not a step (reset, late starts, queued apples, hand-built boards) stays in
`Snake`, on the same tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from trainer.envs.space import space_features

if TYPE_CHECKING:
    from trainer.envs.snake import Snake


class NumpySnakeStep:
    """`Snake._advance` in numpy for one CPU `Snake` (same arguments, same results)."""

    @classmethod
    def choose(cls, env: Snake, wanted: bool | None) -> NumpySnakeStep | None:
        """The numpy step for `env` when it is wanted (None: wherever it can run, i.e. on a CPU)."""
        if wanted and env.device.type != "cpu":
            raise ValueError(f"the numpy step runs on a CPU, not {env.device}")
        return cls(env) if env.device.type == "cpu" and wanted is not False else None

    def __init__(self, env: Snake) -> None:
        self.env = env
        g, n2 = env.g, env.cells_n
        self.g, self.n2 = g, n2
        cell = np.arange(n2)
        row, col = cell // g, cell % g
        nrow = row[None, :] + env._dr.numpy()[:, None]
        ncol = col[None, :] + env._dc.numpy()[:, None]
        off = (nrow < 0) | (nrow >= g) | (ncol < 0) | (ncol >= g)
        # next_cell[d, c]: the cell one move from c in direction d, or n2 off the board.
        self.next_cell = np.where(off, n2, nrow * g + ncol)
        self.turn = np.array((0, 3, 1))  # relative action -> turn added to the direction
        self.rel3 = np.array((0, 3, 1))  # danger order: straight, left, right
        self.rows = np.arange(env.num_envs)
        self.limit = env.params.hunger_limit
        self.start_cells = env._start_cells.numpy()

    def __call__(
        self, actions: torch.Tensor, u: torch.Tensor, forced: torch.Tensor, buf_a: torch.Tensor, buf_b: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """One step of every env: (obs, reward, terminated, truncated, final_obs, need_apple)."""
        env = self.env
        dead, ate, moved = self._move(actions.numpy())
        length, hunger, apple = env.length.numpy(), env.hunger.numpy(), env.apple.numpy()
        win = ate & (length == self.n2)
        terminated = dead | win
        truncated = moved & (hunger >= self.limit)
        reward = ate.astype(np.float32) - dead
        apple[win] = -1
        need_apple = ate & ~win
        if env.auto_reset:
            done = terminated | truncated
            any_done = bool(done.any())
            # As the torch step: final_obs only when wanted, its space features only on a step where an
            # env ended.
            final_obs = None
            if env.final_obs_wanted:
                final_obs = self.observe(buf_a, fill_space=env._space_fill is None or any_done)
            if any_done:
                self._restart(done)
                need_apple |= done
            self._place_apples(need_apple, u.numpy(), forced.numpy())
            obs = self.observe(buf_b)
        else:
            self._place_apples(need_apple, u.numpy(), forced.numpy())
            obs = final_obs = self.observe(buf_b)
        out = (reward, terminated, truncated)
        return obs, *(torch.from_numpy(x) for x in out), final_obs, torch.from_numpy(need_apple)

    def _move(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rules 1-4 of docs/snake.md, in place on the env's state: (dead, ate, moved)."""
        env = self.env
        cells, head, direction = env.cells.numpy(), env.head.numpy(), env.direction.numpy()
        length, hunger, apple = env.length.numpy(), env.hunger.numpy(), env.apple.numpy()
        if env.params.action_mode == "relative":
            new_dir = (direction + self.turn[actions]) & 3
        else:
            new_dir = np.where(actions == (direction + 2) & 3, direction, actions)
        nxt = self.next_cell[new_dir, head]
        out = nxt == self.n2
        target = np.minimum(nxt, self.n2 - 1)
        dead = out | (cells[self.rows, target] > 1)
        alive = ~dead
        ate = alive & (target == apple)
        moved = alive & ~ate
        # A plain move frees the tail: every counter of a moving snake drops by one (never below 0).
        step_down = cells > 0
        step_down &= moved[:, None]
        np.subtract(cells, step_down, out=cells, casting="unsafe")
        length += ate
        cells[self.rows[alive], target[alive]] = length[alive]
        np.copyto(head, target, where=alive)
        direction[:] = new_dir
        hunger += moved
        hunger[ate] = 0
        return dead, ate, moved

    def _restart(self, done: np.ndarray) -> None:
        env = self.env
        env.cells.numpy()[done] = self.start_cells
        env.head.numpy()[done] = env._start_head
        env.direction.numpy()[done] = 1
        env.length.numpy()[done] = 3
        env.hunger.numpy()[done] = 0

    def _place_apples(self, need: np.ndarray, u: np.ndarray, forced: np.ndarray) -> None:
        """`Snake._place_apples`, computed only for the envs in `need`."""
        rows = np.flatnonzero(need)
        if rows.size == 0:
            return
        empty = self.env.cells.numpy()[rows] == 0
        count = empty.sum(axis=1, dtype=np.int32)
        # float32 products, as torch's `u * count`, so both paths round alike
        k = np.minimum((u[rows] * count.astype(np.float32)).astype(np.int32), count - 1)
        running = empty.cumsum(axis=1, dtype=np.int32)
        fresh = (running <= k[:, None]).sum(axis=1)  # the k-th empty cell, from 0
        self.env.apple.numpy()[rows] = np.where(forced[rows] >= 0, forced[rows], fresh)

    def observe(self, out: torch.Tensor, fill_space: bool = True) -> torch.Tensor:
        """`Snake.observe` into `out`, from the env's current state."""
        env, g, n2, rows = self.env, self.g, self.n2, self.rows
        cells, head, direction = env.cells.numpy(), env.head.numpy(), env.direction.numpy()
        length, hunger, apple = env.length.numpy(), env.hunger.numpy(), env.apple.numpy()
        obs = out.numpy()
        obs[:, :n2] = 0
        obs[:, 2 * n2 : 3 * n2 + 4] = 0
        obs[rows, head] = 1.0
        np.divide(cells, length.astype(np.float32)[:, None], out=obs[:, n2 : 2 * n2])
        obs[rows, 2 * n2 + np.maximum(apple, 0)] = apple >= 0
        obs[rows, 3 * n2 + direction] = 1.0
        dirs = (direction[:, None] + self.rel3) & 3
        nxt = self.next_cell[dirs, head[:, None]]
        target = np.minimum(nxt, n2 - 1)
        danger = (nxt == n2) | (cells[rows[:, None], target] > 1)
        obs[:, 3 * n2 + 4 : 3 * n2 + 7] = danger
        np.divide(hunger.astype(np.float32), np.float32(self.limit), out=obs[:, 3 * n2 + 7])
        if env.params.space:
            if not fill_space:
                obs[:, 3 * n2 + 8 : 3 * n2 + 11] = 0.0
            elif env._space_fill is not None:
                obs[:, 3 * n2 + 8 : 3 * n2 + 11] = env._space_fill(cells, target, danger)
            else:  # boards over 15x15: the torch fill on the same memory
                feats = space_features(env.cells, torch.from_numpy(target), torch.from_numpy(danger), g, None)
                obs[:, 3 * n2 + 8 : 3 * n2 + 11] = feats.numpy()
        return out
