"""Snake rules (docs/snake.md) on hand-built boards."""

from __future__ import annotations

import pytest
import torch

from trainer.envs import Snake, SnakeParams
from trainer.envs.space import SpaceFill, depth, space_torch

UP, RIGHT, DOWN, LEFT = 0, 1, 2, 3
STRAIGHT, TURN_LEFT, TURN_RIGHT = 0, 1, 2


def make(g: int = 6, n: int = 1, auto_reset: bool = False, **kw: object) -> Snake:
    env = Snake(n, SnakeParams(grid_size=g, **kw), auto_reset=auto_reset)  # type: ignore[arg-type]
    env.reset(seed=0)
    return env


def act(env: Snake, *actions: int) -> tuple[torch.Tensor, float, bool, bool, dict]:
    obs, r, term, trunc, info = env.step(torch.tensor(actions))
    return obs, float(r[0]), bool(term[0]), bool(trunc[0]), info


def decode(obs: torch.Tensor, g: int) -> dict:
    """Split one observation row into its documented parts."""
    n2 = g * g
    return {
        "head": obs[:n2].reshape(g, g),
        "body": obs[n2 : 2 * n2].reshape(g, g),
        "apple": obs[2 * n2 : 3 * n2].reshape(g, g),
        "direction": obs[3 * n2 : 3 * n2 + 4].tolist(),
        "danger": obs[3 * n2 + 4 : 3 * n2 + 7].tolist(),
        "hunger": float(obs[3 * n2 + 7]),
        "space": obs[3 * n2 + 8 : 3 * n2 + 11].tolist(),
    }


def test_start_position_and_observation_layout() -> None:
    env = make(g=10)
    snap = env.snapshot(0)
    assert snap["head"] == [5, 5]
    assert snap["body"] == [[5, 5], [5, 4], [5, 3]]
    assert snap["direction"] == RIGHT
    assert snap["length"] == 3
    assert snap["hunger"] == 0
    assert snap["apple"] not in snap["body"]
    obs = env.observe()[0]
    assert obs.shape == (3 * 100 + 8,)
    parts = decode(obs, 10)
    assert parts["head"][5, 5] == 1.0
    assert parts["head"].sum() == 1.0
    assert parts["body"][5, 5] == pytest.approx(1.0)
    assert parts["body"][5, 4] == pytest.approx(2 / 3)
    assert parts["body"][5, 3] == pytest.approx(1 / 3)
    assert parts["body"].sum() == pytest.approx(2.0)
    r, c = snap["apple"]
    assert parts["apple"][r, c] == 1.0
    assert parts["apple"].sum() == 1.0
    assert parts["direction"] == [0.0, 1.0, 0.0, 0.0]
    assert parts["danger"] == [0.0, 0.0, 0.0]
    assert parts["hunger"] == 0.0
    assert parts["space"] == [], "the space features only with space on"
    spaced = decode(make(g=10, space=True).observe()[0], 10)
    assert spaced["space"] == [1.0, 1.0, 1.0], "on an open board every move keeps all of it in reach"
    assert {k: v for k, v in spaced.items() if k != "space"}.keys() == parts.keys() - {"space"}


def test_eating_grows_the_snake_and_places_a_new_apple_off_the_body() -> None:
    env = make()
    env.set_board(0, body=[[2, 2], [2, 1], [2, 0]], direction=RIGHT, apple=[2, 3], hunger=5)
    _, reward, term, trunc, _ = act(env, STRAIGHT)
    snap = env.snapshot(0)
    assert (reward, term, trunc) == (1.0, False, False)
    assert snap["body"] == [[2, 3], [2, 2], [2, 1], [2, 0]]  # the tail stayed
    assert snap["hunger"] == 0
    assert snap["apple"] is not None
    assert snap["apple"] not in snap["body"]


def test_plain_move_frees_the_tail_and_counts_hunger() -> None:
    env = make()
    env.set_board(0, body=[[2, 2], [2, 1], [2, 0]], direction=RIGHT, apple=[5, 5], hunger=5)
    _, reward, term, _, _ = act(env, TURN_RIGHT)  # right of "right" is down
    snap = env.snapshot(0)
    assert (reward, term) == (0.0, False)
    assert snap["body"] == [[3, 2], [2, 2], [2, 1]]
    assert snap["direction"] == DOWN
    assert snap["hunger"] == 6
    assert snap["apple"] == [5, 5]


@pytest.mark.parametrize(
    ("body", "direction", "action"),
    [
        ([[0, 2], [0, 1], [0, 0]], RIGHT, TURN_LEFT),  # up, off the top
        ([[2, 5], [2, 4], [2, 3]], RIGHT, STRAIGHT),  # off the right edge
        ([[5, 2], [5, 1], [5, 0]], RIGHT, TURN_RIGHT),  # down, off the bottom
        ([[2, 0], [2, 1], [2, 2]], LEFT, STRAIGHT),  # off the left edge
    ],
)
def test_leaving_the_grid_is_death_and_leaves_the_board_as_it_was(
    body: list[list[int]], direction: int, action: int
) -> None:
    env = make()
    env.set_board(0, body=body, direction=direction, apple=[4, 4], hunger=3)
    before = env.snapshot(0)
    _, reward, term, trunc, info = act(env, action)
    after = env.snapshot(0)
    assert (reward, term, trunc) == (-1.0, True, False)
    assert after["body"] == before["body"]
    assert after["apple"] == before["apple"]
    assert after["hunger"] == before["hunger"]
    turned = {STRAIGHT: direction, TURN_LEFT: (direction + 3) % 4, TURN_RIGHT: (direction + 1) % 4}[action]
    assert after["direction"] == turned
    assert torch.equal(info["final_obs"], env.observe())


def test_running_into_the_body_is_death() -> None:
    env = make()
    # A hook: head at (2,2) moving left, the body bends below it; turning left (down) hits (3,2).
    body = [[2, 2], [2, 3], [3, 3], [3, 2], [3, 1]]
    env.set_board(0, body=body, direction=LEFT, apple=[0, 0])
    _, reward, term, _, _ = act(env, TURN_LEFT)
    assert (reward, term) == (-1.0, True)


def test_following_the_tail_is_legal_and_not_a_danger() -> None:
    env = make()
    # A 2x2 loop: the head at (1,1) moving left; down is the tail cell (2,1), which moves away.
    env.set_board(0, body=[[1, 1], [1, 2], [2, 2], [2, 1]], direction=LEFT, apple=[5, 5])
    parts = decode(env.observe()[0], 6)
    assert parts["danger"] == [0.0, 0.0, 0.0]  # straight (1,0) free, left = down is the tail, right = up free
    _, reward, term, _, _ = act(env, TURN_LEFT)
    snap = env.snapshot(0)
    assert (reward, term) == (0.0, False)
    assert snap["body"] == [[2, 1], [1, 1], [1, 2], [2, 2]]


def test_danger_flags_walls_and_body_but_not_the_tail() -> None:
    env = make()
    env.set_board(0, body=[[0, 0], [1, 0], [2, 0]], direction=UP, apple=[5, 5])
    # Straight = up: wall. Left = left: wall. Right = right: (0,1) free.
    assert decode(env.observe()[0], 6)["danger"] == [1.0, 1.0, 0.0]
    env.set_board(0, body=[[1, 1], [1, 2], [2, 2], [2, 1], [2, 0]], direction=LEFT, apple=[5, 5])
    # Left = down: (2,1) is a body cell that is not the tail -> danger.
    assert decode(env.observe()[0], 6)["danger"] == [0.0, 1.0, 0.0]


def full_board_path(g: int) -> list[list[int]]:
    """A boustrophedon path over the whole g x g board."""
    path = []
    for r in range(g):
        cols = range(g) if r % 2 == 0 else range(g - 1, -1, -1)
        path += [[r, c] for c in cols]
    return path


def test_filling_the_board_is_a_win() -> None:
    g = 4
    path = full_board_path(g)  # ends ... (3,2), (3,1), (3,0)
    body = list(reversed(path[:-1]))  # head at path[-2] = (3,1), tail at (0,0)
    env = make(g=g)
    env.set_board(0, body=body, direction=LEFT, apple=path[-1])
    obs, reward, term, trunc, _ = act(env, STRAIGHT)
    snap = env.snapshot(0)
    assert (reward, term, trunc) == (1.0, True, False)
    assert snap["length"] == g * g
    assert snap["apple"] is None
    assert decode(obs[0], g)["apple"].sum() == 0.0


def test_win_with_auto_reset_keeps_the_full_board_in_final_obs() -> None:
    g = 4
    path = full_board_path(g)
    env = make(g=g, auto_reset=True)
    env.set_board(0, body=list(reversed(path[:-1])), direction=LEFT, apple=path[-1])
    obs, reward, term, _, info = act(env, STRAIGHT)
    final = decode(info["final_obs"][0], g)
    assert (reward, term) == (1.0, True)
    assert (final["body"] > 0).sum() == g * g
    assert final["apple"].sum() == 0.0
    assert env.snapshot(0)["length"] == 3, "the env is already in its next episode"
    assert decode(obs[0], g)["body"].sum() == pytest.approx(2.0)


def test_auto_reset_after_death_returns_a_fresh_episode_and_the_final_obs() -> None:
    env = make(auto_reset=True)
    env.set_board(0, body=[[0, 2], [0, 1], [0, 0]], direction=UP, apple=[4, 4], hunger=7)
    before = env.observe()[0].clone()
    obs, reward, term, _, info = act(env, STRAIGHT)
    assert (reward, term) == (-1.0, True)
    final = info["final_obs"][0]
    # The final observation is the unchanged board (direction up, as before).
    assert torch.equal(final, before)
    snap = env.snapshot(0)
    assert snap["body"] == [[3, 3], [3, 2], [3, 1]]
    assert snap["hunger"] == 0
    assert snap["direction"] == RIGHT
    assert torch.equal(obs, env.observe())


def test_hunger_limit_truncates_without_death() -> None:
    env = make(max_hunger=10)
    env.set_board(0, body=[[2, 2], [2, 1], [2, 0]], direction=RIGHT, apple=[5, 5], hunger=9)
    obs, reward, term, trunc, _ = act(env, STRAIGHT)
    assert (reward, term, trunc) == (0.0, False, True)
    assert decode(obs[0], 6)["hunger"] == 1.0
    env2 = make(auto_reset=True)  # default limit G*G = 36
    env2.set_board(0, body=[[2, 2], [2, 1], [2, 0]], direction=RIGHT, apple=[5, 5], hunger=35)
    _, _, term2, trunc2, info = act(env2, STRAIGHT)
    assert (term2, trunc2) == (False, True)
    assert decode(info["final_obs"][0], 6)["hunger"] == 1.0
    assert env2.snapshot(0)["hunger"] == 0


def test_absolute_actions_ignore_the_reverse_direction() -> None:
    env = make(action_mode="absolute")
    assert env.n_actions == 4
    env.set_board(0, body=[[2, 2], [2, 1], [2, 0]], direction=RIGHT, apple=[5, 5])
    act(env, LEFT)  # reverse of right: keeps going right
    assert env.snapshot(0)["head"] == [2, 3]
    act(env, DOWN)
    assert env.snapshot(0)["head"] == [3, 3]
    assert env.snapshot(0)["direction"] == DOWN


def test_apples_are_never_on_the_body_under_random_play() -> None:
    env = Snake(512, SnakeParams(grid_size=5))
    env.reset(seed=1)
    gen = torch.Generator().manual_seed(0)
    ate = 0
    for _ in range(300):
        _, reward, _, _, _ = env.step(torch.randint(0, 3, (512,), generator=gen))
        ate += int((reward > 0).sum())
        has = env.apple >= 0
        on_body = env.cells.gather(1, env.apple.clamp(min=0)[:, None])[:, 0] > 0
        assert not (has & on_body).any()
        assert has.all(), "only a won board has no apple"
        assert torch.equal((env.cells > 0).sum(1), env.length)
    assert ate > 100


def test_queued_apples_are_used_in_order_and_snapshots_are_plain_lists() -> None:
    env = Snake(1, SnakeParams(grid_size=6), auto_reset=False)
    env.queue_apples([3 * 6 + 4, 0])
    env.reset(seed=0)
    assert env.snapshot(0)["apple"] == [3, 4]
    act(env, STRAIGHT)  # head (3,3) -> (3,4): eat
    snap = env.snapshot(0)
    assert snap["apple"] == [0, 0]
    assert snap["length"] == 4
    assert all(isinstance(v, (int, list, type(None))) for v in snap.values())
    env.queue_apples([1 * 6 + 1])  # will be on the body after the next step
    env.set_board(0, body=[[1, 1], [1, 0], [2, 0]], direction=RIGHT, apple=[1, 2])
    with pytest.raises(ValueError, match="not an empty cell"):
        act(env, STRAIGHT)


def serpentine(g: int, length: int) -> list[list[int]]:
    """A snake of `length` along the rows of a g x g board, boustrophedon, head last drawn first."""
    path = [[r, c] for r in range(g) for c in (range(g) if r % 2 == 0 else range(g - 1, -1, -1))]
    return path[:length][::-1]


def test_late_starts_copy_running_games_with_long_snakes_into_ended_ones() -> None:
    g, n = 6, 64
    env = Snake(n, SnakeParams(grid_size=g), late_starts=1.0)
    env.reset(seed=0)
    for i in range(0, n, 2):  # half the envs hold a snake of 20 cells (more than half of 36), head (3, 4)
        env.set_board(i, body=serpentine(g, 20), direction=LEFT, apple=[5, 5])
    ended_total = 0
    for _ in range(3):  # straight on: the long snakes live, the others run into the right wall
        obs, _, term, trunc, info = env.step(torch.zeros(n, dtype=torch.int64))
        ended = term | trunc
        assert info["counted"][ended].all()  # the games that ended began at the start position
        # every env that ended starts again as a copy of a running long game: never at length 3
        assert (env.length[ended] >= g * g // 2).all()
        ended_total += int(ended.sum())
        for i in range(n):  # each state is a real game: body counters 1..L once, the head holds L
            cells, length = env.cells[i], int(env.length[i])
            assert sorted(cells[cells > 0].tolist()) == list(range(1, length + 1))
            assert int(cells[env.head[i]]) == length and int(cells[env.apple[i]]) == 0
        assert torch.equal(obs, env.observe())
    assert ended_total == n // 2
    # Straight on, every snake reaches the left wall: the copies' games end too, and do not count.
    # (head (3, 1), two cells to go), and the copies' games do not count.
    for _ in range(2):
        _, _, term, _, info = env.step(torch.zeros(n, dtype=torch.int64))
    assert term.all() and not info["counted"][1::2].any() and info["counted"][0::2].all()


def test_without_long_snakes_late_starts_start_afresh() -> None:
    env = Snake(16, SnakeParams(grid_size=6), late_starts=1.0)
    env.reset(seed=0)
    for _ in range(30):
        _, _, term, trunc, _ = env.step(torch.zeros(16, dtype=torch.int64))  # straight into the wall
        assert (env.length[term | trunc] == 3).all()


# The 6x6 board of tests/js/snake.test.mjs: heading left from (1,2), straight enters the pocket
# (0,0),(0,1),(1,0),(1,1), walled by body cells whose counters (14 and more) stay closed for the 12
# moves of look-ahead; turning left (down) or right (up) hits the body.
POCKET_BODY = [[1, 2], [0, 2], [0, 3], [0, 4], [0, 5], [1, 5], [1, 4], [1, 3], [2, 3], [2, 2], [2, 1], [2, 0],
               [3, 0], [3, 1], [3, 2], [3, 3], [3, 4], [3, 5], [4, 5], [4, 4], [4, 3], [4, 2], [4, 1], [4, 0], [5, 0]]


def test_a_move_into_a_closed_pocket_reads_its_size_and_a_deadly_move_zero() -> None:
    env = make(g=6, space=True)
    env.set_board(0, body=POCKET_BODY, direction=LEFT, apple=[5, 5])
    assert decode(env.observe()[0], 6)["space"] == pytest.approx([4 / 36, 0.0, 0.0])


def test_a_body_wall_opens_at_the_move_its_tail_end_leaves_it() -> None:
    # The same pocket with the body cut to 18 segments: the wall cell (2,0) now has counter 7, so from
    # the pocket the head gets out at move 7 and the rest of the board opens behind it.
    env = make(g=6, space=True)
    env.set_board(0, body=POCKET_BODY[:18], direction=LEFT, apple=[5, 5])
    assert decode(env.observe()[0], 6)["space"][0] > 4 / 36


def reference_space(body: list[int], cell: int, deadly: bool, g: int) -> float:
    """The rule of docs/snake.md as a plain breadth-first loop (the JS engine's shape)."""
    if deadly:
        return 0.0
    counter = [0] * (g * g)
    for i, c in enumerate(body):
        counter[c] = len(body) - i
    def neighbours(c: int) -> list[int]:
        r, k = divmod(c, g)
        near = ((r - 1, k), (r + 1, k), (r, k - 1), (r, k + 1))
        return [rr * g + kk for rr, kk in near if 0 <= rr < g and 0 <= kk < g]

    reached = {cell}
    for d in range(2, depth(g) + 1):
        reached |= {c for c in range(g * g) if counter[c] <= d and any(n in reached for n in neighbours(c))}
    return len(reached) / (g * g)


def random_snakes(env: Snake, rng: torch.Generator) -> None:
    """Put every env into a random long snake: a self-avoiding random walk of up to the whole board."""
    g = env.g
    for i in range(env.num_envs):
        start = int(torch.randint(g * g, (1,), generator=rng))
        body = [divmod(start, g)]
        want = int(torch.randint(3, g * g, (1,), generator=rng))
        while len(body) < want:
            r, c = body[-1]
            free = [(r + dr, c + dc) for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
                    if 0 <= r + dr < g and 0 <= c + dc < g and (r + dr, c + dc) not in body]
            if not free:
                break
            body.append(free[int(torch.randint(len(free), (1,), generator=rng))])
        env.set_board(i, body=[list(b) for b in body], direction=int(torch.randint(4, (1,), generator=rng)), apple=None)


@pytest.mark.parametrize(("g", "n"), [(6, 70), (10, 130), (15, 64)])
def test_the_space_features_numpy_and_torch_and_the_plain_rule_agree(g: int, n: int) -> None:
    env = make(g=g, n=n, space=True)
    rng = torch.Generator().manual_seed(g)
    random_snakes(env, rng)
    dirs = (env.direction[:, None] + env._rel3) % 4
    row, col = env.head[:, None] // g + env._dr[dirs], env.head[:, None] % g + env._dc[dirs]
    out = (row < 0) | (row >= g) | (col < 0) | (col >= g)
    target = row.clamp(0, g - 1) * g + col.clamp(0, g - 1)
    deadly = out | (env.cells.gather(1, target) > 1)
    fast = SpaceFill(n, g)(env.cells.numpy(), target.numpy(), deadly.numpy())
    plain = space_torch(env.cells, target, deadly, g)
    assert torch.equal(torch.from_numpy(fast), plain)
    assert torch.equal(env.observe()[:, 3 * g * g + 8 :], plain), "the env's observation carries them"
    for i in range(0, n, 7):
        body = [r * g + c for r, c in env.snapshot(i)["body"]]
        want = [reference_space(body, int(target[i, k]), bool(deadly[i, k]), g) for k in range(3)]
        assert plain[i].tolist() == torch.tensor(want).tolist(), f"env {i}"
    assert float(plain[~deadly].min()) < 1, "some open moves lead into pockets: the boards test the depth"


def test_the_numpy_path_refuses_boards_its_byte_counters_cannot_hold() -> None:
    with pytest.raises(ValueError, match="up to 15x15"):
        SpaceFill(4, 16)
    assert make(g=16, space=True)._space_fill is None, "a 16x16 env takes the torch path"


def test_the_torch_path_of_the_space_features_steps_like_the_numpy_path() -> None:
    """`compile_step` (and a GPU) computes them with torch ops: the same observations, step by step."""
    fast, plain = make(g=8, n=70, auto_reset=True, space=True), make(g=8, n=70, auto_reset=True, space=True)
    plain._space_fill = None  # what compile_step does
    gen = torch.Generator().manual_seed(3)
    ends = 0
    for _ in range(300):
        actions = torch.randint(0, 3, (70,), generator=gen)
        obs_a, _, term, trunc, info_a = fast.step(actions)
        obs_b, _, _, _, info_b = plain.step(actions)
        assert torch.equal(obs_a, obs_b)
        ended = term | trunc
        assert torch.equal(info_a["final_obs"][ended], info_b["final_obs"][ended])
        ends += int(ended.sum())
    assert ends > 50


STATE = ("cells", "head", "direction", "length", "apple", "hunger")


@pytest.mark.parametrize(
    ("g", "n", "settings", "auto_reset", "late_starts"),
    [
        (10, 128, {}, True, 0.0),  # the demo's preset
        (10, 128, {"space": True}, True, 0.0),
        (6, 70, {"space": True}, False, 0.0),  # env counts that are not multiples of 64
        (6, 33, {"action_mode": "absolute"}, True, 0.0),
        (16, 20, {"space": True}, True, 0.0),  # int16 counters, the torch space fill on numpy's memory
        (6, 64, {}, True, 0.5),  # late starts rewrite the state between numpy steps
    ],
)
def test_the_numpy_step_plays_the_same_games_as_the_torch_step(
    g: int, n: int, settings: dict, auto_reset: bool, late_starts: float
) -> None:
    """On a CPU `step` runs in numpy (trainer/envs/snake_np.py): every output and the whole state equal
    the torch step's, bit for bit, over games with deaths, meals, wins of small boards and resets."""
    params = SnakeParams(grid_size=g, **settings)
    fast, plain = (
        Snake(n, params, auto_reset=auto_reset, late_starts=late_starts, numpy_step=numpy) for numpy in (True, False)
    )
    assert torch.equal(fast.reset(seed=3), plain.reset(seed=3))
    gen = torch.Generator().manual_seed(1)
    ate = ended = 0
    for t in range(300):
        actions = torch.randint(0, params.n_actions, (n,), generator=gen)
        if t % 5:
            actions[: n // 2] = 0  # half the envs mostly straight on: longer games, walls and coils
        out_a, out_b = fast.step(actions), plain.step(actions)
        for a, b in zip(out_a[:4], out_b[:4], strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), t
        done = out_a[2] | out_a[3]
        rows = done if auto_reset else slice(None)  # auto-reset: final_obs is read only where an env ended
        assert torch.equal(out_a[4]["final_obs"][rows], out_b[4]["final_obs"][rows]), t
        for name in STATE:
            assert torch.equal(getattr(fast, name), getattr(plain, name)), (t, name)
        if not auto_reset and bool(done.any()):
            assert torch.equal(fast.reset(), plain.reset())
        ate += int((out_a[1] > 0).sum())
        ended += int(done.sum())
    assert ate > 10 and ended > 10, "the games must eat and end for the comparison to mean anything"
