"""Snake for N envs at once, as tensors on one device. The rules are docs/snake.md, exactly.

State (all tensors, one row per env; read them directly or through `snapshot(i)`):
- `cells`     int32 `[N, G*G]`: 0 = empty, else the body counter `L - i` of the segment on that cell
  (head = `L`, tail = 1). A plain move decrements every counter (the tail's 1 becomes 0: freed) and
  writes `L` at the new head; eating skips the decrement and writes `L + 1`. So a cell is deadly iff its
  counter is > 1 (the tail, counter 1, moves away this step), and observation plane 1 is `cells / L`.
- `head`      int64 `[N]`: flat index `row * G + col` of the head.
- `direction` int64 `[N]`: 0 up, 1 right, 2 down, 3 left.
- `length`    int64 `[N]`.
- `apple`     int64 `[N]`: flat index of the apple, -1 when there is none (after a win).
- `hunger`    int64 `[N]`: steps since the last apple.

For a parity fixture (one env, plain Python lists, no tensors needed by the caller):
- `snapshot(i)` -> `{"head": [r, c], "body": [[r, c], ...] (head first, tail last), "apple": [r, c] or
  None, "direction": d, "hunger": h, "length": L}`.
- `queue_apples([cell, ...])` (flat indices): the next apple placements of env 0 take these cells in
  order instead of random ones (each must be empty when used, else ValueError). Meant for one env.
- `set_board(i, body=[[r, c], ...], direction=d, apple=[r, c] | None, hunger=h)`: hand-built boards.
- `Snake(..., auto_reset=False)`: an env that ends keeps its final state (call `reset` yourself), so a
  recorder sees the terminal board; with the default auto-reset the final observation is in
  `info["final_obs"]` and the state is already the next episode's first.

`step` has no Python loop over envs and no host sync unless apples are queued. The observation
tensors `step` returns are buffers reused two calls later: copy them to keep them longer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Row and column deltas per direction (up, right, down, left).
_DR = (-1, 0, 1, 0)
_DC = (0, 1, 0, -1)

# The observation (docs/snake.md): PLANES board planes of G*G values (head, body, apple), then
# FEATURES values (direction one-hot, danger straight/left/right, hunger).
PLANES = 3
FEATURES = 8


def obs_size(grid_size: int) -> int:
    """Length of one observation on a `grid_size` board: the only place this formula is written."""
    return PLANES * grid_size * grid_size + FEATURES


@dataclass(frozen=True)
class SnakeParams:
    """Constants of a Snake env; see docs/snake.md."""

    grid_size: int = 10
    action_mode: str = "relative"  # "relative" (3 actions) or "absolute" (4 actions)
    max_hunger: int | None = None  # steps without an apple before truncation; None = G*G

    def __post_init__(self) -> None:
        if self.grid_size < 4:
            raise ValueError(f"grid_size must be >= 4, got {self.grid_size}")
        if self.action_mode not in ("relative", "absolute"):
            raise ValueError(f"action_mode must be 'relative' or 'absolute', got {self.action_mode!r}")

    @property
    def hunger_limit(self) -> int:
        return self.max_hunger if self.max_hunger is not None else self.grid_size**2

    @property
    def obs_dim(self) -> int:
        return obs_size(self.grid_size)

    @property
    def n_actions(self) -> int:
        return 3 if self.action_mode == "relative" else 4


class Snake:
    """N Snake envs on one device."""

    name = "snake"

    def __init__(
        self,
        num_envs: int,
        params: SnakeParams | None = None,
        device: torch.device | str = "cpu",
        auto_reset: bool = True,
    ) -> None:
        self.params = params or SnakeParams()
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.auto_reset = auto_reset
        self.obs_dim = self.params.obs_dim
        self.n_actions = self.params.n_actions
        self.max_return = float(self.params.grid_size**2 - 3)  # every apple until the board is full
        g = self.params.grid_size
        self.g = g
        self.cells_n = g * g
        dev = self.device
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(0)
        self._dr = torch.tensor(_DR, device=dev)
        self._dc = torch.tensor(_DC, device=dev)
        # Relative action -> turn added to the direction: straight 0, left +3, right +1.
        self._turn = torch.tensor((0, 3, 1), device=dev)
        self._rel3 = torch.tensor((0, 3, 1), device=dev)  # danger order: straight, left, right
        self._arange = torch.arange(num_envs, device=dev)
        start = torch.zeros(self.cells_n, dtype=torch.int32, device=dev)
        mid = g // 2
        for i, col in enumerate((mid, mid - 1, mid - 2)):
            start[mid * g + col] = 3 - i
        self._start_cells = start
        self._start_head = mid * g + mid
        self.cells = start.repeat(num_envs, 1)
        self.head = torch.full((num_envs,), self._start_head, dtype=torch.int64, device=dev)
        self.direction = torch.ones(num_envs, dtype=torch.int64, device=dev)
        self.length = torch.full((num_envs,), 3, dtype=torch.int64, device=dev)
        self.apple = torch.full((num_envs,), -1, dtype=torch.int64, device=dev)
        self.hunger = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self._apple_queue: list[int] = []
        # Observation buffers reused every other step (zeroing a buffer is cheaper than allocating
        # one: at 4096 envs fresh allocations were a third of the step time on a CPU).
        self._obs_bufs = [torch.zeros(num_envs, self.obs_dim, device=dev) for _ in range(4)]
        self._obs_turn = 0

    # ----------------------------------------------------------------------------------------- reset
    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self.cells = self._start_cells.repeat(self.num_envs, 1)
        self.head.fill_(self._start_head)
        self.direction.fill_(1)
        self.length.fill_(3)
        self.hunger.zero_()
        self.apple = self._place_apples(torch.ones(self.num_envs, dtype=torch.bool, device=self.device))
        return self.observe()

    def _place_apples(self, need: torch.Tensor) -> torch.Tensor:
        """Apple per env: a uniform empty cell where `need`, else the current apple."""
        # A random score per cell with the body masked out; argmax is uniform over empty cells.
        scores = torch.rand(self.cells.shape, generator=self.generator, device=self.device)
        scores.masked_fill_(self.cells > 0, -1.0)
        fresh = scores.argmax(dim=1)
        if self._apple_queue:
            fresh = self._take_queued(fresh, need)
        return torch.where(need, fresh, self.apple)

    def _take_queued(self, fresh: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
        # Debug path for parity fixtures: host syncs are fine here.
        if bool(need[0]):
            cell = self._apple_queue.pop(0)
            if not 0 <= cell < self.cells_n or int(self.cells[0, cell]) != 0:
                raise ValueError(f"queued apple cell {cell} is not an empty cell of the board")
            fresh = fresh.clone()
            fresh[0] = cell
        return fresh

    def queue_apples(self, cells: list[int]) -> None:
        """Make env 0's next apple placements take these flat cell indices, in order."""
        self._apple_queue.extend(int(c) for c in cells)

    # ------------------------------------------------------------------------------------------ step
    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        g = self.g
        actions = actions.to(self.device, torch.int64)
        if self.params.action_mode == "relative":
            new_dir = (self.direction + self._turn[actions]) % 4
        else:
            reverse = actions == (self.direction + 2) % 4
            new_dir = torch.where(reverse, self.direction, actions)
        row = torch.div(self.head, g, rounding_mode="floor")
        col = self.head - row * g
        nrow = row + self._dr[new_dir]
        ncol = col + self._dc[new_dir]
        out = (nrow < 0) | (nrow >= g) | (ncol < 0) | (ncol >= g)
        target = nrow.clamp(0, g - 1) * g + ncol.clamp(0, g - 1)
        at_target = self.cells.gather(1, target[:, None])[:, 0]
        dead = out | (at_target > 1)
        alive = ~dead
        ate = alive & (target == self.apple)
        moved = alive & ~ate

        cells = (self.cells - moved[:, None].to(torch.int32)).clamp_(min=0)
        length = self.length + ate
        # Write the new head only for envs that live; dead envs write back what is there.
        keep = cells.gather(1, target[:, None])[:, 0]
        cells.scatter_(1, target[:, None], torch.where(alive, length.to(torch.int32), keep)[:, None])
        self.cells = cells
        self.length = length
        self.head = torch.where(alive, target, self.head)
        self.direction = new_dir
        self.hunger = torch.where(ate, 0, torch.where(moved, self.hunger + 1, self.hunger))

        win = ate & (length == self.cells_n)
        terminated = dead | win
        truncated = moved & (self.hunger >= self.params.hunger_limit)
        reward = ate.to(torch.float32) - dead.to(torch.float32)
        self.apple = torch.where(win, -1, self.apple)
        final_obs = self.observe(self._next_buf())
        need_apple = ate & ~win
        if self.auto_reset:
            done = terminated | truncated
            self.cells = torch.where(done[:, None], self._start_cells, self.cells)
            self.head = torch.where(done, self._start_head, self.head)
            self.direction = torch.where(done, 1, self.direction)
            self.length = torch.where(done, 3, self.length)
            self.hunger = torch.where(done, 0, self.hunger)
            need_apple = need_apple | done
            self.apple = self._place_apples(need_apple)
            obs = self.observe(self._next_buf())
        else:
            self.apple = self._place_apples(need_apple)
            obs = self.observe(self._next_buf())
            final_obs = obs
        return obs, reward, terminated, truncated, {"final_obs": final_obs}

    # ------------------------------------------------------------------------------------ observation
    def _next_buf(self) -> torch.Tensor:
        self._obs_turn = (self._obs_turn + 1) % len(self._obs_bufs)
        return self._obs_bufs[self._obs_turn]

    def observe(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """`float32[N, 3*G*G + 8]` per docs/snake.md (into `out` when given)."""
        g, n2 = self.g, self.cells_n
        n = self.num_envs
        obs = torch.zeros(n, self.obs_dim, device=self.device) if out is None else out.zero_()
        obs.scatter_(1, self.head[:, None], 1.0)
        obs[:, n2 : 2 * n2] = self.cells.to(torch.float32) / self.length[:, None].to(torch.float32)
        has_apple = (self.apple >= 0).to(torch.float32)
        obs.scatter_(1, (2 * n2 + self.apple.clamp(min=0))[:, None], has_apple[:, None])
        obs.scatter_(1, (3 * n2 + self.direction)[:, None], 1.0)
        dirs = (self.direction[:, None] + self._rel3) % 4
        row = torch.div(self.head, g, rounding_mode="floor")[:, None]
        col = self.head[:, None] - row * g
        nrow = row + self._dr[dirs]
        ncol = col + self._dc[dirs]
        out = (nrow < 0) | (nrow >= g) | (ncol < 0) | (ncol >= g)
        target = nrow.clamp(0, g - 1) * g + ncol.clamp(0, g - 1)
        danger = out | (self.cells.gather(1, target) > 1)
        obs[:, 3 * n2 + 4 : 3 * n2 + 7] = danger.to(torch.float32)
        obs[:, 3 * n2 + 7] = self.hunger.to(torch.float32) / self.params.hunger_limit
        return obs

    # --------------------------------------------------------------------------- inspection helpers
    def snapshot(self, i: int = 0) -> dict[str, Any]:
        """Env `i`'s state as plain Python values (host sync: for fixtures and tests, not training)."""
        g = self.g
        cells = self.cells[i].cpu().tolist()
        body = sorted((c for c in range(self.cells_n) if cells[c] > 0), key=lambda c: -cells[c])
        apple = int(self.apple[i])
        head = int(self.head[i])
        return {
            "head": [head // g, head % g],
            "body": [[c // g, c % g] for c in body],
            "apple": None if apple < 0 else [apple // g, apple % g],
            "direction": int(self.direction[i]),
            "hunger": int(self.hunger[i]),
            "length": int(self.length[i]),
        }

    def set_board(
        self,
        i: int,
        body: list[list[int]] | list[tuple[int, int]],
        direction: int,
        apple: list[int] | tuple[int, int] | None,
        hunger: int = 0,
    ) -> None:
        """Put env `i` into a hand-built state; `body` lists `(row, col)` from head to tail."""
        g = self.g
        length = len(body)
        row = torch.zeros(self.cells_n, dtype=torch.int32)
        for k, (r, c) in enumerate(body):
            if not (0 <= r < g and 0 <= c < g) or row[r * g + c] != 0:
                raise ValueError(f"body cell {(r, c)} is off the board or repeated")
            row[r * g + c] = length - k
        self.cells[i] = row.to(self.device)
        self.head[i] = body[0][0] * g + body[0][1]
        self.length[i] = length
        self.direction[i] = direction
        self.hunger[i] = hunger
        if apple is None:
            self.apple[i] = -1
        else:
            if row[apple[0] * g + apple[1]] != 0:
                raise ValueError(f"apple {tuple(apple)} is on the body")
            self.apple[i] = apple[0] * g + apple[1]
