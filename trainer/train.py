"""Train a PPO policy on a batched env: `python -m trainer.train --env snake|cartpole [...]`.

Every hyperparameter is a flag taking one value, spelled with hyphens (`--learning-rate 3e-4`): these
names are the contract with `thrust-remote train --set KEY=VALUE` and the optimizer. Flags not given
take the env's preset (`PRESETS`). Run `python -m trainer.train --help` for the list.

Output (stdout; rank 0 only):
- `THRUST_METRICS {json}` once per report (`--log-interval` seconds, and at the end), the same object
  appended to `<run-dir>/metrics.jsonl`: step, sps, return_mean, length_mean, loss_policy, loss_value,
  entropy, approx_kl, total_steps, plus iteration, wall_s, lr, clipfrac, episodes, (snake) score_mean,
  (CUDA) gpu_mem_gb and gpu_util.
- `THRUST_INFO {json}` for decisions worth seeing (the device, the `--num-envs auto` choice, resume).
- `THRUST_DONE {json}` last: step, total_steps, wall_s, return_mean, eval_return, solved, run_dir,
  checkpoint, export.
- a rich progress bar, only when stdout is a terminal (the lines above print above it, one line each).

Run directory (`--run-dir`, default `runs/<env>-<UTC timestamp>-<pid>`): metrics.jsonl, checkpoints/
(atomic, see trainer.checkpoint), config.json; `--export PATH` writes the ONNX model + manifest.json.

Distributed: under `torchrun --nproc-per-node=N` (WORLD_SIZE > 1) the same entry uses DDP (NCCL on
CUDA, gloo on CPU) with `--dist-timeout` seconds as the process-group timeout; `--num-envs` is the total
over all ranks, split evenly; rank 0 logs and checkpoints; metrics are averaged over ranks. A restart
by `torchrun --max-restarts` resumes from the latest checkpoint automatically (pass `--run-dir` so all
attempts share it; THRUST_TEST_CRASH_AT_STEP=N makes the first attempt checkpoint and exit 1 at step N,
for testing that). Two runs on one host: use `torchrun --standalone` (or
`--rdzv-backend=c10d --rdzv-endpoint=localhost:0`), which picks a free port per run.

`--target-return R` (default 475 for cartpole, off for snake): every `--eval-every` iterations a greedy
evaluation over `--eval-episodes` fresh envs runs (abandoned as soon as R is out of reach, so it is
cheap); at a mean >= R training stops early ("solved": true in THRUST_DONE).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

PROCESS_START = time.time()
# OpenMP workers that spin-wait made 2-thread runs 20x slower when the cores are shared with other
# work; passive waiting costs nothing measurable when they are not. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402 - the start time above includes torch's import

from trainer.checkpoint import load_latest, save_checkpoint  # noqa: E402
from trainer.envs import make_env  # noqa: E402
from trainer.policy import build_policy  # noqa: E402
from trainer.ppo import PPO, PPOConfig, evaluate_greedy  # noqa: E402

# Per-env defaults for flags left unset.
# CartPole: small and fast. Over 20 seeds (greedy eval every 2 iterations) 2 minibatches solved in a
# median 7.9k steps, worst 12.8k: the most robust variant tried (4 minibatches: worst 23.6k; tanh:
# worst 31.7k).
# Snake (10x10): small batches of many cheap updates learned fastest per second on a 2-core CPU:
# greedy eval mean 72 apples (23% full boards) after the default 8M steps (~3 min), vs 19 apples for
# 1024 envs with a 128-wide MLP after 8M. On a GPU, pass a larger --num-envs.
PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "num_envs": 8,
        "num_steps": 32,
        "total_steps": 100_000,
        "learning_rate": 2.5e-3,
        "num_minibatches": 2,
        "update_epochs": 2,
        "clip_coef": 0.2,
        "ent_coef": 0.0,
        "vf_coef": 0.5,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "hidden": 64,
        "target_kl": 0.0,
        "max_grad_norm": 0.5,
        "policy": "mlp",
        "activation": "relu",
        "target_return": 475.0,
    },
    "snake": {
        "num_envs": 128,
        "num_steps": 32,
        "total_steps": 8_000_000,
        "learning_rate": 2e-3,
        "num_minibatches": 4,
        "update_epochs": 2,
        "clip_coef": 0.2,
        "ent_coef": 0.01,
        "vf_coef": 0.5,
        "gamma": 0.99,
        "gae_lambda": 0.95,
        "hidden": 64,
        "target_kl": 0.0,
        "max_grad_norm": 0.5,
        "policy": "mlp",
        "activation": "relu",
        "target_return": 0.0,
    },
}

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 64


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _int(text: str) -> int:
    """An integer, also written as 2e7 or 20_000_000 (configs and optimizers produce both)."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(value)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n")[0])
    a = p.add_argument
    # Switches also take one value (`--resume true`), since `thrust-remote train --set resume=true`
    # passes every job arg as `--key value`.
    flag: dict[str, Any] = {"nargs": "?", "const": True, "default": False, "type": _bool, "metavar": "BOOL"}
    a("--env", choices=sorted(PRESETS), required=True, help="which environment")
    a("--num-envs", default=None, help="total envs over all ranks, or 'auto' (sized from device memory)")
    a("--total-steps", type=_int, default=None, help="env steps to train for (all ranks together)")
    a("--device", choices=("auto", "cpu", "cuda"), default="auto")
    a("--seed", type=_int, default=1)
    a("--run-dir", default=None, help="default runs/<env>-<UTC timestamp>-<pid>")
    a("--resume", **flag, help="continue from the latest checkpoint in --run-dir, if any")
    a("--export", default=None, metavar="PATH", help="write the final policy as ONNX (+ manifest.json)")
    a("--policy", choices=("mlp", "cnn"), default=None)
    a("--activation", choices=("tanh", "relu", "silu"), default=None, help="MLP activation")
    a("--learning-rate", type=float, default=None)
    a("--num-steps", type=_int, default=None, help="rollout length per env per iteration")
    a("--num-minibatches", type=_int, default=None)
    a("--update-epochs", type=_int, default=None)
    a("--clip-coef", type=float, default=None)
    a("--ent-coef", type=float, default=None)
    a("--vf-coef", type=float, default=None)
    a("--gamma", type=float, default=None)
    a("--gae-lambda", type=float, default=None)
    a("--hidden", type=_int, default=None, help="network width")
    a("--grid-size", type=_int, default=10, help="snake board side")
    a("--action-mode", choices=("relative", "absolute"), default="relative", help="snake actions")
    a("--target-kl", type=float, default=None, help="early-stop epochs above this KL; 0 = off")
    a("--max-grad-norm", type=float, default=None)
    a("--anneal-lr", type=_int, choices=(0, 1), default=1, help="1: linear LR decay to 0")
    a("--target-return", type=float, default=None, help="stop when greedy eval reaches this; 0 = off")
    a("--eval-episodes", type=_int, default=20)
    a("--eval-every", type=_int, default=2, help="iterations between --target-return checks")
    a("--log-interval", type=float, default=1.0, help="seconds between THRUST_METRICS reports")
    a("--checkpoint-interval", type=float, default=120.0, help="seconds between checkpoints")
    a("--threads", type=_int, default=0, help="torch CPU threads; 0 = 1 on CPU (see main), torch's default on CUDA")
    a("--dist-timeout", type=float, default=600.0, help="process-group timeout, seconds")
    a("--tensorboard", **flag, help="also write TensorBoard event files (needs tensorboard)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    for key, value in PRESETS[args.env].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


# ----------------------------------------------------------------------------------------- helpers
class Dist:
    """Rank facts, and the few collectives the loop needs (no-ops in a single process)."""

    def __init__(self, timeout_s: float, want_cuda: bool) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.enabled = self.world > 1
        self.backend = "nccl" if want_cuda else "gloo"
        self.device = torch.device(f"cuda:{self.local_rank}" if want_cuda else "cpu")
        if self.enabled:
            import torch.distributed as dist

            if want_cuda:
                torch.cuda.set_device(self.local_rank)
            timeout = timedelta(seconds=timeout_s)
            # torchrun keeps one store across restarts; keys of a dead attempt (gloo's peer addresses)
            # were read by the next attempt ("connectFullMesh ... Connection refused"). A prefix per
            # attempt keeps each attempt's keys apart.
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                self.world,
                is_master=self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
                timeout=timeout,
            )
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore(f"thrust-attempt-{self.restart_count}", store),
                rank=self.rank,
                world_size=self.world,
                timeout=timeout,
            )
            self._dist = dist

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, returned on `t`'s device. NCCL reduces only CUDA tensors: move there."""
        if not self.enabled:
            return t
        work = t.to(self.device, dtype=torch.float64 if t.is_floating_point() else t.dtype, copy=True)
        self._dist.all_reduce(work)
        return work.to(t.device, t.dtype)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.sum(t) / self.world if self.enabled else t

    def broadcast_str(self, value: str) -> str:
        if not self.enabled:
            return value
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            self._dist.barrier()

    def close(self) -> None:
        if self.enabled:
            self._dist.destroy_process_group()


def choose_num_envs(args: argparse.Namespace, device: torch.device, world: int) -> tuple[int, str]:
    """`--num-envs auto`: the preset on CPU; on CUDA a power of two using ~1/4 of free memory."""
    if device.type != "cuda":
        return int(PRESETS[args.env]["num_envs"]), "cpu: the preset"
    free, _total = torch.cuda.mem_get_info(device)
    obs_dim = 4 if args.env == "cartpole" else 3 * args.grid_size**2 + 8
    # Rollout storage (obs + final obs) dominates; x3 covers activations of the update minibatches.
    per_env = args.num_steps * (2 * obs_dim + 12) * 4 * 3
    n = 2 ** int(math.log2(max(free // 4 // per_env, 1)))
    n = max(1024, min(n, 1 << 20)) * world
    return n, f"cuda: {free / 2**30:.1f} GiB free, ~{per_env} B per env"


def gpu_fields(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    out: dict[str, Any] = {"gpu_mem_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}
    with contextlib.suppress(Exception):  # needs pynvml; the field is optional
        out["gpu_util"] = torch.cuda.utilization(device)
    return out


def emit(tag: str, obj: dict[str, Any]) -> None:
    """One machine-readable line on stdout: `TAG {json}` (the documented output of this CLI)."""
    sys.stdout.write(f"{tag} {json.dumps(obj, separators=(', ', ': '))}\n")
    sys.stdout.flush()


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


# -------------------------------------------------------------------------------------------- main
def _trim_metrics(path: Path, step: int) -> None:
    """After a resume from `step`, drop the rows a crashed attempt logged past it, so the file's steps
    only ever go up (the page draws it as one curve). Atomic: temp file + os.replace."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{row}\n" for row in kept))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.grid_size < 4:
        print("--grid-size must be >= 4", file=sys.stderr)
        return EXIT_USAGE
    for flag in ("eval_every", "num_minibatches", "update_epochs", "num_steps"):
        if getattr(args, flag) < 1:
            print(f"--{flag.replace('_', '-')} must be >= 1", file=sys.stderr)
            return EXIT_USAGE
    writer = None
    if args.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            print(
                "--tensorboard needs the tensorboard package: pip install 'thrust-remote[tensorboard]'",
                file=sys.stderr,
            )
            return EXIT_FAILED
    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: CUDA is not available here", file=sys.stderr)
        return EXIT_FAILED
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    dist = Dist(args.dist_timeout, use_cuda)
    device = torch.device(f"cuda:{dist.local_rank}" if use_cuda else "cpu")

    auto_note = None
    if args.num_envs in (None, "auto"):
        total_envs, auto_note = choose_num_envs(args, device, dist.world)
    else:
        try:
            total_envs = _int(str(args.num_envs))
        except argparse.ArgumentTypeError as e:
            print(f"--num-envs: {e} (or 'auto')", file=sys.stderr)
            return EXIT_USAGE
    if total_envs < dist.world:
        print(f"--num-envs {total_envs} is fewer than the {dist.world} ranks", file=sys.stderr)
        return EXIT_USAGE
    if total_envs % dist.world:
        print(f"--num-envs {total_envs} does not split evenly over {dist.world} ranks", file=sys.stderr)
        return EXIT_USAGE
    num_envs = total_envs // dist.world
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    elif device.type == "cpu":
        # One thread by default: as fast as two for small batches, and when the cores are shared with
        # other work, OpenMP workers spin-waiting on each other made a 2-thread run ~20x slower here.
        torch.set_num_threads(1)

    run_dir = Path(args.run_dir) if args.run_dir else None
    if run_dir is None and (args.resume or dist.restart_count > 0):
        # a fresh default directory has nothing to resume: training from 0 would be a silent surprise
        print("--resume (and torchrun --max-restarts) needs --run-dir: the run directory to continue",
              file=sys.stderr)
        return EXIT_USAGE
    if run_dir is None:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        # The pid keeps two runs started in the same second apart.
        run_dir = Path(dist.broadcast_str(f"runs/{args.env}-{stamp}-{os.getpid()}"))
    ckpt_dir = run_dir / "checkpoints"
    if dist.is_main:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()

    config = {k: v for k, v in vars(args).items()}
    config.update(num_envs=total_envs, world_size=dist.world, device=str(device))
    env = make_env(
        args.env,
        num_envs,
        device=device,
        grid_size=args.grid_size,
        **({"action_mode": args.action_mode} if args.env == "snake" else {}),
    )
    torch.manual_seed(args.seed)
    policy = build_policy(
        args.policy,
        env.obs_dim,
        env.n_actions,
        args.hidden,
        grid_size=args.grid_size if args.env == "snake" else None,
        activation=args.activation,
    ).to(device)
    cfg = PPOConfig(
        num_envs=num_envs,
        num_steps=args.num_steps,
        learning_rate=args.learning_rate,
        anneal_lr=bool(args.anneal_lr),
        gamma=args.gamma,
        gae_lambda=args.gae_lambda,
        num_minibatches=args.num_minibatches,
        update_epochs=args.update_epochs,
        clip_coef=args.clip_coef,
        ent_coef=args.ent_coef,
        vf_coef=args.vf_coef,
        max_grad_norm=args.max_grad_norm,
        target_kl=args.target_kl if args.target_kl and args.target_kl > 0 else None,
    )
    train_model = policy
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        train_model = DistributedDataParallel(policy, device_ids=[device.index] if use_cuda else None)
    ppo = PPO(env, policy, cfg, train_model=train_model, kl_reduce=dist.mean if dist.enabled else None)

    batch_per_iter = num_envs * cfg.num_steps * dist.world
    num_iterations = max(1, math.ceil(args.total_steps / batch_per_iter))
    global_step, start_iteration = 0, 0
    resumed_rng: dict[str, Any] | None = None
    if args.resume or dist.restart_count > 0:
        loaded = load_latest(ckpt_dir)
        if loaded is not None:
            state, path = loaded
            for key in ("env", "policy", "hidden", "grid_size", "activation", "action_mode"):
                if state["config"].get(key) != config.get(key):
                    print(
                        f"--resume: checkpoint {path} has {key}={state['config'].get(key)!r}, "
                        f"this run {config.get(key)!r}",
                        file=sys.stderr,
                    )
                    return EXIT_USAGE
            policy.load_state_dict(state["model"])
            ppo.optimizer.load_state_dict(state["optimizer"])
            global_step = int(state["step"])
            # Counted in this run's iterations, so the LR schedule is right even if --num-envs changed.
            start_iteration = global_step // batch_per_iter
            resumed_rng = state if dist.world == state.get("world_size") else None
            if dist.is_main:
                emit("THRUST_INFO", {"resumed_from": str(path), "step": global_step})
    # Different action noise and env streams per rank. Episodes in progress are not saved: a resumed
    # run starts fresh episodes, then continues rank 0's saved random streams.
    torch.manual_seed(args.seed + 7919 * dist.rank + global_step)
    ppo.start(seed=args.seed * 1000 + dist.rank + global_step)
    if resumed_rng is not None and dist.is_main:
        torch.set_rng_state(resumed_rng["torch_rng"])
        env.generator.set_state(resumed_rng["env_rng"])
        if use_cuda and resumed_rng.get("cuda_rng"):
            torch.cuda.set_rng_state(resumed_rng["cuda_rng"][device.index or 0], device)

    if dist.is_main:
        info: dict[str, Any] = {
            "device": str(device),
            "world_size": dist.world,
            "num_envs": total_envs,
            "run_dir": str(run_dir),
            "threads": torch.get_num_threads(),
        }
        if auto_note:
            info["num_envs_auto"] = auto_note
        emit("THRUST_INFO", info)
        (run_dir / "config.json").write_text(json.dumps(config, indent=2, default=str) + "\n")
        if args.tensorboard:
            writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
    if dist.is_main and global_step > 0:
        _trim_metrics(run_dir / "metrics.jsonl", global_step)
    metrics_file = open(run_dir / "metrics.jsonl", "a") if dist.is_main else None  # noqa: SIM115

    stop_signal: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        stop_signal.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # Ctrl-C too: stop at the iteration's end, checkpoint first
    stop_agreed = False  # every rank leaves the loop at the same iteration (a rank alone would hang the rest)

    progress = None
    if dist.is_main and sys.stdout.isatty():
        from rich.console import Console
        from rich.progress import Progress

        # The bar stays at the bottom and our lines print above it; soft_wrap keeps rich from
        # re-wrapping the THRUST_* lines to the terminal width (they must stay one line each).
        progress = Progress(console=Console(soft_wrap=True, highlight=False))
        progress.start()
        task = progress.add_task(f"{args.env}", total=num_iterations * batch_per_iter, completed=global_step)

    eval_env = None
    if args.target_return and args.target_return > 0:
        eval_env = make_env(
            args.env,
            args.eval_episodes,
            device=device,
            grid_size=args.grid_size,
            **({"action_mode": args.action_mode} if args.env == "snake" else {}),
        )

    def checkpoint(iteration: int) -> Path | None:
        if not dist.is_main:
            return None
        state = {
            "model": policy.state_dict(),
            "optimizer": ppo.optimizer.state_dict(),
            "step": global_step,
            "iteration": iteration,
            "config": config,
            "world_size": dist.world,
            "torch_rng": torch.get_rng_state(),
            "env_rng": env.generator.get_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if use_cuda else [],
        }
        return save_checkpoint(ckpt_dir, state, global_step)

    window = {"steps": 0, "t": time.time(), "ret": 0.0, "len": 0.0, "score": 0.0, "n": 0.0}
    last_ckpt_t = time.time()
    crash_at = int(os.environ.get("THRUST_TEST_CRASH_AT_STEP", "0"))
    last_metrics: dict[str, Any] = {}
    eval_return: float | None = None
    solved = False
    iteration = start_iteration
    losses: dict[str, float] = {}
    while iteration < num_iterations and not solved and not stop_agreed:
        ppo.collect()
        losses = ppo.update(ppo.lr_at(iteration, num_iterations))
        iteration += 1
        global_step += batch_per_iter
        # the stop flag rides along with the episode stats' reduction: one collective, same answer everywhere
        local = [*ppo.pop_episode_stats(), 1.0 if stop_signal else 0.0]
        ep = dist.sum(torch.tensor(local)).tolist() if dist.enabled else local
        stop_agreed = ep.pop() > 0
        window["steps"] += batch_per_iter
        for k, v in zip(("ret", "len", "score", "n"), ep, strict=True):
            window[k] += v
        now = time.time()
        last_iter = iteration >= num_iterations
        if eval_env is not None and iteration % args.eval_every == 0:
            # A cheap check: the evaluation gives up as soon as the target is out of reach.
            scores = evaluate_greedy(
                policy,
                eval_env,
                args.eval_episodes,
                seed=args.seed + 10_000 + iteration,
                target=args.target_return,
                max_return=eval_env.max_return,
            )
            eval_return = float(dist.mean(scores.mean()))
            solved = eval_return >= args.target_return
        if dist.enabled:
            # Every iteration on every rank: collectives must not depend on a rank's own clock.
            loss_t = dist.mean(torch.tensor([losses[k] for k in sorted(losses)]))
            losses = dict(zip(sorted(losses), loss_t.tolist(), strict=True))
        if dist.is_main and (now - window["t"] >= args.log_interval or last_iter or solved):
            n = window["n"]
            last_metrics = {
                "step": global_step,
                "sps": round(window["steps"] / max(now - window["t"], 1e-9), 1),
                "return_mean": _finite(window["ret"] / n) if n else None,
                "length_mean": _finite(window["len"] / n) if n else None,
                "loss_policy": losses["loss_policy"],
                "loss_value": losses["loss_value"],
                "entropy": losses["entropy"],
                "approx_kl": losses["approx_kl"],
                "total_steps": num_iterations * batch_per_iter,
                "iteration": iteration,
                "wall_s": round(now - PROCESS_START, 3),
                "lr": ppo.optimizer.lr,
                "clipfrac": losses["clipfrac"],
                "episodes": int(n),
            }
            if args.env == "snake":
                last_metrics["score_mean"] = window["score"] / n if n else None
            if eval_return is not None:
                last_metrics["eval_return"] = eval_return
            last_metrics.update(gpu_fields(device))
            emit("THRUST_METRICS", last_metrics)
            assert metrics_file is not None
            metrics_file.write(json.dumps(last_metrics) + "\n")
            metrics_file.flush()
            if writer is not None:
                for k, v in last_metrics.items():
                    if isinstance(v, (int, float)) and k != "step":
                        writer.add_scalar(k, v, global_step)
            if n:
                window.update(steps=0, t=now, ret=0.0, len=0.0, score=0.0, n=0.0)
            else:
                window.update(steps=0, t=now)
            if progress is not None:
                progress.update(task, completed=global_step)
        if dist.is_main and now - last_ckpt_t >= args.checkpoint_interval:
            checkpoint(iteration)
            last_ckpt_t = now
        if crash_at and dist.restart_count == 0 and global_step >= crash_at:
            # Fault injection for the `torchrun --max-restarts` test: checkpoint, then die.
            checkpoint(iteration)
            dist.barrier()
            dist.close()
            os._exit(1)
    ckpt_path = checkpoint(iteration)
    if progress is not None:
        progress.stop()
    export_path = None
    export_error = None
    if dist.is_main and args.export:
        from trainer.export import ExportError, export_onnx

        try:
            export_path = str(
                export_onnx(
                    policy,
                    args.export,
                    env_name=args.env,
                    grid_size=args.grid_size if args.env == "snake" else None,
                    action_mode=args.action_mode if args.env == "snake" else None,
                    policy_kind=args.policy,
                    steps=global_step,
                    final_return=last_metrics.get("return_mean"),
                )
            )
        except ExportError as e:  # the checkpoint is saved; say what failed and fail the job
            export_error = str(e)
            print(f"export failed: {e}", file=sys.stderr)
    if dist.is_main:
        emit(
            "THRUST_DONE",
            {
                "step": global_step,
                "total_steps": num_iterations * batch_per_iter,
                "wall_s": round(time.time() - PROCESS_START, 3),
                "return_mean": last_metrics.get("return_mean"),
                "eval_return": eval_return,
                "solved": solved,
                "run_dir": str(run_dir),
                "checkpoint": str(ckpt_path) if ckpt_path else None,
                "export": export_path,
                "stopped_by_signal": stop_signal[0] if stop_signal else (int(signal.SIGTERM) if stop_agreed else None),
                "export_error": export_error,
            },
        )
        if metrics_file is not None:
            metrics_file.close()
        if writer is not None:
            writer.close()
    dist.close()
    if stop_signal:
        return 128 + stop_signal[0]
    if stop_agreed:  # another rank was signalled: this one stopped with it
        return 128 + signal.SIGTERM
    return EXIT_FAILED if export_error else EXIT_OK


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (~0.25 s of torch module cleanup on a small CPU): everything this
    # process wrote is already flushed, fsynced (checkpoints) or closed (metrics.jsonl).
    os._exit(code)
