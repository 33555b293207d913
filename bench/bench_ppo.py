"""PPO on CartPole: our trainer vs Stable-Baselines3 (RL-Zoo's tuned settings), side by side.

    .venv/bin/python bench/bench_ppo.py                       # default run, ~2 min on 2 cores
    .venv/bin/python bench/bench_ppo.py --seeds 10 --sb3-seeds 5 --counts 8,1024,16384,65536
    .venv/bin/python bench/bench_ppo.py --precision bf16 --compile --optimizer fused --device cuda \
        --throughput-env snake --counts 4096,65536 --threads 1 --seeds 0 --sb3-seeds 0

1. Time to solve, measured from process start (a fresh `python` per run, so imports count): ours is
   `python -m trainer.train --env cartpole --seed S` with its defaults (it stops itself once a greedy
   evaluation over 20 episodes reaches 475); SB3 runs in a child process of this script with RL-Zoo's
   CartPole-v1 hyperparameters and the same stopping rule (a greedy evaluation over 20 gymnasium
   episodes every 512 steps, abandoned once 475 is out of reach). Every model that stopped is then
   re-scored here on 20 fresh gymnasium episodes (not timed): "verified". A third process per round
   only imports torch: its median is the floor under both sides' times, printed with the ratio SB3's
   median over that floor, the most any trainer that imports torch could read. Ours is then split by
   its THRUST_DONE `train_s` (the trainer's own clock around its loop: the solve); a fourth process
   imports torch and ends by `os._exit`, skipping the interpreter's teardown as ours does, and what
   ours spends past it besides the solve is what it adds on top of the solve to a bare import (its
   other imports, set-up, the final checkpoint).
2. Throughput: env steps per second of whole PPO iterations (rollout + update), ours at several env
   counts and thread counts (minibatches of ~8k samples) and SB3 at RL-Zoo's 8 envs (1 thread);
   best of 3 for each, as the machine may be shared. `--throughput-env snake` measures ours on snake
   (its preset's network) instead; `--device cuda` runs ours there.
`--precision`, `--compile` go to both parts (time to solve: as trainer flags; throughput: the same
settings on the PPO object, `--compile` as trainer.train does it); `--optimizer` (auto, foreach, fused:
trainer/ppo.py `make_optimizer`) is for the throughput part only, the trainer has no such flag.
Ratios are printed at the end (with `--seeds 0 --sb3-seeds 0`, throughput only); `--json` adds one
JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as trainer.train does, before torch loads

REPO = Path(__file__).resolve().parents[1]
TARGET = 475.0
EPISODES = 20


def gym_eval(act: Callable[[np.ndarray], np.ndarray], seed: int, target: float | None = None) -> float:
    """Mean return of the first episode in each of 20 gymnasium CartPole-v1 envs (greedy `act`)."""
    import gymnasium as gym

    env = gym.make_vec("CartPole-v1", num_envs=EPISODES, vectorization_mode="vector_entry_point")
    obs, _ = env.reset(seed=seed)
    returns = np.zeros(EPISODES)
    running = np.ones(EPISODES, dtype=bool)
    for _ in range(500):
        obs, reward, term, trunc, _ = env.step(act(obs))
        returns += reward * running
        running &= ~(term | trunc)
        if not running.any():
            break
        if target is not None and ((500 - returns) * ~running).sum() > EPISODES * (500 - target):
            break  # the mean can no longer reach the target
    env.close()
    return float(returns.mean())


# ------------------------------------------------------------------------------------------ SB3
RL_ZOO_CARTPOLE = {  # rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1
    "n_envs": 8,
    "n_timesteps": 100_000,
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": 0.001,
    "clip_range": 0.2,
}


def sb3_model(seed: int, n_envs: int = RL_ZOO_CARTPOLE["n_envs"]):  # noqa: ANN201 - SB3 type
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    z = RL_ZOO_CARTPOLE

    def linear(start: float) -> Callable[[float], float]:
        return lambda progress_remaining: progress_remaining * start  # RL-Zoo's "lin_" schedules

    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=seed)
    return PPO(
        "MlpPolicy",
        env,
        n_steps=z["n_steps"],
        batch_size=z["batch_size"],
        gae_lambda=z["gae_lambda"],
        gamma=z["gamma"],
        n_epochs=z["n_epochs"],
        ent_coef=z["ent_coef"],
        learning_rate=linear(z["learning_rate"]),
        clip_range=linear(z["clip_range"]),
        seed=seed,
        verbose=0,
        device="cpu",
    )


def sb3_child(seed: int) -> None:
    """Train SB3 until the greedy evaluation reaches the target; print one JSON line."""
    from stable_baselines3.common.callbacks import BaseCallback

    model = sb3_model(seed)

    def act(obs: np.ndarray) -> np.ndarray:
        return model.predict(obs, deterministic=True)[0]

    class StopWhenSolved(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.solved = False
            self.last_eval = 0
            self.evals = 0
            self.score = 0.0

        def _on_step(self) -> bool:
            if self.num_timesteps - self.last_eval >= 512:
                self.last_eval = self.num_timesteps
                self.evals += 1
                self.score = gym_eval(act, seed=10_000 + self.evals, target=TARGET)
                self.solved = self.score >= TARGET
            return not self.solved

    cb = StopWhenSolved()
    model.learn(total_timesteps=RL_ZOO_CARTPOLE["n_timesteps"], callback=cb)
    path = tempfile.mkdtemp(prefix="sb3-") + "/model.zip"
    model.save(path)
    print(json.dumps({"steps": model.num_timesteps, "solved": cb.solved, "eval": cb.score, "model": path}))


def run_sb3(seed: int) -> dict:
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, __file__, "--sb3-child", str(seed)], capture_output=True, text=True, check=True
    )
    wall = time.perf_counter() - t0
    out = json.loads(res.stdout.strip().splitlines()[-1])
    from stable_baselines3 import PPO

    model = PPO.load(out["model"], device="cpu")
    verified = gym_eval(lambda o: model.predict(o, deterministic=True)[0], seed=90_000 + seed)
    return {
        "who": "sb3",
        "seed": seed,
        "wall_s": wall,
        "steps": out["steps"],
        "solved": out["solved"],
        "verified": verified,
    }


# ------------------------------------------------------------------------------------------ ours
def run_import_only(teardown: bool = True) -> dict:
    """A process that imports torch and ends: the floor under any torch trainer's time from process
    start (ours and SB3 both pay it), so SB3's time over it is the most a ratio could read.
    `teardown=False` ends it with `os._exit` as trainer.train does (skipping torch's module cleanup at
    exit, 0.5-0.7 s on a 2-core Zen 4 VM): the floor under what ours adds besides its solve."""
    code = "import torch" if teardown else "import os, torch; os._exit(0)"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    return {"who": "import" if teardown else "import_exit", "wall_s": time.perf_counter() - t0}


def run_ours(seed: int, extra: list[str]) -> dict:
    import torch

    run_dir = tempfile.mkdtemp(prefix="ours-")
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--env", "cartpole", "--seed", str(seed), "--run-dir", run_dir, *extra],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    wall = time.perf_counter() - t0
    done = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("THRUST_DONE "))[12:])
    from trainer.export import load_checkpoint, policy_from_checkpoint

    policy = policy_from_checkpoint(load_checkpoint(run_dir))

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return policy(torch.as_tensor(obs, dtype=torch.float32))[0].argmax(1).numpy()

    verified = gym_eval(act, seed=90_000 + seed)
    return {
        "who": "ours",
        "seed": seed,
        "wall_s": wall,
        "steps": done["step"],
        "solved": done["solved"],
        "verified": verified,
        "train_s": done["train_s"],  # the trainer's own time in its loop: the solve
    }


def ours_throughput(
    num_envs: int,
    iterations: int = 3,
    threads: int = 1,
    env_name: str = "cartpole",
    device: str = "cpu",
    precision: str = "fp32",
    compile: bool = False,  # noqa: A002 - the trainer's flag name
    optimizer: str = "auto",
) -> float:
    import torch

    from trainer.envs.registry import get_spec
    from trainer.policy import build_policy, compile_mode, compile_policy
    from trainer.ppo import PPO, PPOConfig

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = get_spec(env_name)
    env = spec.make(num_envs, device)  # snake: its default 10x10 board
    # PPOConfig's defaults and a 64-wide MLP for either env (the figures in BENCHMARKS.md were taken so)
    policy = build_policy("mlp", env.obs_dim, env.n_actions, 64).to(device)
    cfg = PPOConfig(num_envs=num_envs, num_steps=32, precision=precision, optimizer=optimizer)
    act_model = policy
    if compile:
        act_model = compile_policy(policy, torch.device(device))
        if hasattr(env, "compile_step"):
            env.compile_step(compile_mode(torch.device(device)))
    ppo = PPO(env, policy, cfg, score=spec.score, train_model=act_model, act_model=act_model)
    ppo.start(seed=0)
    for _ in range(2 if compile else 1):  # compiling (and recompiling for the update's shapes) is not timed
        ppo.collect()
        ppo.update().tolist()
    best = 0.0  # best of a few iterations: the machine is shared, the best is the least disturbed
    for _ in range(iterations):
        t = time.perf_counter()
        ppo.collect()
        ppo.update().tolist()  # waits for the device
        best = max(best, num_envs * cfg.num_steps / (time.perf_counter() - t))
    return best


def sb3_throughput(steps: int = 4096, repeats: int = 3) -> float:
    import torch

    torch.set_num_threads(1)  # faster than 2 for SB3's small batches here
    model = sb3_model(seed=0)
    model.learn(total_timesteps=512)  # warm-up
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        model.learn(total_timesteps=steps, reset_num_timesteps=False)
        best = max(best, steps / (time.perf_counter() - t))
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=5, help="our time-to-solve runs (seeds 1..N)")
    p.add_argument("--sb3-seeds", type=int, default=3, help="SB3 time-to-solve runs (seeds 1..N)")
    p.add_argument("--counts", default="8,1024,4096", help="env counts for our throughput")
    p.add_argument("--threads", default="1,2", help="torch thread counts for our throughput")
    p.add_argument("--train-args", default="", help="extra flags for trainer.train, space separated")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="ours: --precision (both parts)")
    p.add_argument("--compile", action="store_true", help="ours: --compile (both parts)")
    p.add_argument("--optimizer", choices=("auto", "foreach", "fused"), default="auto", help="ours: throughput only")
    p.add_argument("--throughput-env", default="cartpole", choices=("cartpole", "snake"), help="ours: throughput env")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="ours: throughput device")
    p.add_argument("--json", action="store_true")
    p.add_argument("--sb3-child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sb3_child is not None:
        sb3_child(args.sb3_child)
        return
    train_args = [*args.train_args.split(), "--precision", args.precision, *(["--compile"] if args.compile else [])]
    runs = []
    # Interleaved, so both see the same machine load.
    for seed in range(1, max(args.seeds, args.sb3_seeds) + 1):
        if seed <= args.seeds:
            runs.append(run_ours(seed, train_args))
            print(json.dumps(runs[-1]), flush=True)
        if seed <= args.sb3_seeds:
            runs.append(run_sb3(seed))
            print(json.dumps(runs[-1]), flush=True)
        runs.append(run_import_only())
        runs.append(run_import_only(teardown=False))
    ours_settings = {"env_name": args.throughput_env, "device": args.device, "precision": args.precision,
                     "compile": args.compile, "optimizer": args.optimizer}
    tp = {
        f"ours_{n}_t{t}": ours_throughput(n, threads=t, **ours_settings)
        for n in (int(x) for x in args.counts.split(","))
        for t in (int(x) for x in args.threads.split(","))
    }
    tp["sb3_8"] = sb3_throughput()
    print(f"ours: {json.dumps(ours_settings)}", flush=True)
    for k, v in tp.items():
        print(f"throughput {k:>12}: {v:>12,.0f} steps/s", flush=True)
    if not runs:
        if args.json:
            print(json.dumps({"throughput": tp, "ours_settings": ours_settings}))
        return

    def summary(who: str) -> dict:
        rs = [r for r in runs if r["who"] == who]
        walls = [r["wall_s"] for r in rs]
        return {
            "median_s": statistics.median(walls),
            "max_s": max(walls),
            "solved": sum(r["solved"] for r in rs),
            "verified_475": sum(r["verified"] >= TARGET for r in rs),
            "runs": len(rs),
        }

    ours, sb3 = summary("ours"), summary("sb3")
    best = max(v for k, v in tp.items() if k.startswith("ours_"))
    print(
        f"time to solve, ours: median {ours['median_s']:.2f} s, max {ours['max_s']:.2f} s, "
        f"solved {ours['solved']}/{ours['runs']}, verified >= 475 on gymnasium {ours['verified_475']}/{ours['runs']}"
    )
    print(
        f"time to solve, SB3 : median {sb3['median_s']:.2f} s, max {sb3['max_s']:.2f} s, "
        f"solved {sb3['solved']}/{sb3['runs']}, verified >= 475 on gymnasium {sb3['verified_475']}/{sb3['runs']}"
    )
    print(f"ratio time-to-solve SB3/ours (medians): {sb3['median_s'] / ours['median_s']:.2f}x")
    floor = statistics.median(r["wall_s"] for r in runs if r["who"] == "import")
    print(f"floor: `python -c 'import torch'` median {floor:.2f} s; the most a trainer that imports torch "
          f"could read against SB3: {sb3['median_s'] / floor:.2f}x (ours spends {ours['median_s'] - floor:.2f} s "
          "past the import)")
    # The figures a fast CPU cannot inflate (the import floor caps the plain ratio): how far ours ends
    # past the floor, and the share of SB3's time above the floor that ours does not spend.
    past = ours["median_s"] - floor
    saved = 1 - past / (sb3["median_s"] - floor) if sb3["median_s"] > floor else float("nan")
    print(f"above the import floor: ours {past:.2f} s, SB3 {sb3['median_s'] - floor:.2f} s; "
          f"ours saves {saved:.1%} of SB3's time above the floor")
    # What ours spends that is neither the import nor the solve (its loop's own clock): its own imports,
    # set-up, the final checkpoint. Against the import that skips teardown as ours does, which the
    # plain import's floor would flatter.
    bare = statistics.median(r["wall_s"] for r in runs if r["who"] == "import_exit")
    rest = statistics.median(r["wall_s"] - r["train_s"] for r in runs if r["who"] == "ours") - bare
    solve = statistics.median(r["train_s"] for r in runs if r["who"] == "ours")
    print(f"on top of the solve (median {solve:.2f} s in ours' loop): ours {rest:.3f} s past "
          f"`import torch` ended by os._exit (median {bare:.2f} s; the plain import {floor - bare:.2f} s longer)")
    print(f"ratio throughput ours(best)/SB3(8 envs): {best / tp['sb3_8']:.1f}x")
    if args.json:
        print(json.dumps({"runs": runs, "throughput": tp, "ours": ours, "sb3": sb3, "import_floor_s": floor,
                          "ours_past_floor_s": past, "saved_above_floor": saved,
                          "ours_solve_s": solve, "import_exit_s": bare,
                          "ours_past_import_exit_besides_solve_s": rest}))


if __name__ == "__main__":
    main()
