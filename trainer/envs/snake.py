"""Snake for N envs at once, as tensors on one device. The rules are docs/snake.md, exactly.

State (all tensors, one row per env; read them directly or through `snapshot(i)`):
- `cells`     `[N, G*G]`, uint8 up to 15x15 boards, int16 above (`cell_dtype`): 0 = empty, else the
  body counter `L - i` of the segment on that cell (head = `L`, tail = 1). A plain move decrements
  every counter (the tail's 1 becomes 0: freed) and writes `L` at the new head; eating skips the
  decrement and writes `L + 1`. So a cell is deadly iff its counter is > 1 (the tail, counter 1, moves
  away this step), and observation plane 1 is `cells / L`.
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
  `info["final_obs"]` (its rows of the envs that ended this step; the other rows are not meant to be
  read) and the state is already the next episode's first. A consumer that never reads it (PPO
  without truncation bootstrap) sets `final_obs_wanted = False`: the step then skips that observation
  and `info["final_obs"]` is None.

`step` has no Python loop over envs and no host sync unless apples are queued. The observation
tensors `step` returns are buffers reused two calls later: copy them to keep them longer.

Speed (measured in bench/bench_envs.py, figures in BENCHMARKS.md): the state is compact (one byte
per cell on boards up to 15x15, a quarter of int32's memory traffic), and a new apple costs one random
number per env (the k-th empty cell, k uniform), not a random score for every cell of every board.
All of a step's tensor work is `_advance`, a function of the state, the actions and that one random
number per env: `compile_step()` hands it to `torch.compile` (no generator inside, so no graph break),
and the compiled step is bit for bit the eager one (tests/test_snake_compile.py). On a CPU the eager
step runs in numpy instead (trainer/envs/snake_np.py), the same step bit for bit on the same tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from trainer.envs.snake_np import NumpySnakeStep
from trainer.envs.space import SpaceFill, space_features

# Row and column deltas per direction (up, right, down, left).
_DR = (-1, 0, 1, 0)
_DC = (0, 1, 0, -1)

# The observation (docs/snake.md): PLANES board planes of G*G values (head, body, apple), then
# FEATURES values (direction one-hot, danger straight/left/right, hunger), then with `space` on
# SPACE_FEATURES more (space straight/left/right).
PLANES = 3
FEATURES = 8
SPACE_FEATURES = 3


def danger_at(grid_size: int) -> int:
    """Where the three danger values (straight, left, right) start in an observation."""
    return PLANES * grid_size * grid_size + 4


def obs_size(grid_size: int, space: bool = False) -> int:
    """Length of one observation on a `grid_size` board: the only place this formula is written."""
    return PLANES * grid_size * grid_size + FEATURES + (SPACE_FEATURES if space else 0)


@dataclass(frozen=True)
class SnakeParams:
    """Constants of a Snake env; see docs/snake.md."""

    grid_size: int = 10
    action_mode: str = "relative"  # "relative" (3 actions) or "absolute" (4 actions)
    max_hunger: int | None = None  # steps without an apple before truncation; None = G*G
    space: bool = False  # the three space features at the end of the observation

    def __post_init__(self) -> None:
        object.__setattr__(self, "space", bool(self.space))  # the trainer's flag gives 0 or 1
        if self.grid_size < 4:
            raise ValueError(f"grid_size must be >= 4, got {self.grid_size}")
        if self.action_mode not in ("relative", "absolute"):
            raise ValueError(f"action_mode must be 'relative' or 'absolute', got {self.action_mode!r}")

    @property
    def hunger_limit(self) -> int:
        return self.max_hunger if self.max_hunger is not None else self.grid_size**2

    @property
    def obs_dim(self) -> int:
        return obs_size(self.grid_size, self.space)

    @property
    def n_actions(self) -> int:
        return 3 if self.action_mode == "relative" else 4


def cell_dtype(cells_n: int) -> torch.dtype:
    """The smallest integer type that holds a body counter (up to the board's cell count)."""
    if cells_n <= torch.iinfo(torch.uint8).max:
        return torch.uint8
    if cells_n <= torch.iinfo(torch.int16).max:
        return torch.int16
    return torch.int32


def start_board(g: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    """The start position on a g x g board: its cells (a snake of 3 in the middle row, heading right)
    and the head's cell."""
    start = torch.zeros(g * g, dtype=dtype, device=device)
    mid = g // 2
    for i, col in enumerate((mid, mid - 1, mid - 2)):
        start[mid * g + col] = 3 - i
    return start, mid * g + mid


class Snake:
    """N Snake envs on one device."""

    name = "snake"

    def __init__(
        self,
        num_envs: int,
        params: SnakeParams | None = None,
        device: torch.device | str = "cpu",
        auto_reset: bool = True,
        late_starts: float = 0.0,
        numpy_step: bool | None = None,
    ) -> None:
        self.params = params or SnakeParams()
        # Training only (not a rule): the share of auto-reset episodes that start as a copy of another
        # env's running game whose snake fills at least half the board (`_late_restart`).
        self.late_starts = late_starts
        # True while an env's episode is one of those copies: not a whole game, so the step's
        # info["counted"] keeps it out of the trainer's episode statistics (scores stay comparable).
        self.late = torch.zeros(num_envs, dtype=torch.bool, device=device)
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.auto_reset = auto_reset
        self.final_obs_wanted = True  # module docstring: on a CPU that observation costs ~a step's rest
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
        self.cell_dtype = cell_dtype(self.cells_n)
        self._start_cells, self._start_head = start_board(g, self.cell_dtype, dev)
        self.cells = self._start_cells.repeat(num_envs, 1)
        self.head = torch.full((num_envs,), self._start_head, dtype=torch.int64, device=dev)
        self.direction = torch.ones(num_envs, dtype=torch.int64, device=dev)
        self.length = torch.full((num_envs,), 3, dtype=torch.int64, device=dev)
        self.apple = torch.full((num_envs,), -1, dtype=torch.int64, device=dev)
        self.hunger = torch.zeros(num_envs, dtype=torch.int64, device=dev)
        self._apple_queue: list[int] = []
        # The queued apple of env 0 while one waits (-1: none; every other env always -1).
        self._forced = torch.full((num_envs,), -1, dtype=torch.int64, device=dev)
        # Observation buffers reused every other step (zeroing a buffer is cheaper than allocating
        # one: at 4096 envs fresh allocations were a third of the step time on a CPU).
        self._obs_bufs = [torch.zeros(num_envs, self.obs_dim, device=dev) for _ in range(4)]
        self._obs_turn = 0
        self._advance_fn = self._advance
        # The space features on a CPU: numpy on bit-sliced boards (trainer/envs/space.py says why).
        self._space_fill = SpaceFill(num_envs, g) if self.params.space and dev.type == "cpu" and g <= 15 else None
        # The step on a CPU: numpy (trainer/envs/snake_np.py says why) unless `numpy_step` is False.
        self._numpy_step = NumpySnakeStep.choose(self, numpy_step)

    def compile_step(self, mode: str | None = None) -> None:
        """Run `step`'s tensor work through `torch.compile` (same results, bit for bit)."""
        # Shapes never change within a run: static shapes let inductor specialise every kernel.
        # The compiled step computes the space features with torch ops: numpy would break the graph.
        self._space_fill = self._numpy_step = None
        self._advance_fn = torch.compile(self._advance, mode=mode, dynamic=False)

    # ----------------------------------------------------------------------------------------- reset
    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator.manual_seed(seed)
        self.cells = self._start_cells.repeat(self.num_envs, 1)
        self.head.fill_(self._start_head)
        self.direction.fill_(1)
        self.length.fill_(3)
        self.hunger.zero_()
        self.late.zero_()
        everyone = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        self._arm_queue()
        self.apple = self._place_apples(everyone, self._draw(), self._forced)
        self._settle_queue(everyone)
        return self.observe()

    def _draw(self) -> torch.Tensor:
        """One uniform number per env in [0, 1): all the randomness one step needs."""
        return torch.rand(self.num_envs, generator=self.generator, device=self.device)

    def _place_apples(self, need: torch.Tensor, u: torch.Tensor, forced: torch.Tensor) -> torch.Tensor:
        """Apple per env: where `need`, the k-th empty cell with k = floor(u * empty cells) (uniform
        over the empty cells), or the `forced` cell where one is given (>= 0); else the current apple."""
        empty = self.cells == 0
        count = empty.sum(dim=1, dtype=torch.int32)
        k = torch.minimum((u * count).int(), count - 1)  # the min guards u * count rounding up to count
        # The k-th empty cell (from 0) is the number of cells whose running count of empty cells is
        # <= k; the running count never falls, so a binary search per row finds it.
        running = empty.cumsum(dim=1, dtype=torch.int32)
        fresh = torch.searchsorted(running, k[:, None], right=True)[:, 0]
        fresh = torch.where(forced >= 0, forced, fresh)
        return torch.where(need, fresh, self.apple)

    # ------------------------------------------------------------------------------- queued apples
    def queue_apples(self, cells: list[int]) -> None:
        """Make env 0's next apple placements take these flat cell indices, in order."""
        self._apple_queue.extend(int(c) for c in cells)

    def _arm_queue(self) -> None:
        # Debug path for parity fixtures (host syncs are fine here): env 0's next apple, if queued.
        if self._apple_queue:
            cell = self._apple_queue[0]
            if not 0 <= cell < self.cells_n:
                raise ValueError(f"queued apple cell {cell} is not an empty cell of the board")
            self._forced[0] = cell

    def _settle_queue(self, need: torch.Tensor) -> None:
        if not self._apple_queue or not bool(need[0]):
            return
        cell = self._apple_queue.pop(0)
        self._forced[0] = -1
        if int(self.cells[0, cell]) != 0:
            raise ValueError(f"queued apple cell {cell} is not an empty cell of the board")

    # ------------------------------------------------------------------------------------------ step
    def step(
        self, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]:
        actions = actions.to(self.device, torch.int64)
        self._arm_queue()
        obs_bufs = (self._next_buf(), self._next_buf())
        advance = self._advance_fn if self._numpy_step is None else self._numpy_step
        obs, reward, terminated, truncated, final_obs, need_apple = advance(
            actions, self._draw(), self._forced, *obs_bufs
        )
        self._settle_queue(need_apple)
        info: dict[str, Any] = {"final_obs": final_obs}
        if self.late_starts > 0 and self.auto_reset:
            done = terminated | truncated
            info["counted"] = ~self.late  # for the episodes that end now: began at the start position
            obs = self._late_restart(done, obs)
        return obs, reward, terminated, truncated, info

    def _late_restart(self, done: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Start a `late_starts` share of the episodes that just ended as a copy of a random running
        game with a snake of at least half the board (a curriculum: a greedy policy's games are lost
        in the endgame, which fresh starts rarely reach). Returns the observation, rewritten in place."""
        u = torch.rand(2, self.num_envs, generator=self.generator, device=self.device)
        donors = (self.length >= self.cells_n // 2) & ~done
        count = donors.sum(dtype=torch.int32)
        restart = done & (u[0] < self.late_starts) & (count > 0)
        self.late = torch.where(done, restart, self.late)
        if not bool(restart.any()):  # one host sync a step, only with late starts on
            return obs
        k = torch.minimum((u[1] * count).int(), count - 1)
        # The k-th donor (from 0): the number of envs whose running count of donors is <= k.
        donor = torch.searchsorted(donors.cumsum(0, dtype=torch.int32), k, right=True).clamp(max=self.num_envs - 1)
        self.cells = torch.where(restart[:, None], self.cells[donor], self.cells)
        for name in ("head", "direction", "length", "hunger", "apple"):
            value = getattr(self, name)
            setattr(self, name, torch.where(restart, value[donor], value))
        return self.observe(obs)

    def _move(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Turn and move every snake (rules 1-4 of docs/snake.md): (dead, ate, moved)."""
        g = self.g
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
        # A plain move frees the tail: every counter of a moving snake drops by one (never below 0).
        cells = self.cells - ((self.cells > 0) & moved[:, None]).to(self.cell_dtype)
        length = self.length + ate
        # Write the new head only for envs that live; dead envs write back what is there.
        keep = cells.gather(1, target[:, None])[:, 0]
        head_value = torch.where(alive, length.to(self.cell_dtype), keep)
        self.cells = cells.scatter_(1, target[:, None], head_value[:, None])
        self.length = length
        self.head = torch.where(alive, target, self.head)
        self.direction = new_dir
        self.hunger = torch.where(ate, 0, torch.where(moved, self.hunger + 1, self.hunger))
        return dead, ate, moved

    def _advance(
        self, actions: torch.Tensor, u: torch.Tensor, forced: torch.Tensor, buf_a: torch.Tensor, buf_b: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """One step of every env: (obs, reward, terminated, truncated, final_obs, need_apple)."""
        dead, ate, moved = self._move(actions)
        win = ate & (self.length == self.cells_n)
        terminated = dead | win
        truncated = moved & (self.hunger >= self.params.hunger_limit)
        reward = ate.to(torch.float32) - dead.to(torch.float32)
        self.apple = torch.where(win, -1, self.apple)
        need_apple = ate & ~win
        if self.auto_reset:
            done = terminated | truncated
            # final_obs is read only where an env ended: on the CPU path a step where none did skips
            # its space features (half their cost); on a GPU the check would be a host sync.
            final_obs = (self.observe(buf_a, fill_space=self._space_fill is None or bool(done.any()))
                         if self.final_obs_wanted else None)
            self.cells = torch.where(done[:, None], self._start_cells, self.cells)
            self.head = torch.where(done, self._start_head, self.head)
            self.direction = torch.where(done, 1, self.direction)
            self.length = torch.where(done, 3, self.length)
            self.hunger = torch.where(done, 0, self.hunger)
            need_apple = need_apple | done
            self.apple = self._place_apples(need_apple, u, forced)
            obs = self.observe(buf_b)
        else:
            self.apple = self._place_apples(need_apple, u, forced)
            obs = final_obs = self.observe(buf_b)
        return obs, reward, terminated, truncated, final_obs, need_apple

    # ------------------------------------------------------------------------------------ observation
    def _next_buf(self) -> torch.Tensor:
        self._obs_turn = (self._obs_turn + 1) % len(self._obs_bufs)
        return self._obs_bufs[self._obs_turn]

    def observe(self, out: torch.Tensor | None = None, fill_space: bool = True) -> torch.Tensor:
        """`float32[N, 3*G*G + 8]`, or `+ 11` with the space features, per docs/snake.md (into `out` when
        given; with `fill_space` False those three are left 0)."""
        g, n2 = self.g, self.cells_n
        n = self.num_envs
        obs = torch.empty(n, self.obs_dim, device=self.device) if out is None else out
        # Plane 1 and the last four features are written whole: zero only what the scatters mark.
        obs[:, :n2].zero_()
        obs[:, 2 * n2 : 3 * n2 + 4].zero_()
        obs.scatter_(1, self.head[:, None], 1.0)
        torch.div(self.cells, self.length[:, None].to(torch.float32), out=obs[:, n2 : 2 * n2])
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
        if self.params.space:
            space = space_features(self.cells, target, danger, g, self._space_fill) if fill_space else 0.0
            obs[:, 3 * n2 + 8 : 3 * n2 + 11] = space
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
        row = torch.zeros(self.cells_n, dtype=self.cell_dtype)
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
