"""Env steps/s: our CartPole and Snake vs gymnasium's vector envs, side by side.

CartPole's peer is gymnasium's own numpy-vectorised CartPole (`vector_entry_point`). Snake's is
bench/gym_snake.py: the same rules and observation as a one-board gymnasium.Env in numpy, N of them in
gymnasium's SyncVectorEnv (gymnasium has no Snake, and that is how it runs N of an env it does not
vectorise).

    .venv/bin/python bench/bench_envs.py                      # CPU, default counts (< 1 min)
    .venv/bin/python bench/bench_envs.py --counts 4096,65536,262144 --steps 300 --threads 2
    .venv/bin/python bench/bench_envs.py --device cuda --counts 65536,1048576   # on a GPU host
    .venv/bin/python bench/bench_envs.py --compile          # Snake also through Snake.compile_step()

On a CPU our envs step in numpy (CartPole's `_NumpyStep`, Snake's `NumpySnakeStep`); Snake's line
also times its torch step on the same counts, to show what the numpy one buys.

Random actions are generated before timing; CUDA timings synchronise before reading the clock.
gymnasium runs on the CPU whatever `--device` is (it is numpy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as trainer.train does, before torch loads

import torch  # noqa: E402

from trainer.envs import CartPole, Snake, SnakeParams  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gym_snake, beside this file


def _timed(step: Callable[[int], object], steps: int, device: torch.device) -> float:
    for i in range(min(10, steps)):  # warm-up: allocator, lazy init
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t = time.perf_counter()
    for i in range(steps):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def torch_cartpole_sps(n: int, steps: int, device: torch.device) -> float:
    env = CartPole(n, device=device)
    env.reset(seed=0)
    actions = torch.randint(0, 2, (steps, n), device=device)
    return n * steps / _timed(lambda i: env.step(actions[i]), steps, device)


def gym_cartpole_sps(n: int, steps: int) -> float:
    import gymnasium as gym

    env = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, n))
    sps = n * steps / _timed(lambda i: env.step(actions[i]), steps, torch.device("cpu"))
    env.close()
    return sps


def torch_snake_sps(
    n: int, steps: int, device: torch.device, grid: int, compiled: bool = False, numpy_step: bool | None = None
) -> float:
    env = Snake(n, SnakeParams(grid_size=grid), device=device, numpy_step=numpy_step)
    if compiled:
        env.compile_step()  # compiled during the untimed warm-up steps
    env.reset(seed=0)
    actions = torch.randint(0, 3, (steps, n), device=device)
    return n * steps / _timed(lambda i: env.step(actions[i]), steps, device)


def gym_snake_sps(n: int, steps: int, grid: int) -> float:
    """The peer: bench/gym_snake.py's one-board Snake, N of them in gymnasium's SyncVectorEnv."""
    import gymnasium as gym
    from gym_snake import GymSnake

    env = gym.vector.SyncVectorEnv([lambda: GymSnake(grid) for _ in range(n)])
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 3, size=(steps, n))
    sps = n * steps / _timed(lambda i: env.step(actions[i]), steps, torch.device("cpu"))
    env.close()
    return sps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--counts", default="256,4096,65536", help="CartPole env counts")
    p.add_argument("--snake-counts", default="256,1024,4096", help="Snake env counts")
    p.add_argument("--steps", type=int, default=200, help="timed steps per measurement")
    p.add_argument("--grid-size", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 was fastest on 2 cores)")
    p.add_argument("--compile", action="store_true", help="Snake also compiled (torch.compile), side by side")
    p.add_argument("--snake-peer-div", type=int, default=4,
                   help="the snake peer times steps/N steps (at least 10): it steps each board in Python")
    p.add_argument("--snake-peer-max", type=int, default=16384,
                   help="no snake peer above this many envs (one Python object per board)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.device == "cpu" or args.threads != 1:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    rows = []
    print(f"device={device} threads={torch.get_num_threads()} steps={args.steps}")
    print(f"{'env':<10}{'envs':>10}{'ours steps/s':>16}{'gymnasium':>14}{'ratio':>8}")
    for n in (int(x) for x in args.counts.split(",")):
        ours = torch_cartpole_sps(n, args.steps, device)
        ref = gym_cartpole_sps(n, args.steps)
        rows.append({"env": "cartpole", "envs": n, "torch_sps": ours, "gym_sps": ref, "ratio": ours / ref})
        print(f"{'cartpole':<10}{n:>10}{ours:>16,.0f}{ref:>14,.0f}{ours / ref:>8.2f}", flush=True)
    for n in (int(x) for x in args.snake_counts.split(",")):
        ours = torch_snake_sps(n, args.steps, device, args.grid_size)
        row = {"env": f"snake{args.grid_size}", "envs": n, "torch_sps": ours}
        line = f"{'snake' + str(args.grid_size):<10}{n:>10}{ours:>16,.0f}"
        if n <= args.snake_peer_max:
            ref = gym_snake_sps(n, max(10, args.steps // args.snake_peer_div), args.grid_size)
            row.update(gym_sps=ref, ratio=ours / ref)
            line += f"{ref:>14,.0f}{ours / ref:>8.2f}"
        else:
            line += f"{'-':>14}{'-':>8}"
        if device.type == "cpu":
            row["torch_step_sps"] = eager = torch_snake_sps(n, args.steps, device, args.grid_size, numpy_step=False)
            line += f"   torch step {eager:,.0f} ({ours / eager:.2f}x)"
        if args.compile:
            row["compiled_sps"] = fast = torch_snake_sps(n, args.steps, device, args.grid_size, compiled=True)
            line += f"   compiled {fast:,.0f} steps/s ({fast / ours:.2f}x eager)"
        rows.append(row)
        print(line, flush=True)
    if args.json:
        print(json.dumps({"device": str(device), "threads": torch.get_num_threads(), "rows": rows}))


if __name__ == "__main__":
    main()
