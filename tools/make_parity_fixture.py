"""Write tests/data/snake_parity.json: trainer/envs/snake.py played step by step, for the JS engine.

Each scenario is one env (auto-reset on, as in training) with a recorded action sequence. Every step
stores the action, reward, terminated, truncated, the observation returned (sparse: [index, value]
pairs of the non-zero float32 values), the final observation when the episode ended, and the apple's
flat index in the returned observation. web/src/parity.js replays it with the apples injected.

    .venv/bin/python tools/make_parity_fixture.py [--out tests/data/snake_parity.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainer.envs.snake import Snake, SnakeParams  # noqa: E402

Obs = torch.Tensor
Controller = Callable[[Snake, Obs], int]


def sparse(obs: Obs) -> list[list[float]]:
    """Non-zero entries of one float32 observation as [index, value]; float32 -> double is exact."""
    row = obs.reshape(-1)
    idx = torch.nonzero(row).reshape(-1).tolist()
    return [[i, float(row[i])] for i in idx]


def apple_of(env: Snake) -> int:
    return int(env.apple[0])


def greedy(env: Snake, obs: Obs) -> int:
    """Toward the apple among the moves that do not die (from the danger features), ties: first."""
    g = env.g
    n2 = g * g
    d = int(env.direction[0])
    head = int(env.head[0])
    hr, hc = divmod(head, g)
    apple = apple_of(env)
    ar, ac = divmod(apple, g) if apple >= 0 else (hr, hc)
    relative = env.params.action_mode == "relative"
    options = []
    for a in range(env.n_actions):
        if relative:
            nd = (d + (0, 3, 1)[a]) % 4
            danger = float(obs[0, 3 * n2 + 4 + a])
        else:
            nd = d if a == (d + 2) % 4 else a
            turn = (nd - d) % 4
            danger = float(obs[0, 3 * n2 + 4 + {0: 0, 3: 1, 1: 2}[turn]])
        nr, nc = hr + (-1, 0, 1, 0)[nd], hc + (0, 1, 0, -1)[nd]
        options.append((danger, abs(nr - ar) + abs(nc - ac), a))
    return min(options)[2]


def roomiest(env: Snake, obs: Obs) -> int:
    """The relative move with the largest space feature; ties: toward the apple (as `greedy`)."""
    base = 3 * env.g * env.g
    best = max(float(obs[0, base + 8 + a]) for a in range(3))
    if best == 0.0:
        return greedy(env, obs)
    g = env.g
    hr, hc = divmod(int(env.head[0]), g)
    ar, ac = divmod(apple_of(env), g) if apple_of(env) >= 0 else (hr, hc)
    d = int(env.direction[0])
    options = []
    for a in range(3):
        if float(obs[0, base + 8 + a]) == best:
            nd = (d + (0, 3, 1)[a]) % 4
            options.append((abs(hr + (-1, 0, 1, 0)[nd] - ar) + abs(hc + (0, 1, 0, -1)[nd] - ac), a))
    return min(options)[1]


def fixed(actions: list[int]) -> Controller:
    queue = list(actions)
    return lambda env, obs: queue.pop(0)


class Recorder:
    def __init__(self, name: str, params: SnakeParams, note: str) -> None:
        self.env = Snake(1, params)
        self.scenario: dict[str, Any] = {
            "name": name,
            "note": note,
            "grid_size": params.grid_size,
            "action_mode": params.action_mode,
            "max_hunger": params.hunger_limit,
            "space": params.space,
            "start": None,
            "steps": [],
        }
        self.obs: Obs | None = None

    def reset(self, seed: int) -> None:
        self.obs = self.env.reset(seed=seed)
        self.scenario["reset"] = {"seed": seed, "apple": apple_of(self.env), "obs": sparse(self.obs)}

    def set_board(self, body: list[list[int]], direction: int, apple: list[int] | None, hunger: int) -> None:
        self.env.set_board(0, body=body, direction=direction, apple=apple, hunger=hunger)
        self.obs = self.env.observe()
        self.scenario["start"] = {"body": body, "direction": direction, "apple": apple, "hunger": hunger}
        self.scenario["start_obs"] = sparse(self.obs)

    def play(self, controller: Controller, steps: int, until_done: bool = False) -> int:
        """Play up to `steps` moves (stop after an episode end if until_done); returns episodes ended."""
        ended = 0
        for _ in range(steps):
            assert self.obs is not None
            action = controller(self.env, self.obs)
            obs, reward, terminated, truncated, info = self.env.step(torch.tensor([action]))
            done = bool(terminated[0]) or bool(truncated[0])
            self.scenario["steps"].append(
                {
                    "action": action,
                    "reward": float(reward[0]),
                    "terminated": bool(terminated[0]),
                    "truncated": bool(truncated[0]),
                    "obs": sparse(obs),
                    "final_obs": sparse(info["final_obs"]) if done else None,
                    "apple": apple_of(self.env),
                }
            )
            self.obs = obs
            ended += done
            if done and until_done:
                break
        return ended


def summary(rec: Recorder) -> dict[str, int]:
    steps = rec.scenario["steps"]
    return {
        "steps": len(steps),
        "apples": sum(s["reward"] > 0 for s in steps),
        "deaths": sum(s["reward"] < 0 for s in steps),
        "truncations": sum(s["truncated"] for s in steps),
    }


def greedy_10x10() -> Recorder:
    rec = Recorder("greedy-10x10", SnakeParams(grid_size=10), "greedy play, seeded apples, crash, auto-reset")
    rec.reset(seed=7)
    rec.play(greedy, 160)
    rec.play(fixed([0] * 12), 12, until_done=True)  # straight into a wall (or the body)
    rec.play(greedy, 30)
    return rec


def scripted_self_collision() -> Recorder:
    rec = Recorder(
        "self-collision-10x10",
        SnakeParams(grid_size=10),
        "eat two apples in a row (length 5), then three right turns run into the body",
    )
    rec.env.queue_apples([56, 57, 99])
    rec.reset(seed=2)
    rec.play(fixed([0, 0, 2, 2, 2]), 5, until_done=True)
    rec.env.queue_apples([0])
    rec.play(fixed([0] * 6), 6, until_done=True)  # after auto-reset: straight into the right wall
    rec.play(greedy, 20)
    return rec


def scripted_truncation() -> Recorder:
    rec = Recorder(
        "tail-chase-truncation-10x10",
        SnakeParams(grid_size=10),
        "eat to length 4, then circle a 2x2 square onto the tail cell (legal) until hunger truncates",
    )
    rec.env.queue_apples([56, 0])
    rec.reset(seed=3)
    rec.play(fixed([0]), 1)
    ended = rec.play(fixed([2] * 200), 200, until_done=True)
    if ended != 1 or not rec.scenario["steps"][-1]["truncated"]:
        raise RuntimeError("the tail chase did not end in a truncation")
    rec.play(greedy, 10)
    return rec


def win_4x4() -> Recorder:
    note = "a hand-built board one apple from full: eat it and win"
    rec = Recorder("win-4x4", SnakeParams(grid_size=4), note)
    rec.reset(seed=4)
    path = [[0, 0], [0, 1], [0, 2], [0, 3], [1, 3], [1, 2], [1, 1], [1, 0]]
    path += [[2, 0], [2, 1], [2, 2], [2, 3], [3, 3], [3, 2], [3, 1]]
    rec.set_board(body=path[::-1], direction=3, apple=[3, 0], hunger=5)
    rec.play(fixed([0]), 1)
    last = rec.scenario["steps"][-1]
    if not last["terminated"] or last["reward"] != 1.0:
        raise RuntimeError("the full board did not end in a win")
    rec.play(greedy, 40)
    return rec


def long_snake_10x10() -> Recorder:
    note = "space features on; a hand-built snake of length 63 (rows 0-5 a serpentine), longer than the look-ahead"
    rec = Recorder("long-snake-space-10x10", SnakeParams(grid_size=10, space=True), note)
    rec.env.queue_apples([99])
    rec.reset(seed=6)
    path = []  # tail first: row 0 left to right, row 1 right to left, ..., then down into row 6
    for r in range(6):
        cols = range(10) if r % 2 == 0 else range(9, -1, -1)
        path += [[r, c] for c in cols]
    path += [[6, 0], [6, 1], [6, 2]]
    rec.set_board(body=path[::-1], direction=1, apple=[9, 9], hunger=0)
    rec.play(roomiest, 250, until_done=True)
    return rec


def absolute_8x8() -> Recorder:
    rec = Recorder(
        "absolute-8x8",
        SnakeParams(grid_size=8, action_mode="absolute", max_hunger=30),
        "absolute actions (a reverse is ignored), max_hunger 30, greedy then crashes",
    )
    rec.reset(seed=5)
    rec.play(fixed([3, 3, 0, 2, 1, 1]), 6)  # 3 (left) while heading right: ignored
    rec.play(greedy, 80)
    rec.play(fixed([0] * 10), 10, until_done=True)
    rec.play(fixed([1] * 40), 40, until_done=True)  # right, reverse-proof: wall
    rec.play(greedy, 20)
    return rec


def build() -> dict[str, Any]:
    recs = [
        greedy_10x10(),
        scripted_truncation(),
        scripted_self_collision(),
        win_4x4(),
        absolute_8x8(),
        long_snake_10x10(),
    ]
    return {
        "format": 1,
        "about": "trainer/envs/snake.py recorded by tools/make_parity_fixture.py; rules: docs/snake.md",
        "obs_encoding": "sparse [index, value] pairs of the non-zero float32 values",
        "scenarios": [r.scenario | {"summary": summary(r)} for r in recs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "snake_parity.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    fixture = build()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    for s in fixture["scenarios"]:
        print(f"{s['name']}: {s['summary']}")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
