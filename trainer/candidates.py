"""Choosing by held-out games: `--candidates K` trainings side by side, `--snapshots N` points of each.

Why: one seed's training path decides how good a snake gets (seeds 1-6 of one preset span ~77-91
apples, and the path depends on the CPU's float kernels, so nobody can promise a user's seed), and
late in a run the greedy score still moves by several apples from one update to the next (a run's
policies a few hundred thousand steps apart score 81-93 apples, and agree with a second set of games to
~1 apple: BENCHMARKS.md, issue 54). K
independent trainings side by side, one process each with one torch thread, cost on a machine with K
idle cores the wall time of one; keeping the policy at N points of each and a greedy evaluation on
games nothing else is scored on turn those draws into the best of K x N.

The run's own process trains candidate 0: seed S, the run directory, metrics, checkpoints and export
it would have without the flags, so the live line and `--resume` work as for any run. Candidates
1..K-1 are child processes, `python -m trainer.train` with the same flags, seed `seed_of(S, k)`, run
directory `RUN/candidates/k` (their output in its train.log), and the run's held-out games. Each
process keeps its policy at `snapshot_steps` (in memory, evenly over the last 30% of the steps), and at
its end scores them and its final policy on `--candidate-games` greedy games from the held-out seed
(`held_out_seed`: not trainer.eval's seed 0, so a later evaluation is not the games the choice was made
on), keeps the best, and writes that score into its last checkpoint (`HELD_OUT`). With more than
FINALISTS policies a first round on a fifth of the games, five policies to a batch (`first_round`),
picks the FINALISTS that play them all. The run then waits for the children and keeps the
best of all: its last checkpoint and its export are that policy. A stopped run (a signal) stops its
candidates too and chooses nothing; `--resume` continues every candidate (snapshots are kept from
where each resumed).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.args import TrainArgs, to_argv
from trainer.checkpoint import load_latest
from trainer.eval import evaluate, evaluate_groups, stacked_actor, torch_actor
from trainer.population import POPULATION_ENV, member_of
from trainer.report import say

SEED_STRIDE = 10_000  # candidate k trains from seed S + k * SEED_STRIDE: apart from any S a user picks
HELD_OUT_BASE = 1_000_000  # the choice's games start from seed HELD_OUT_BASE + S
SNAPSHOT_SPAN = 0.3  # N snapshots are spread evenly over the last SNAPSHOT_SPAN of the run's steps
FINALISTS = 3  # with more snapshots than this, a first round on fewer games picks this many ...
FIRST_ROUND_SHARE = 5  # ... each playing 1/FIRST_ROUND_SHARE of --candidate-games, that many policies a batch
HELD_OUT = "held_out"  # the checkpoint's and THRUST_DONE's field: the kept policy's held-out score
PARENT_ENV = "THRUST_CANDIDATE_OF"  # in a child: the pid of the run that started it
# `--candidates auto`: one run per usable core, within AUTO_RANGE. Two on a 2-core machine keep the
# demo's time; a third, where a third core is free, lifted the snake preset's worst seeds (seeds 1-6:
# floor 86.4 -> 88.2; seeds 7-9: mean 85.1 -> 88.5; BENCHMARKS.md, issue 54). More were not measured.
AUTO_RANGE = (2, 3)


def orphaned() -> bool:
    """In a candidate's child process: whether the run that started it is gone (then it stops)."""
    parent = os.environ.get(PARENT_ENV)
    return bool(parent) and str(os.getppid()) != parent


def seed_of(seed: int, k: int) -> int:
    return seed + k * SEED_STRIDE


def quota_cores(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """A CPU quota's cores, rounded up (a container's `--cpus`), from cgroup v2's cpu.max or v1's CFS
    files as a container sees them; None without one. The affinity alone would count every CPU of the
    machine in a container limited to two of their time."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
        else:
            quota, period = ((root / "cpu" / f"cpu.cfs_{name}_us").read_text().strip() for name in ("quota", "period"))
        if quota in ("max", "-1") or int(period) <= 0:
            return None
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The CPUs this process may run on: its affinity (a Slurm allocation's, a taskset's), else all,
    and no more than a CPU quota allows."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity on macOS
        cores = os.cpu_count() or 1
    return min(cores, quota_cores() or cores)


def auto_count(cores: int) -> int:
    low, high = AUTO_RANGE
    return max(low, min(high, cores))


def recorded_count(run_dir: str | None) -> int | None:
    """The number of candidates a run in `run_dir` was started with (its config.json), if any."""
    try:
        value = json.loads((Path(run_dir) / "config.json").read_text()).get("candidates") if run_dir else None
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def resolved(args: TrainArgs) -> TrainArgs:
    """`args` with `--candidates auto` made a number: 1 under torchrun (its ranks are one training); a
    resumed run's own count (its candidates' directories and checkpoints are for that many, whatever
    the cores now); else `auto_count` of the usable cores. A number given stays (setup refuses one
    above 1 under torchrun)."""
    if args.candidates != "auto":
        return args
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        count = 1
    else:
        count = (recorded_count(args.run_dir) if args.resume else None) or auto_count(usable_cores())
    return dataclasses.replace(args, candidates=count)


def held_out_seed(args: TrainArgs) -> int:
    """The first seed of the held-out games: `--held-out-seed`, else HELD_OUT_BASE + the run's seed."""
    return args.held_out_seed if args.held_out_seed >= 0 else HELD_OUT_BASE + args.seed


def choosing(args: TrainArgs) -> bool:
    """Whether this process scores its policies on the held-out games at its end."""
    return args.candidates > 1 or args.snapshots > 1 or args.held_out_seed >= 0


def snapshot_steps(total: int, n: int) -> list[int]:
    """The steps (ascending) after which a run keeps its policy, besides the final one (`n` in all,
    evenly spaced over the last SNAPSHOT_SPAN of the steps: 4 are at 70, 80, 90 and 100%)."""
    return sorted(round(total * (1 - SNAPSHOT_SPAN * i / (n - 1))) for i in range(1, n))


def candidate_dir(run_dir: Path, k: int) -> Path:
    return run_dir / "candidates" / str(k)


@dataclass
class Child:
    """Candidate k, trained by a child process this run started (its pid is the one we signal)."""

    k: int
    seed: int
    run_dir: Path
    proc: subprocess.Popen[bytes]


def start_others(args: TrainArgs, run_dir: Path) -> list[Child]:
    """Start candidates 1..K-1 (`args.candidates` = K) as child processes; each writes train.log."""
    children, member = [], member_of(args, run_dir)
    assert member is not None, "a run of several candidates is candidate 0 of their population"
    for k in range(1, args.candidates):
        seed = seed_of(args.seed, k)
        out = candidate_dir(run_dir, k)
        out.mkdir(parents=True, exist_ok=True)
        child_args = dataclasses.replace(
            args, seed=seed, run_dir=str(out), candidates=1, export=None, resume_from=None, tensorboard=False,
            held_out_seed=held_out_seed(args),
        )
        cmd = [sys.executable, "-m", "trainer.train", *to_argv(child_args)]
        # The run's own process group: a stop of the run's group (the host agent's, a Ctrl-C) reaches
        # the children too; PARENT_ENV lets a child stop if the run itself is gone (killed outright).
        env = {**os.environ, PARENT_ENV: str(os.getpid()), POPULATION_ENV: member.env_for(k)}
        with open(out / "train.log", "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        children.append(Child(k, seed, out, proc))
    return children


def stop_others(children: list[Child], signum: int) -> None:
    """Pass a stop on to the children (each checkpoints at its iteration's end and exits)."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signum)


def wait_others(children: list[Child]) -> None:
    for child in children:
        child.proc.wait()


def final_state(child: Child, step: int) -> tuple[dict[str, Any] | None, str]:
    """(the child's final checkpoint, "") when it finished the run's `step` steps from its own seed and
    scored its policies on the held-out games; else (None, why not): a candidate is only chosen from a
    checkpoint that is what it should be."""
    if child.proc.returncode != 0:
        return None, f"exited {child.proc.returncode} (see {child.run_dir / 'train.log'})"
    loaded = load_latest(child.run_dir / "checkpoints")
    if loaded is None:
        return None, f"left no checkpoint in {child.run_dir / 'checkpoints'}"
    state, path = loaded
    if int(state.get("step", -1)) != step or state.get("config", {}).get("seed") != child.seed:
        return None, f"{path} is not its final checkpoint (step {state.get('step')}, seed {child.seed} expected)"
    if not isinstance(state.get(HELD_OUT), dict):
        return None, f"{path} has no held-out score"
    return state, ""


SCORE_FIELDS = ("mean", "sem", "median", "full_board_fraction")  # of trainer.eval's result, in the report


def score(policy: torch.nn.Module, env: str, settings: dict[str, Any], seed: int, games: int) -> dict[str, Any]:
    """The greedy evaluation the choice is made by: trainer.eval's, on the held-out games from `seed`.
    `policy` is a copy of the run's (it is moved to the CPU, where the env steps)."""
    return reported(evaluate(torch_actor(policy.cpu().eval()), env, episodes=games, seed=seed, **settings))


def reported(result: dict[str, Any]) -> dict[str, Any]:
    """The SCORE_FIELDS of an evaluation's result."""
    return {k: result[k] for k in SCORE_FIELDS if k in result}


def first_round(policies: list[tuple[int, torch.nn.Module]], env: str, settings: dict[str, Any], seed: int,
                games: int) -> list[dict[str, Any]]:
    """Each (step, policy) scored on `games` held-out games, FIRST_ROUND_SHARE policies to a batch."""
    rows = []
    for i in range(0, len(policies), FIRST_ROUND_SHARE):
        batch = policies[i : i + FIRST_ROUND_SHARE]
        act = stacked_actor([p.cpu().eval() for _, p in batch])
        results = evaluate_groups(act, env, len(batch), games, seed=seed, **settings)
        for (at, _), result in zip(batch, results, strict=True):
            rows.append({"step": at, **reported(result)})
    return rows


def key(result: dict[str, Any]) -> tuple[float, float]:
    """Best first: the mean score, then the share of wins (full boards) on a tie."""
    return result["mean"], result.get("full_board_fraction", 0.0)


def choice_line(choice: dict[str, Any]) -> str:
    """The plain line that says which candidate was kept and why: every candidate's held-out score."""
    parts = []
    for row in choice["candidates"]:
        if "mean" not in row:
            parts.append(f"{row['candidate']} (seed {row['seed']}) left out")
            continue
        wins = f", {row['full_board_fraction']:.0%} full boards" if "full_board_fraction" in row else ""
        parts.append(f"{row['candidate']} (seed {row['seed']}, step {row['step']:,}) {row['mean']:.1f}{wins}")
    return (f"candidates over {choice['games']} held-out greedy games: {'; '.join(parts)}; "
            f"keeping candidate {choice['chosen']}")


def choosing_line(args: TrainArgs, kept: int) -> str:
    """The plain line at the end of the steps, before the held-out games (which take a while)."""
    runs = f" in each of the {args.candidates} candidates" if args.candidates > 1 else ""
    policies = "policy plays" if kept == 1 else "policies play"
    return f"choosing: {kept} kept {policies} held-out greedy games{runs}; the best is kept"


def snapshot_line(rows: list[dict[str, Any]], kept: dict[str, Any], games: int,
                  first: list[dict[str, Any]] | None = None, first_games: int = 0) -> str:
    """The plain line that says which of this process's snapshots was kept (and, after a first round,
    how the finalists were picked)."""
    parts = [f"step {r['step']:,} {r['mean']:.1f}" for r in rows]
    line = f"snapshots over {games} held-out greedy games: {'; '.join(parts)}; keeping step {kept['step']:,}"
    if first:
        scores = "; ".join(f"step {r['step']:,} {r['mean']:.1f}" for r in first)
        line += f" (the best {len(rows)} of {len(first)} over {first_games} games each: {scores})"
    return line


class Chooser:
    """One process's part in the choice (rank 0): the children it started, the snapshots it keeps, and
    at its end the policy it keeps (`finish`)."""

    def __init__(self, args: TrainArgs, run_dir: Path, total_steps: int) -> None:
        self.args = args
        self.keep_at = snapshot_steps(total_steps, args.snapshots)
        self.snapshots: list[tuple[int, dict[str, torch.Tensor]]] = []  # (step, weights)
        self.held_out: dict[str, Any] | None = None  # the kept policy's score on the held-out games
        self.choice: dict[str, Any] | None = None  # --candidates: how the kept one was chosen
        self.others = start_others(args, run_dir) if args.candidates > 1 else []

    def keep(self, step: int, policy: torch.nn.Module) -> None:
        """After an iteration: keep the policy when `step` passed the next snapshot point."""
        if self.keep_at and step >= self.keep_at[0]:
            self.keep_at = [s for s in self.keep_at if s > step]
            self.snapshots.append((step, copy.deepcopy(policy.state_dict())))

    def stop(self, signum: int) -> None:
        stop_others(self.others, signum)

    def finish(self, policy: torch.nn.Module, optimizer: Any, step: int, settings: dict[str, Any],
               stopped_by: int | None, config: dict[str, Any]) -> None:
        """Unless stopped: keep the best snapshot, then the best candidate (loaded into `policy` and
        `optimizer`; `config` records which). Stopped: stop and wait for the children, choose nothing."""
        if stopped_by is not None:
            self.stop(stopped_by)
        wait_others(self.others)
        if stopped_by is not None:
            if self.others:
                say(f"stopped: the {len(self.others) + 1} candidates stopped with the run; none chosen, "
                    "resuming the run continues them all")
            return
        if choosing(self.args):
            # the steps are done and the live line stops moving: say what the next minute is for
            say(choosing_line(self.args, len(self.snapshots) + 1))
            self._best_snapshot(policy, step, settings)
        if self.others:
            config.update(candidate=self._best_candidate(policy, optimizer, step))

    def _best_snapshot(self, policy: torch.nn.Module, step: int, settings: dict[str, Any]) -> None:
        """Keep the snapshot (or the final policy) that plays best on the held-out games. With more than
        FINALISTS of them, a first round on 1/FIRST_ROUND_SHARE of the games (several policies a batch)
        picks the FINALISTS that play the full number: late in a run the greedy score moves by several
        apples between points a few hundred thousand steps apart, so many points are worth scoring,
        and the first round keeps 13 of them at ~1.5x the cost of 4 on all the games (not 3x)."""
        args, seed, games = self.args, held_out_seed(self.args), self.args.candidate_games
        policies = [(at, self._copy(policy, weights)) for at, weights in [*self.snapshots, (step, policy.state_dict())]]
        first, first_games = None, max(1, games // FIRST_ROUND_SHARE)
        if len(policies) > FINALISTS:
            first = first_round(policies, args.env, settings, seed, first_games)
            top = {r["step"] for r in sorted(first, key=key, reverse=True)[:FINALISTS]}
            policies = [(at, p) for at, p in policies if at in top]
        rows = [{"step": at, **score(p, args.env, settings, seed, games)} for at, p in policies]
        best = max(rows, key=key)
        if best["step"] != step:
            policy.load_state_dict(dict(self.snapshots)[best["step"]])
        self.held_out = {**best, "games": games, "held_out_seed": seed}
        if len(rows) > 1 or first:
            say(snapshot_line(rows, best, games, first, first_games))

    @staticmethod
    def _copy(policy: torch.nn.Module, weights: dict[str, torch.Tensor]) -> torch.nn.Module:
        candidate = copy.deepcopy(policy)
        candidate.load_state_dict(weights)
        return candidate

    def _best_candidate(self, policy: torch.nn.Module, optimizer: Any, step: int) -> int:
        """The candidate kept (its policy and optimizer state loaded into the run's)."""
        args = self.args
        assert self.held_out is not None, "candidates score themselves first"
        states: dict[int, dict[str, Any]] = {}
        rows = [{"candidate": 0, "seed": args.seed, **self.held_out}]
        for child in self.others:
            state, why = final_state(child, step)
            if state is None:
                say(f"candidate {child.k} (seed {child.seed}) left out: {why}")
                rows.append({"candidate": child.k, "seed": child.seed, "left_out": why})
                continue
            states[child.k] = state
            rows.append({"candidate": child.k, "seed": child.seed, **state[HELD_OUT]})
        best = max((r for r in rows if "mean" in r), key=key)
        if best["candidate"] != 0:
            chosen = states[best["candidate"]]
            policy.load_state_dict(chosen["model"])
            optimizer.load_state_dict(chosen["optimizer"])
            self.held_out = chosen[HELD_OUT]
        self.choice = {"chosen": best["candidate"], "games": args.candidate_games,
                       "held_out_seed": held_out_seed(args), "candidates": rows}
        say(choice_line(self.choice))
        return int(best["candidate"])

    def done_fields(self) -> dict[str, Any]:
        """THRUST_DONE's fields of the choice."""
        out: dict[str, Any] = {}
        if self.choice is not None:
            out.update(candidate=self.choice["chosen"], candidates=self.choice)
        if self.held_out is not None:
            out[HELD_OUT] = self.held_out
        return out
