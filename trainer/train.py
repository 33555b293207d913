"""Train a PPO policy on a batched env: `python -m trainer.train --env snake|cartpole|GYM_ID [...]`.

`--env` also takes a gymnasium id with a discrete action space and a flat Box observation
(`CartPole-v1`, `Acrobot-v1`): gymnasium's vector env, `--vector sync|async` (trainer/envs/gym.py).

Every hyperparameter is a flag taking one value, spelled with hyphens (`--learning-rate 3e-4`): these
names are the contract with `thrust-remote train --set KEY=VALUE` and the optimizer. They are the
fields of `trainer.args.TrainArgs`; flags not given take the env's preset (`trainer.args.PRESETS`),
else TrainArgs' default. Run `python -m trainer.train --help` for the list. A value out of a flag's
range exits 64 (usage); a bad type or choice exits 2 (argparse).

Output (stdout; rank 0 only):
- `THRUST_METRICS {json}` once per report (`--log-interval` seconds, and at the end), the same object
  appended to `<run-dir>/metrics.jsonl`: step, sps, return_mean, length_mean, loss_policy, loss_value,
  entropy, approx_kl, total_steps, plus iteration, wall_s, lr, clipfrac, episodes, (snake) score_mean,
  (CUDA) gpu_mem_gb and gpu_util.
- `THRUST_INFO {json}` for decisions worth seeing (the device, the `--num-envs auto` choice, precision,
  compile, the optimizer's class, resume).
- `THRUST_DONE {json}` last: step, total_steps, wall_s (since the process started), train_s (of them, in
  the training loop: iterations and evaluations), return_mean, eval_return, solved, run_dir, checkpoint,
  export; with `--candidates`/`--snapshots` also held_out (the kept policy's score on the
  held-out games, and its step), candidate and candidates (every candidate's score).
- `solved: eval return R >= TARGET at step S of TOTAL, stopping early`, a plain line (no tag), when
  `--target-return` is reached.
- a rich progress bar, only when stdout is a terminal (the lines above print above it, one line each).

Run directory (`--run-dir`, default `runs/<env>-<UTC timestamp>-<pid>`): metrics.jsonl, checkpoints/
(atomic, see trainer.checkpoint), config.json; `--export PATH` writes the ONNX model + manifest.json.
With `--candidates K` (trainer/candidates.py) candidates 1..K-1 train beside the run in
candidates/<k>/ (their output in its train.log); the run's reports are candidate 0's, and at the end
a plain `candidates over N held-out greedy games: ...; keeping candidate k` line and THRUST_DONE's
`candidates` say which one its last checkpoint and export hold.

Distributed: under `torchrun --nproc-per-node=N` (WORLD_SIZE > 1) the same entry uses DDP (NCCL on
CUDA, gloo on CPU) with `--dist-timeout` seconds as the process-group timeout; `--num-envs` is the total
over all ranks, split evenly; rank 0 logs and checkpoints; metrics are averaged over ranks. A restart
by `torchrun --max-restarts` resumes from the latest checkpoint automatically (pass `--run-dir` so all
attempts share it; THRUST_TEST_CRASH_AT_STEP=N makes the first attempt checkpoint and exit 1 at step N,
for testing that). Two runs on one host: use `torchrun --standalone` (or
`--rdzv-backend=c10d --rdzv-endpoint=localhost:0`), which picks a free port per run.

`--target-return R` (default 475 for cartpole, a gymnasium id's `reward_threshold`, off for snake):
every `--eval-every` iterations a greedy evaluation over `--eval-episodes` fresh envs runs (abandoned as
soon as R is out of reach, so it is cheap); at a mean >= R training stops early ("solved": true in THRUST_DONE).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PROCESS_START = time.time()
# OpenMP workers that spin-wait made 2-thread runs 20x slower when the cores are shared with other
# work; passive waiting costs nothing measurable when they are not. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

if __name__ == "__main__":
    # The command line is checked before torch loads (~2 s of a start): a mistyped flag or value and
    # --help answer at once (a `--set` typo, an optimize trial given a bad value). main() parses again.
    from trainer.args import UsageError as _EarlyUsage
    from trainer.args import parse_args as _early_parse

    try:
        _early_parse(sys.argv[1:])
    except _EarlyUsage as _refused:
        print(_refused, file=sys.stderr)
        sys.exit(64)  # EXIT_USAGE below

import torch  # noqa: E402 - the start time above includes torch's import

from trainer import candidates, population  # noqa: E402
from trainer.args import PRESETS, TrainArgs, UsageError, build_parser, flag_specs, parse_args  # noqa: E402
from trainer.checkpoint import load_start, save_checkpoint  # noqa: E402
from trainer.dist import Dist  # noqa: E402
from trainer.envs.registry import EnvSpec, close_env, get_spec  # noqa: E402
from trainer.gym_ids import GymEnvError  # noqa: E402
from trainer.policy import build_policy, compile_mode, compile_policy, load_weights  # noqa: E402
from trainer.ppo import LOSS_NAMES, PPO, PPOConfig, autocast, evaluate_greedy  # noqa: E402
from trainer.report import RunLog, Window, emit, finite, gpu_fields, say  # noqa: E402

# build_parser and PRESETS stay importable from here (tests/test_optimize.py reads the flags).
__all__ = ["PRESETS", "Trainer", "build_parser", "main", "parse_args"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 64


class TrainError(Exception):
    """Ends the run before training starts: the message goes to stderr, the process exits `code`."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------------------ setup
def choose_num_envs(args: TrainArgs, obs_dim: int, device: torch.device, world: int) -> tuple[int, str]:
    """`--num-envs auto`: the preset on CPU or for a gymnasium id (stepped in Python); on CUDA a power
    of two using ~1/4 of free memory."""
    if device.type != "cuda":
        return int(flag_specs(args.env)["num-envs"].default), "cpu: the preset"
    if args.env not in PRESETS:
        return int(flag_specs(args.env)["num-envs"].default), "gymnasium env: the preset"
    free, _total = torch.cuda.mem_get_info(device)
    # Rollout storage (obs + final obs) dominates; x3 covers activations of the update minibatches.
    per_env = args.num_steps * (2 * obs_dim + 12) * 4 * 3
    n = 2 ** int(math.log2(max(free // 4 // per_env, 1)))
    n = max(1024, min(n, 1 << 20)) * world
    return n, f"cuda: {free / 2**30:.1f} GiB free, ~{per_env} B per env"


def check_environment(args: TrainArgs) -> Any:
    """The SummaryWriter class when --tensorboard (else None); TrainError when the flags ask for what
    this machine lacks."""
    writer_cls = None
    if args.tensorboard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise TrainError(
                "--tensorboard needs the tensorboard package: pip install 'thrust-remote[tensorboard]'", EXIT_FAILED
            ) from None
        writer_cls = SummaryWriter
    if args.device == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda: CUDA is not available here", EXIT_FAILED)
    return writer_cls


def split_envs(args: TrainArgs, obs_dim: int, device: torch.device, world: int) -> tuple[int, str | None]:
    """(total envs over all ranks, the note on an `auto` choice); each rank steps total / world."""
    auto_note = None
    if args.num_envs == "auto":
        total, auto_note = choose_num_envs(args, obs_dim, device, world)
    else:
        total = int(args.num_envs)
    if total < world:
        raise TrainError(f"--num-envs {total} is fewer than the {world} ranks", EXIT_USAGE)
    if total % world:
        raise TrainError(f"--num-envs {total} does not split evenly over {world} ranks", EXIT_USAGE)
    return total, auto_note


def set_threads(args: TrainArgs, device: torch.device) -> None:
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    elif device.type == "cpu":
        # One thread by default: as fast as two for small batches, and when the cores are shared with
        # other work, OpenMP workers spin-waiting on each other made a 2-thread run ~20x slower here.
        torch.set_num_threads(1)


def choose_run_dir(args: TrainArgs, dist: Dist) -> Path:
    if args.run_dir:
        return Path(args.run_dir)
    if args.resume or dist.restart_count > 0:
        # a fresh default directory has nothing to resume: training from 0 would be a silent surprise
        raise TrainError("--resume (and torchrun --max-restarts) needs --run-dir: the run directory to continue",
                         EXIT_USAGE)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    # The pid keeps two runs started in the same second apart.
    return Path(dist.broadcast_str(f"runs/{args.env}-{stamp}-{os.getpid()}"))


def agree(dist: Dist, stats: torch.Tensor, losses: torch.Tensor, stop: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(episode sums over all ranks, losses averaged over ranks, whether any rank must stop).

    Under DDP, one collective per iteration on every rank (never on a rank's own clock) carries all
    three; reading the stop flag is the iteration's host sync there: every rank must leave the loop at
    the same iteration. In one process: the tensors as they are, and no sync."""
    if not dist.enabled:
        return stats, losses, stop
    total = dist.sum(torch.cat((stats, stats.new_full((1,), float(stop)), losses)))
    return total[:4], total[5:] / dist.world, bool(total[4] > 0)


def compile_for_run(policy: torch.nn.Module, env: Any, device: torch.device, precision: str) -> torch.nn.Module:
    """--compile: the compiled policy, and the env's step compiled where the env can (`compile_step`;
    CartPole and gymnasium envs stay eager). torch.compile works lazily, so both run once here: a
    machine that cannot compile (inductor on CPU needs a C++ compiler) stops before training with a
    TrainError, not a traceback mid-run. The caller resets the env afterwards (`Trainer._seed`), so
    the warm-up step leaves no trace."""
    mode = compile_mode(device)
    compiled = compile_policy(policy, device)
    compile_step = getattr(env, "compile_step", None)
    try:
        if compile_step is not None:
            compile_step(mode)
            env.reset(seed=0)
            env.step(torch.zeros(env.num_envs, dtype=torch.int64, device=device))
        with torch.no_grad(), autocast(device, precision):
            compiled(torch.zeros(env.num_envs, env.obs_dim, device=device))
    except Exception as e:  # noqa: BLE001 - any failure of the compiler stack means the same to the user
        why = (str(e).strip().splitlines() or [""])[0][:300]
        raise TrainError(
            f"--compile: torch.compile failed on {device.type} ({type(e).__name__}: {why}). "
            "On CPU, inductor needs a working C++ compiler (g++ or clang++; CXX names it); "
            "or train without --compile",
            EXIT_FAILED,
        ) from None
    return compiled


def check_fits(state: dict[str, Any], path: Path, config: dict[str, Any], keys: tuple[str, ...]) -> None:
    """TrainError (usage) unless the checkpoint's settings that shape the network (or the env it reads)
    are this run's. A setting newer than the checkpoint (snake's `space`) had its default then."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainArgs)}
    for key in keys:
        theirs = state["config"].get(key, defaults.get(key))
        if theirs != config.get(key):
            message = (
                f"--resume: checkpoint {path} has {key}={theirs!r}, this run {config.get(key)!r}"
                f" (pass --{key.replace('_', '-')} {theirs} to continue it)"
            )
            raise TrainError(message, EXIT_USAGE)


# ---------------------------------------------------------------------------------------- trainer
def refuse_unfit(args: TrainArgs, spec: Any, mask_at: int | None) -> None:
    """Exit 64 for a flag the env has nothing to act on: --mask without danger values, --point-gamma
    without a score, --death-cost without lost episodes."""
    if args.mask and mask_at is None:
        raise TrainError(f"--mask 1: {args.env} has no danger values to mask by (snake with relative actions has)",
                         EXIT_USAGE)
    if args.point_gamma != 1 and spec.score is None:
        raise TrainError(f"--point-gamma {args.point_gamma:g}: {args.env} has no score whose points could discount "
                         "(snake's apples are)", EXIT_USAGE)
    if args.death_cost != 1 and spec.lost is None:
        raise TrainError(f"--death-cost {args.death_cost:g}: {args.env} has no lost episodes to cost more (snake's "
                         "deaths are)", EXIT_USAGE)


class Trainer:
    """One training run: `setup()` builds it (or raises TrainError), `loop()` trains, `finish()` saves
    the last checkpoint, exports, prints THRUST_DONE and returns the exit code."""

    def __init__(self, args: TrainArgs) -> None:
        self.args = args = candidates.resolved(args)  # --candidates auto: a number from here on
        self.spec: EnvSpec = get_spec(args.env)
        self.params = self.spec.params(vars(args))
        self.settings = self.spec.settings_of(self.params)
        self.global_step = self.iteration = 0
        self.stop_signal: list[int] = []
        # every rank leaves the loop at the same iteration (a rank alone would hang the rest)
        self.stop_agreed = False
        self.solved = False
        self.train_s = 0.0  # seconds in `loop` (THRUST_DONE, set by `main`): of the time from process start
        self.eval_return: float | None = None
        self.eval_env: Any = None
        self.losses: torch.Tensor | None = None  # the last update's mean losses (LOSS_NAMES), on the device
        self.last_metrics: dict[str, Any] = {}
        self.log: RunLog | None = None  # rank 0 only
        self.chooser: candidates.Chooser | None = None  # --candidates / --snapshots (rank 0)
        self.exchange: population.Exchange | None = None  # --exploit-at among --candidates
        self.resumed_exchanged = False  # the checkpoint resumed from was saved after its exchange

    def setup(self) -> None:
        args = self.args
        writer_cls = check_environment(args)
        self.use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        if args.candidates > 1 and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # before joining the group
            raise TrainError("--candidates runs its trainings side by side, one process each: not under torchrun "
                             "(pass --candidates 1 there)", EXIT_USAGE)
        self.dist = dist = Dist(args.dist_timeout, self.use_cuda)
        self.device = torch.device(f"cuda:{dist.local_rank}" if self.use_cuda else "cpu")
        self.total_envs, auto_note = split_envs(args, self.spec.obs_dim(self.params), self.device, dist.world)
        self.num_envs = self.total_envs // dist.world
        set_threads(args, self.device)
        self.run_dir = choose_run_dir(args, dist)
        self.ckpt_dir = self.run_dir / "checkpoints"
        if dist.is_main:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        self.config = dict(vars(args))
        self.config.update(num_envs=self.total_envs, world_size=dist.world, device=str(self.device))
        self._build()
        resumed_rng = self._resume() if args.resume or args.resume_from or dist.restart_count > 0 else None
        self._seed(resumed_rng)
        if dist.is_main:
            announce(self, auto_note)
            self.log = RunLog(self.run_dir, writer_cls, self.global_step)
        self._install_signals()
        total = self.num_iterations * self.batch_per_iter
        if self.log is not None:
            self.log.start_progress(f"{args.env}", total=total, completed=self.global_step)
        if args.target_return:  # 0 = off; below 0 is a target too (Acrobot-v1: -100)
            self.eval_env = self.spec.make(args.eval_episodes, self.device, **self.settings)
        if dist.is_main:  # the exchange first: a fresh run clears an earlier one's files before its children start
            self.exchange = population.exchange_for(args, self.run_dir, total, candidates.held_out_seed(args),
                                                    self.global_step, self.batch_per_iter, self.resumed_exchanged)
            self.chooser = candidates.Chooser(args, self.run_dir, total)

    def _build(self) -> None:
        """The env batch, the policy, PPO (the policy wrapped in DDP across ranks)."""
        args, dist = self.args, self.dist
        self.env = self.spec.make(self.num_envs, self.device, **self.settings, **self.spec.run_options(args))
        mask_at = self.spec.mask_at(self.params) if args.mask else None
        refuse_unfit(args, self.spec, mask_at)
        torch.manual_seed(args.seed)
        self.policy = build_policy(
            args.policy,
            self.env.obs_dim,
            self.env.n_actions,
            args.hidden,
            grid_size=self.spec.cnn_grid(self.params),
            activation=args.activation,
            mask_at=mask_at,
        ).to(self.device)
        cfg = PPOConfig.from_args(args, self.num_envs)
        # --compile: the compiled wrapper runs collect and update; it shares the plain policy's weights,
        # which checkpoints and the export read.
        act_model = compile_for_run(self.policy, self.env, self.device, args.precision) if args.compile else self.policy
        train_model = act_model
        if dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            device_ids = [self.device.index] if self.use_cuda else None
            train_model = DistributedDataParallel(act_model, device_ids=device_ids)
        kl_reduce = dist.mean if dist.enabled else None
        self.ppo = PPO(self.env, self.policy, cfg, train_model=train_model, kl_reduce=kl_reduce,
                       score=self.spec.score, act_model=act_model, lost=self.spec.lost)
        self.batch_per_iter = self.num_envs * cfg.num_steps * dist.world
        self.num_iterations = max(1, math.ceil(args.total_steps / self.batch_per_iter))

    def _resume(self) -> dict[str, Any] | None:
        """Load the latest checkpoint, if any; its state when its random streams fit this run. Rank 0
        reads it and hands it to every rank: over several hosts only node 0 has the checkpoints."""
        loaded = self.dist.broadcast(load_start(self.ckpt_dir, self.args.resume_from) if self.dist.is_main else None)
        if loaded is None:
            return None
        if isinstance(loaded, str):  # rank 0 could not read --resume-from: every rank stops with its reason
            raise TrainError(loaded, EXIT_USAGE)
        state, path = loaded
        check_fits(state, path, self.config, ("env", "policy", "hidden", "activation", "mask", *self.spec.settings))
        try:
            fits = f"this run's {self.args.env} observation ({self.env.obs_dim} values)"
            load_weights(self.policy, state["model"], fits)
        except ValueError as e:
            raise TrainError(f"--resume: checkpoint {path}: {e}; train it again without --resume", EXIT_USAGE) from None
        self.ppo.optimizer.load_state_dict(state["optimizer"])
        self.global_step = int(state["step"])
        self.resumed_exchanged = bool(state.get(population.EXCHANGED, False))
        # Counted in this run's iterations, so the LR schedule is right even if --num-envs changed.
        self.iteration = self.global_step // self.batch_per_iter
        if self.dist.is_main:
            emit("THRUST_INFO", {"resumed_from": str(path), "step": self.global_step})
        return state if self.dist.world == state.get("world_size") else None

    def _seed(self, resumed_rng: dict[str, Any] | None) -> None:
        # Different action noise and env streams per rank. Episodes in progress are not saved: a
        # resumed run starts fresh episodes, then continues rank 0's saved random streams.
        args, rank = self.args, self.dist.rank
        torch.manual_seed(args.seed + 7919 * rank + self.global_step)
        self.ppo.start(seed=args.seed * 1000 + rank + self.global_step)
        if resumed_rng is not None and self.dist.is_main:
            torch.set_rng_state(resumed_rng["torch_rng"])
            self.env.generator.set_state(resumed_rng["env_rng"])
            if self.use_cuda and resumed_rng.get("cuda_rng"):
                torch.cuda.set_rng_state(resumed_rng["cuda_rng"][self.device.index or 0], self.device)

    def _install_signals(self) -> None:
        def on_signal(signum: int, _frame: Any) -> None:
            self.stop_signal.append(signum)
            if self.chooser is not None:
                self.chooser.stop(signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)  # Ctrl-C too: stop at the iteration's end, checkpoint first

    # --------------------------------------------------------------------------------------- loop
    def loop(self) -> None:
        args, dist = self.args, self.dist
        self.window = Window(time.time(), self.device)
        last_ckpt_t = time.time()
        crash_at = int(os.environ.get("THRUST_TEST_CRASH_AT_STEP", "0"))
        self._exchange()  # a run stopped while it waited at the exchange, resumed: it exchanges first
        while self.iteration < self.num_iterations and not self.solved and not self.stop_agreed:
            self._train_iteration()
            if self.chooser is not None:
                self.chooser.keep(self.global_step, self.policy)
            self._exchange()
            now = time.time()
            last_iter = self.iteration >= self.num_iterations
            if self.eval_env is not None and self.iteration % args.eval_every == 0:
                self._evaluate()
            if self.log is not None and (now - self.window.t >= args.log_interval or last_iter or self.solved):
                self._report(self.log, now)
            if self.solved and self.log is not None:
                say(self._solved_line())
            if dist.is_main and now - last_ckpt_t >= args.checkpoint_interval:
                self.checkpoint()
                last_ckpt_t = now
            if candidates.orphaned() and not self.stop_signal:  # a candidate whose run is gone stops too
                self.stop_signal.append(signal.SIGTERM)
            if crash_at and dist.restart_count == 0 and self.global_step >= crash_at:
                # Fault injection for the `torchrun --max-restarts` test: checkpoint, then die.
                self.checkpoint()
                dist.close()
                os._exit(1)

    def _exchange(self) -> None:
        if self.exchange is not None and self.exchange.due(self.global_step):
            self.exchange.run(self.policy, self.ppo.optimizer, self.global_step, self.settings,
                              lambda: bool(self.stop_signal) or candidates.orphaned(), PROCESS_START)
            if not self.exchange.done:  # stopped while it waited: end at the exchange's step (one process:
                self.stop_agreed = True  # no torchrun), so that, resumed, it exchanges from the same files

    def _train_iteration(self) -> None:
        ppo = self.ppo
        # the cost set after the previous iteration, as the runs that measured it had (and a resumed run)
        ppo.death_extra = ppo.death_at(self.iteration - 1, self.num_iterations)
        ppo.collect()
        ppo.ent_coef = ppo.ent_at(self.iteration, self.num_iterations)
        losses = ppo.update(ppo.lr_at(self.iteration, self.num_iterations))
        self.iteration += 1
        self.global_step += self.batch_per_iter
        # device tensors, read once per report (`_report`)
        stats, self.losses, self.stop_agreed = agree(self.dist, ppo.pop_episode_stats(), losses, bool(self.stop_signal))
        self.window.add(self.batch_per_iter, stats)

    def _evaluate(self) -> None:
        # A cheap check: the evaluation gives up as soon as the target is out of reach.
        args = self.args
        scores = evaluate_greedy(
            self.policy,
            self.eval_env,
            args.eval_episodes,
            seed=args.seed + 10_000 + self.iteration,
            target=args.target_return,
            max_return=self.eval_env.max_return,
        )
        self.eval_return = float(self.dist.mean(scores.mean()))
        self.solved = self.eval_return >= args.target_return

    def _solved_line(self) -> str:
        """The plain line that says why a run ends before --total-steps."""
        total = self.num_iterations * self.batch_per_iter
        return (f"solved: eval return {self.eval_return:.1f} >= {self.args.target_return:g} at step "
                f"{self.global_step:,} of {total:,}, stopping early")

    def _report(self, log: RunLog, now: float) -> None:
        """Rank 0: one THRUST_METRICS line, the same row in metrics.jsonl (and TensorBoard)."""
        w = self.window
        assert self.losses is not None, "a report follows an iteration"
        losses = dict(zip(LOSS_NAMES, w.read(self.losses), strict=True))  # the report's one host sync
        m: dict[str, Any] = {
            "step": self.global_step,
            "sps": w.sps(now),
            "return_mean": finite(w.ret / w.n) if w.n else None,
            "length_mean": finite(w.len / w.n) if w.n else None,
            "loss_policy": losses["loss_policy"],
            "loss_value": losses["loss_value"],
            "entropy": losses["entropy"],
            "approx_kl": losses["approx_kl"],
            "total_steps": self.num_iterations * self.batch_per_iter,
            "iteration": self.iteration,
            "wall_s": round(now - PROCESS_START, 3),
            "lr": self.ppo.optimizer.lr,
            "clipfrac": losses["clipfrac"],
            "episodes": int(w.n),
        }
        if self.spec.score is not None:
            m["score_mean"] = w.mean(w.score)
        if self.eval_return is not None:
            m["eval_return"] = self.eval_return
        m.update(gpu_fields(self.device))
        self.last_metrics = m
        log.metrics(m)
        w.restart(now)

    def checkpoint(self) -> Path | None:
        if not self.dist.is_main:
            return None
        state = {
            "model": self.policy.state_dict(),
            "optimizer": self.ppo.optimizer.state_dict(),
            "step": self.global_step,
            "iteration": self.iteration,
            "config": self.config,
            "world_size": self.dist.world,
            "torch_rng": torch.get_rng_state(),
            "env_rng": self.env.generator.get_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.use_cuda else [],
        }
        if self.chooser is not None and self.chooser.held_out is not None:
            state[candidates.HELD_OUT] = self.chooser.held_out
        if self.exchange is not None:
            state[population.EXCHANGED] = self.exchange.done
        return save_checkpoint(self.ckpt_dir, state, self.global_step)

    # ------------------------------------------------------------------------------------- finish
    def finish(self) -> int:
        close_env(self.env)  # a gymnasium vector env's workers (--vector async)
        if self.eval_env is not None:
            close_env(self.eval_env)
        if self.chooser is not None:  # the kept policy becomes this run's before its last checkpoint
            signum = self.stop_signal[0] if self.stop_signal else (signal.SIGTERM if self.stop_agreed else None)
            self.chooser.finish(self.policy, self.ppo.optimizer, self.global_step, self.settings, signum, self.config)
        ckpt_path = self.checkpoint()
        export_path, export_error = None, None
        if self.log is not None:
            self.log.stop_progress()
            if self.args.export:
                export_path, export_error = self._export()
            emit_done(self, ckpt_path, export_path, export_error)
            self.log.close()
        self.dist.close()
        if self.stop_signal:
            return 128 + self.stop_signal[0]
        if self.stop_agreed:  # another rank was signalled: this one stopped with it
            return 128 + signal.SIGTERM
        return EXIT_FAILED if export_error else EXIT_OK

    def _export(self) -> tuple[str | None, str | None]:
        """(the model's path, None), or (None, why) when the export failed (the checkpoint is saved)."""
        from trainer.export import ExportError, export_onnx

        try:
            path = export_onnx(
                self.policy,
                self.args.export,
                env_name=self.spec.name,
                policy_kind=self.args.policy,
                steps=self.global_step,
                final_return=self.last_metrics.get("return_mean"),
                held_out=self.chooser.held_out if self.chooser is not None else None,
                **self.settings,
            )
        except ExportError as e:  # say what failed and fail the job
            print(f"export failed: {e}", file=sys.stderr)
            return None, str(e)
        return str(path), None

def announce(t: Trainer, auto_note: str | None) -> None:
    """Rank 0: THRUST_INFO with the run's facts, and config.json."""
    info: dict[str, Any] = {
        "device": str(t.device),
        "world_size": t.dist.world,
        "num_envs": t.total_envs,
        "run_dir": str(t.run_dir),
        "threads": torch.get_num_threads(),
        "precision": t.args.precision,
        "compile": t.args.compile,
        "optimizer": type(t.ppo.optimizer).__name__,
    }
    if auto_note:
        info["num_envs_auto"] = auto_note
    if t.args.candidates > 1:  # trained beside this run from the end of setup (trainer/candidates.py)
        info["candidates"] = {"seeds": [candidates.seed_of(t.args.seed, k) for k in range(t.args.candidates)],
                              "dirs": [str(candidates.candidate_dir(t.run_dir, k))
                                       for k in range(1, t.args.candidates)],
                              "usable_cores": candidates.usable_cores()}
    emit("THRUST_INFO", info)
    (t.run_dir / "config.json").write_text(json.dumps(t.config, indent=2, default=str) + "\n")


def emit_done(t: Trainer, ckpt_path: Path | None, export_path: str | None, export_error: str | None) -> None:
    stopped = t.stop_signal[0] if t.stop_signal else (int(signal.SIGTERM) if t.stop_agreed else None)
    emit(
        "THRUST_DONE",
        {
            "step": t.global_step,
            "total_steps": t.num_iterations * t.batch_per_iter,
            "wall_s": round(time.time() - PROCESS_START, 3),
            "train_s": round(t.train_s, 3),
            "return_mean": t.last_metrics.get("return_mean"),
            "eval_return": t.eval_return,
            "solved": t.solved,
            "run_dir": str(t.run_dir),
            "checkpoint": str(ckpt_path) if ckpt_path else None,
            "export": export_path,
            "stopped_by_signal": stopped,
            "export_error": export_error,
            **(t.chooser.done_fields() if t.chooser is not None else {}),
            **({"exchange": t.exchange.record} if t.exchange is not None and t.exchange.record else {}),
        },
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        trainer = Trainer(parse_args(argv))
        population.refuse_alone(trainer.args, argv)
        trainer.setup()
    except UsageError as e:
        print(e, file=sys.stderr)
        return EXIT_USAGE
    except TrainError as e:
        print(e, file=sys.stderr)
        return e.code
    except GymEnvError as e:  # gymnasium could not give the env the trainer needs (trainer/envs/gym.py)
        print(e, file=sys.stderr)
        return EXIT_FAILED
    started = time.perf_counter()
    trainer.loop()
    trainer.train_s = time.perf_counter() - started  # the solve, on its own clock (bench/bench_ppo.py)
    return trainer.finish()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown (~0.25 s of torch module cleanup on a small CPU): everything this
    # process wrote is already flushed, fsynced (checkpoints) or closed (metrics.jsonl).
    os._exit(code)
