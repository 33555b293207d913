"""Snake's space features: for each relative move, how much of the board the snake keeps in reach.

The rule (docs/snake.md): after a move to cell `t` (not deadly), a cell is reached at move `d` (t at
move 1) if it neighbours a cell reached before and its body counter is <= d: an empty cell (0) at any
time, a body cell once the tail end has left it (the counter-1 tail at move 1, counter c at move c).
The feature is the number of cells reached by move `depth(G) = 2G`, over G*G; a deadly move gives 0.
So a move into a pocket the body keeps closed reads small, a move that keeps the tail in reach reads
large. The head's own path and growth are ignored: the count is a feature, not a plan.

Two implementations of the one rule: `space_torch` (any device, the compiled step, and the reference)
and `SpaceFill` (numpy, the CPU path). What `SpaceFill` buys: on a CPU with 128 envs each of the 2G
flood steps is a handful of tiny ops, where torch's eager dispatch costs more than the work; with
`space_torch` a whole env step took 2.2x as long as with this (BENCHMARKS.md). Here the boards are
bit-sliced across envs (bit e % 64 of a cell's word e // 64 is env e), so one flood step is five
numpy ops on a few hundred words, whatever the number of envs up to 64 per word. tests/test_snake_env.py
holds the two, and a plain loop over the rule, equal.
"""

from __future__ import annotations

import numpy as np
import torch


def depth(grid_size: int) -> int:
    """Moves of look-ahead of the space features: the only place this is set."""
    return 2 * grid_size


def space_torch(cells: torch.Tensor, target: torch.Tensor, deadly: torch.Tensor, grid_size: int) -> torch.Tensor:
    """`float32[N, 3]`: the space features of `cells` `[N, G*G]` (body counters) for the moves into
    `target` `[N, 3]` (flat cells; ignored where `deadly` `[N, 3]`)."""
    g, n = grid_size, cells.shape[0]
    p = g + 2  # a border of never-open cells, so a neighbour is at -1, +1, -p, +p of the padded index
    dev = cells.device
    padded = torch.full((n, p, p), torch.iinfo(cells.dtype).max, dtype=cells.dtype, device=dev)
    padded[:, 1:-1, 1:-1] = cells.view(n, g, g)
    padded = padded.view(n, 1, p * p)
    slot = (target // g + 1) * p + target % g + 1
    reach = torch.zeros(n, 3, p * p, dtype=torch.bool, device=dev)
    reach.scatter_(2, slot[:, :, None], (~deadly)[:, :, None])
    lo, hi = p, p * p - p
    inner = reach[:, :, lo:hi]
    for d in range(2, depth(g) + 1):
        grow = reach[:, :, lo - 1 : hi - 1] | reach[:, :, lo + 1 : hi + 1]
        grow |= reach[:, :, lo - p : hi - p]
        grow |= reach[:, :, lo + p : hi + p]
        grow &= padded[:, :, lo:hi] <= d
        inner |= grow
    return reach.sum(dim=2, dtype=torch.float32) / (g * g)


def space_features(
    cells: torch.Tensor, target: torch.Tensor, deadly: torch.Tensor, grid_size: int, fill: SpaceFill | None
) -> torch.Tensor:
    """The features by `fill` (the numpy path, for CPU tensors) when given, else by `space_torch`."""
    if fill is None:
        return space_torch(cells, target, deadly, grid_size)
    return torch.from_numpy(fill(cells.numpy(), target.numpy(), deadly.numpy()))


class SpaceFill:
    """`space_torch` for `num_envs` boards on the CPU, in numpy on bit-sliced boards (module docstring)."""

    def __init__(self, num_envs: int, grid_size: int) -> None:
        g = grid_size
        if g * g > 255:  # body counters above 255 do not fit the uint8 lanes
            raise ValueError(f"SpaceFill holds boards up to 15x15, not {g}x{g}: use space_torch")
        self.n, self.g, self.depth = num_envs, g, depth(g)
        self.words = -(-num_envs // 64)
        lanes = self.words * 64
        p = self.p = g + 2
        cell = np.arange(g * g)
        self.slot = (cell // g + 1) * p + cell % g + 1  # padded index of each cell
        # Body counters per padded cell and env lane; the border and the lanes past num_envs stay 255,
        # which no move number reaches, so they never open. Only rows 1..g are read (`band`).
        self.counters = np.full((p * p, lanes), 255, dtype=np.uint8)
        self.lo, self.hi = p, p * p - p
        self.moves = np.arange(1, self.depth + 1, dtype=np.uint8)[:, None, None]
        self.x = np.zeros((3, p * p, self.words), dtype=np.uint64)
        env = np.arange(num_envs)
        self.env_bit = np.left_shift(np.uint64(1), (env % 64).astype(np.uint64))
        self.env_word = env // 64
        self.move_of = np.arange(3)[:, None]

    def __call__(self, cells: np.ndarray, target: np.ndarray, deadly: np.ndarray) -> np.ndarray:
        """`float32[N, 3]`, as `space_torch` for the same (numpy) arrays."""
        n, p, lo, hi = self.n, self.p, self.lo, self.hi
        self.counters[self.slot, :n] = cells.T
        band = self.counters[lo:hi]
        # open_at[k]: the cells open at move k + 1, one bit per env (packbits is little-endian per byte,
        # so the 8 bytes of a lane group read as one uint64 with env e at bit e % 64).
        open_at = np.packbits(band[None] <= self.moves, axis=-1, bitorder="little").view(np.uint64)
        x = self.x
        x.fill(0)
        start = np.where(deadly.T, np.uint64(0), self.env_bit[None, :])
        # Envs own distinct bits, so adding them into a shared word is OR-ing them.
        np.add.at(x, (self.move_of, self.slot[target.T], self.env_word[None, :]), start)
        inner = x[:, lo:hi]
        for k in range(1, self.depth):
            grow = x[:, lo - 1 : hi - 1] | x[:, lo + 1 : hi + 1]
            grow |= x[:, lo - p : hi - p]
            grow |= x[:, lo + p : hi + p]
            grow |= inner
            np.bitwise_and(grow, open_at[k], out=inner)
        bits = np.unpackbits(inner.view(np.uint8), axis=-1, bitorder="little")  # [3, cells, lanes]
        counts = bits.sum(axis=1, dtype=np.int32)[:, :n].T
        return counts.astype(np.float32) / (self.g * self.g)
