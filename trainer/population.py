"""The population step (`--exploit-at F`): once, at a share F of the steps, the `--candidates` compare
on held-out greedy games, and a candidate clearly behind the best continues from the best's policy.

Why: one run in five or six learns no endgame, and it shows long before the end (seed 5 of the snake
preset: at 60% of the steps its two runs read 64 and 82 apples, and the first never passes 77), yet
it spends its core to the end as a draw that cannot win. Continued from the better policy (its weights
and optimizer state, with the run's own envs and random streams, so the two paths part again at once),
it is a second chance at the better lineage's late policies, where the choice (trainer/candidates.py)
picks from. Only "clearly" behind: a run that reads a few apples lower at 60% may still end best, so
the gap must exceed `--exploit-z` standard errors of the two readings' difference (PBT's t-test
selection, in the large-sample form).

How: every candidate process scores its policy on `--candidate-games` games from its own seed range
(`exchange_seed`: neither trainer.eval's games nor the choice's), writes its state to the exchange
directory (RUN/candidates/exchange/<k>.pt, atomically), waits for the others' files of the same step
(at most WAIT_LIMIT_S; a stopped run stops waiting), and every process makes the same decision from
the same files. Candidate 0 is the run's own process; children learn their place from POPULATION_ENV,
set by the process that started them. A checkpoint says whether its process had exchanged (EXCHANGED):
resumed, a run that had does not exchange again (its state holds what the exchange gave it), and one
stopped while it waited exchanges before its first iteration, from the same files.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.args import EXPLOIT_ALONE, TrainArgs, UsageError, exploit_alone
from trainer.checkpoint import save_atomically
from trainer.report import say

POPULATION_ENV = "THRUST_CANDIDATE_POPULATION"  # in a candidate's child: "k K DIR" (its place, the size, the exchange)
EXCHANGE_OFFSET = 500_000  # the exchange's games start at the held-out seed + this: not the choice's games
WAIT_LIMIT_S = 120.0  # at least this long for the others (they train the same steps on their own cores) ...
WAIT_SHARE = 0.25  # ... or this share of the time the run has trained, whichever is longer
POLL_S = 0.2
EXCHANGED = "exchanged"  # the checkpoint's field: saved after this process's exchange


@dataclass(frozen=True)
class Member:
    """This process's place in the population: candidate `k` of `size`, exchanging through `directory`."""

    k: int
    size: int
    directory: Path

    def file(self, k: int) -> Path:
        return self.directory / f"{k}.pt"

    def env_for(self, k: int) -> str:
        """POPULATION_ENV's value for candidate k's child process."""
        return f"{k} {self.size} {self.directory}"


def exchange_dir(run_dir: Path) -> Path:
    """The run's exchange directory (beside its candidates' run directories)."""
    return run_dir / "candidates" / "exchange"


def member_of(args: TrainArgs, run_dir: Path) -> Member | None:
    """The run's own process (candidate 0 of `--candidates K`) or a child told by POPULATION_ENV;
    None for a run alone."""
    if args.candidates > 1:
        return Member(0, args.candidates, exchange_dir(run_dir))
    value = os.environ.get(POPULATION_ENV, "")
    k, size, directory = (value.split(" ", 2) + ["", "", ""])[:3]
    if not (k.isdigit() and size.isdigit() and directory):
        return None
    return Member(int(k), int(size), Path(directory))


def clear(member: Member, run_dir: Path) -> None:
    """Before a fresh run's candidates start: remove what an earlier run in the same directory left
    (its files of the same step would otherwise be read as this run's). A resumed run keeps them: a
    candidate that published before the stop is not published again. Judged after resolving links:
    an exchange directory that leads outside the run (a link in a reused --run-dir) is refused, not
    emptied (UsageError)."""
    where, run = member.directory.resolve(), run_dir.resolve()
    if not where.is_relative_to(run):
        raise UsageError(f"{member.directory} leads to {where}, outside the run directory {run}: a fresh run "
                         "removes the exchange files there, so it does not start; remove that link, or pick "
                         "another --run-dir")
    for path in where.glob("*.pt"):
        path.unlink(missing_ok=True)


def exchange_seed(held_out: int) -> int:
    return held_out + EXCHANGE_OFFSET


def exchange_step(total_steps: int, share: float) -> int | None:
    """The step at which the candidates exchange (the first iteration at or past it), or None (off)."""
    return round(total_steps * share) if share > 0 else None


def behind(rows: list[dict[str, Any]], z: float) -> dict[int, int]:
    """{candidate: the candidate it continues from} for each one clearly behind the best: the best's
    mean exceeds its own by more than `z` standard errors of the difference (and by something at all)."""
    best = max(rows, key=lambda r: (r["mean"], r.get("full_board_fraction", 0.0), -r["candidate"]))
    moves = {}
    for r in rows:
        gap = best["mean"] - r["mean"]
        if r is not best and gap > 0 and gap > z * math.hypot(best.get("sem", 0.0), r.get("sem", 0.0)):
            moves[r["candidate"]] = best["candidate"]
    return moves


def exchange_line(step: int, games: int, rows: list[dict[str, Any]], moves: dict[int, int], missing: list[int]) -> str:
    scores = "; ".join(f"candidate {r['candidate']} {r['mean']:.1f} ± {r.get('sem', 0.0):.1f}" for r in rows)
    if moves:
        what = "; ".join(f"candidate {k} continues from candidate {j}'s policy" for k, j in sorted(moves.items()))
    else:
        what = "none is clearly behind; each continues its own"
    gone = f" (candidate {', '.join(map(str, missing))} did not arrive)" if missing else ""
    return f"exchange at step {step:,} over {games} held-out greedy games: {scores}{gone}; {what}"


def _read(path: Path, step: int, k: int) -> dict[str, Any] | None:
    """Candidate k's exchange state for `step`, or None (not there yet, or not this step's)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - not there yet, or unreadable: waited for like a missing one
        return None
    if not isinstance(state, dict) or state.get("step") != step or state.get("candidate") != k:
        return None
    return state


def refuse_alone(args: TrainArgs, argv: list[str]) -> None:
    """UsageError for an `--exploit-at` given on the command line to a run that trains alone (`args`
    resolved: the preset's auto is 1 under torchrun): it would do nothing, silently. A preset's stays
    quietly off; a candidate's child (told its place) is not alone."""
    given = any(a == "--exploit-at" or a.startswith("--exploit-at=") for a in argv)
    if given and exploit_alone({"exploit-at": args.exploit_at, "candidates": args.candidates}) \
            and not os.environ.get(POPULATION_ENV):
        raise UsageError(f"--{EXPLOIT_ALONE}: pass --candidates 2 or more (or auto; not under torchrun), or leave "
                         "--exploit-at out")


def exchange_for(args: TrainArgs, run_dir: Path, total_steps: int, held_out: int, step: int, batch: int,
                 exchanged: bool) -> Exchange | None:
    """This process's part in the step (None without --exploit-at or a population), for a run starting
    at `step` (`exchanged`: what its checkpoint says). A fresh run's candidate 0 clears the directory."""
    member = member_of(args, run_dir)
    if member is None or args.exploit_at <= 0:
        return None
    if member.k == 0 and step == 0:
        clear(member, run_dir)
    exchange = Exchange(member, args, total_steps, held_out)
    exchange.resume(step, batch, exchanged)
    return exchange


class Exchange:
    """One candidate's part in the population step (see the module's docstring)."""

    def __init__(self, member: Member, args: TrainArgs, total_steps: int, held_out: int) -> None:
        self.member, self.args = member, args
        self.at = exchange_step(total_steps, args.exploit_at)
        self.done = self.at is None  # decided (with whoever arrived in time); a stop in the wait is not
        self.seed = exchange_seed(held_out)
        self.record: dict[str, Any] | None = None  # THRUST_DONE's "exchange"

    def resume(self, step: int, batch: int, exchanged: bool) -> None:
        """A run resumed at `step` (its checkpoint says whether it had `exchanged`): done when it had, or
        when the iteration before `step` was already past the point (the exchange ran then). A run
        stopped while it waited has neither, and exchanges before its first iteration (the others'
        files of that step are still there)."""
        self.done = self.done or exchanged or (self.at is not None and step - batch >= self.at)

    def due(self, step: int) -> bool:
        return not self.done and self.at is not None and step >= self.at

    def run(self, policy: torch.nn.Module, optimizer: Any, step: int, settings: dict[str, Any],
            stopping: Callable[[], bool], started: float) -> None:
        """Score, publish, wait for the others, and continue from the best's state when clearly behind."""
        from trainer.candidates import score  # the choice's own evaluation (imports this module)

        me, games = self.member.k, self.args.candidate_games
        mine = {"candidate": me, **score(copy.deepcopy(policy), self.args.env, settings, self.seed, games)}
        state = {"step": step, "candidate": me, "score": mine, "model": policy.state_dict(),
                 "optimizer": optimizer.state_dict()}
        save_atomically(self.member.file(me), state)
        states = self._wait(step, stopping, max(WAIT_LIMIT_S, WAIT_SHARE * (time.time() - started)))
        if states is None:  # stopped while waiting: the run checkpoints (not done) and ends; resumed, it waits again
            return
        self.done = True
        rows = sorted([mine, *(s["score"] for s in states.values())], key=lambda r: r["candidate"])
        missing = [k for k in range(self.member.size) if k != me and k not in states]
        moves = behind(rows, self.args.exploit_z)
        if me in moves:
            source = states[moves[me]]
            policy.load_state_dict(source["model"])
            optimizer.load_state_dict(source["optimizer"])
        self.record = {"step": step, "games": games, "seed": self.seed, "scores": rows,
                       "continued_from": {str(k): j for k, j in moves.items()}, "missing": missing}
        say(exchange_line(step, games, rows, moves, missing))

    def _wait(self, step: int, stopping: Callable[[], bool], limit: float) -> dict[int, dict[str, Any]] | None:
        """The others' states of `step` as they arrive, until all are there or `limit` seconds pass;
        None when the run is stopping."""
        others = [k for k in range(self.member.size) if k != self.member.k]
        states: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + limit
        while True:
            for k in others:
                if k not in states and (state := _read(self.member.file(k), step, k)) is not None:
                    states[k] = state
            if len(states) == len(others) or time.monotonic() >= deadline:
                return states
            if stopping():
                return None
            time.sleep(POLL_S)  # the others are a few iterations away at most; their files are small
