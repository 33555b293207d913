"""Snake's compiled step (`--compile`) is the eager step, bit for bit; and the compact state keeps the
rules' invariants. The compiled path runs here on the CPU (inductor, a C++ compiler), so it is never
untested even where no GPU is."""

from __future__ import annotations

import pytest
import torch

from trainer.envs import Snake, SnakeParams
from trainer.envs.snake import cell_dtype

# torch.compile with g++: tens of seconds of compiling. One worker runs the module in order, so the
# queued-apples test below finds the first configuration's kernels in inductor's cache (/tmp) instead
# of compiling its own (~15 s).
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("snake_compile")]
SHARED = SnakeParams(grid_size=10, action_mode="relative", max_hunger=30)


def _play(env: Snake, steps: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """Every output and the whole state after each of `steps` random steps (copies)."""
    gen = torch.Generator().manual_seed(seed)
    record = []
    env.reset(seed=seed)
    for _ in range(steps):
        obs, reward, term, trunc, info = env.step(torch.randint(0, env.n_actions, (env.num_envs,), generator=gen))
        state = (env.cells, env.head, env.direction, env.length, env.apple, env.hunger)
        record.append(tuple(t.clone() for t in (obs, reward, term, trunc, info["final_obs"], *state)))
    return record


# ~15-20 s quiet for the first configuration (30-55 s beside three other workers): torch.compile builds
# the step's C++ kernels with g++ on a cold cache, which is what this test proves bit for bit.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("grid", "mode", "auto_reset"),
    [(SHARED.grid_size, SHARED.action_mode, True), (5, "absolute", False)],
)
def test_compiled_step_matches_the_eager_step_bit_for_bit(grid: int, mode: str, auto_reset: bool) -> None:
    params = SnakeParams(grid_size=grid, action_mode=mode, max_hunger=SHARED.max_hunger)
    eager = _play(Snake(256, params, auto_reset=auto_reset), steps=150, seed=4)
    env = Snake(256, params, auto_reset=auto_reset)
    env.compile_step()
    compiled = _play(env, steps=150, seed=4)
    ends = sum(int((rec[2] | rec[3]).sum()) for rec in eager)
    assert ends > 100, "the comparison must cover deaths, truncations and resets"
    for t, (a, b) in enumerate(zip(eager, compiled, strict=True)):
        ended = a[2] | a[3]
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if i == 4:  # final_obs: only the rows of the envs that ended are the contract (snake.py)
                x, y = x[ended], y[ended]
            assert x.dtype == y.dtype and torch.equal(x, y), f"step {t}, output {i} differs"


@pytest.mark.slow
def test_compiled_step_still_takes_queued_apples() -> None:
    env = Snake(256, SHARED, auto_reset=True)  # the shapes and rules of the first configuration above
    env.compile_step()
    env.queue_apples([5 * 10 + 6, 0])
    env.reset(seed=0)
    env.step(torch.zeros(256, dtype=torch.int64))  # head (5,5) -> (5,6): eat; the next apple is queued
    assert env.snapshot(0)["apple"] == [0, 0]
    assert env.snapshot(0)["length"] == 4


def test_cells_take_one_byte_up_to_15x15_and_two_above() -> None:
    assert Snake(2, SnakeParams(grid_size=15)).cells.dtype == torch.uint8
    assert Snake(2, SnakeParams(grid_size=16)).cells.dtype == torch.int16
    assert cell_dtype(200 * 200) == torch.int32


@pytest.mark.parametrize("grid", [4, 16])
def test_new_apples_are_uniform_over_the_empty_cells(grid: int) -> None:
    """Every empty cell of the start board gets the apple about equally often (chi-square)."""
    env = Snake(20_000, SnakeParams(grid_size=grid))
    env.reset(seed=11)
    counts = torch.bincount(env.apple, minlength=grid * grid).double()
    body = (env._start_cells > 0).nonzero()[:, 0]
    assert counts[body].sum() == 0, "never on the body"
    free = counts[env._start_cells == 0]
    expected = env.num_envs / free.numel()
    chi2 = float(((free - expected) ** 2 / expected).sum())
    dof = free.numel() - 1
    # mean dof, sd sqrt(2 dof): 5 sd is a bound a uniform draw essentially never crosses
    assert chi2 < dof + 5 * (2 * dof) ** 0.5, f"chi2 {chi2:.1f} over {dof} degrees of freedom"


def test_a_long_snake_on_a_large_board_keeps_its_counters() -> None:
    """Counters above 255 (int16 cells) decrement and free the tail like small ones."""
    g = 20
    env = Snake(1, SnakeParams(grid_size=g), auto_reset=False)
    env.reset(seed=0)
    # 300 cells winding over rows 0..14, tail at (0, 0), head at (14, 19), heading down.
    path = [(r, c if r % 2 == 0 else g - 1 - c) for r in range(15) for c in range(g)]
    env.set_board(0, body=path[::-1], direction=2, apple=[19, 0])
    _, reward, term, _, _ = env.step(torch.tensor([0]))  # straight down into (15, 19)
    assert float(reward[0]) == 0 and not bool(term[0])
    snap = env.snapshot(0)
    assert snap["length"] == 300 and snap["body"][0] == [15, 19]
    assert snap["body"][-1] == [0, 1], "the tail moved on from (0, 0)"
    assert sorted(env.cells[0][env.cells[0] > 0].tolist()) == list(range(1, 301))
