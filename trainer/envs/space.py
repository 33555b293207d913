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
    """`space_torch` for `num_envs` boards on the CPU, in numpy on bit-sliced boards (module docstring).

    Layout: `x[cell, move * words + word]`, cell-major over the padded board, so each of a flood
    step's five ops runs on one contiguous block (its four neighbour shifts are fixed views of `x`,
    made once) and the three moves share every call; numpy's per-call cost, not the work, is what a
    step costs at 128 envs (with the earlier `[move, cell, word]` layout a call took ~1.4x as long)."""

    def __init__(self, num_envs: int, grid_size: int) -> None:
        g = grid_size
        if g * g > 255:  # body counters above 255 do not fit the uint8 lanes
            raise ValueError(f"SpaceFill holds boards up to 15x15, not {g}x{g}: use space_torch")
        self.n, self.g, self.depth = num_envs, g, depth(g)
        w = self.words = -(-num_envs // 64)
        lanes = w * 64
        p = g + 2
        cell = np.arange(g * g)
        self.slot = (cell // g + 1) * p + cell % g + 1  # padded index of each cell
        # Body counters per padded cell and env lane; the border and the lanes past num_envs stay 255,
        # which no move number reaches, so they never open. Only rows 1..g are read (`band`).
        self.counters = np.full((p * p, lanes), 255, dtype=np.uint8)
        lo, hi = p, p * p - p
        self.band = self.counters[lo:hi]
        # The moves whose open cells a flood step reads: 2..depth (move 1 is the target itself).
        self.moves = np.arange(2, self.depth + 1, dtype=np.uint8)[:, None, None]
        self.x = x = np.zeros((p * p, 3 * w), dtype=np.uint64)
        self.neighbours = (x[lo - 1 : hi - 1], x[lo + 1 : hi + 1], x[lo - p : hi - p], x[lo + p : hi + p])
        self.inner = x[lo:hi]
        self.grow = np.empty_like(self.inner)
        # open3[k]: the cells open at move k + 2, repeated for the three moves (one word group each).
        self.open3 = np.empty((self.depth - 1, hi - lo, 3 * w), dtype=np.uint64)
        # A word group as one numpy item, so that repeating it three times is one strided copy each.
        self.group = np.dtype((np.void, 8 * w))
        self.start = np.zeros((p * p, 3, lanes), dtype=np.uint8)
        self.move_of = np.arange(3)[None, :]
        self.env = np.arange(num_envs)[:, None]

    def __call__(self, cells: np.ndarray, target: np.ndarray, deadly: np.ndarray) -> np.ndarray:
        """`float32[N, 3]`, as `space_torch` for the same (numpy) arrays."""
        n, w = self.n, self.words
        self.counters[self.slot, :n] = cells.T
        # packbits is little-endian per byte, so the 8 bytes of a lane group read as one uint64 with
        # env e at bit e % 64.
        open_at = np.packbits(self.band[None] <= self.moves, axis=-1, bitorder="little").view(np.uint64)
        src = open_at.reshape(-1, w).view(self.group)[:, 0]
        dst = self.open3.reshape(-1, 3 * w).view(self.group)
        for m in range(3):
            dst[:, m] = src
        # Move m's target cell, one bit per env that does not die there.
        self.start.fill(0)
        self.start[self.slot[target], self.move_of, self.env] = ~deadly
        self.x[:] = np.packbits(self.start, axis=-1, bitorder="little").view(np.uint64).reshape(len(self.x), 3 * w)
        left, right, up, down = self.neighbours
        grow, inner = self.grow, self.inner
        for open_now in self.open3:
            np.bitwise_or(left, right, out=grow)
            np.bitwise_or(grow, up, out=grow)
            np.bitwise_or(grow, down, out=grow)
            np.bitwise_or(grow, inner, out=grow)
            np.bitwise_and(grow, open_now, out=inner)
        bits = np.unpackbits(inner.view(np.uint8), axis=-1, bitorder="little")  # [cells, 3 * lanes]
        counts = bits.sum(axis=0, dtype=np.int32).reshape(3, w * 64)[:, :n].T
        return counts.astype(np.float32) / (self.g * self.g)
