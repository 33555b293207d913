"""`--exploit-at F`: the candidates compare on held-out games at a share F of the steps, and one clearly
behind continues from the best's policy (trainer/population.py).

Real trainer processes on a small snake board, exchanging at their last iteration (`--exploit-at 1`),
so what each final checkpoint holds is exactly what the exchange left it: the best's weights and
optimizer state where a candidate was behind, its own otherwise. The scores are checked against an
independent evaluation of the states the candidates published."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import REPO, wait_until

from trainer import population
from trainer.args import parse_args
from trainer.checkpoint import load_latest, save_atomically
from trainer.envs.registry import get_spec
from trainer.eval import evaluate, torch_actor
from trainer.export import policy_from_checkpoint

SMALL = ("--env", "snake", "--grid-size", "6", "--num-envs", "16", "--log-interval", "0", "--snapshots", "1")
GAMES = 64


def exchange_run(run: Path, *flags: str) -> list[dict]:
    """Three candidates exchanging at their last iteration; every candidate's THRUST_DONE."""
    done = subprocess.run(
        [sys.executable, "-m", "trainer.train", *SMALL, "--total-steps", "40960", "--seed", "2", "--candidates", "3",
         "--candidate-games", str(GAMES), "--exploit-at", "1", "--run-dir", str(run), *flags],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    outs = [done.stdout, *((run / "candidates" / str(k) / "train.log").read_text() for k in (1, 2))]
    records = []
    for out in outs:
        (line,) = [x for x in out.splitlines() if x.startswith("THRUST_DONE ")]
        records.append(json.loads(line.split(" ", 1)[1]))
        assert sum(x.startswith("exchange at step 40,960 over 64 held-out greedy games") for x in out.splitlines()) == 1
    return records


def published(run: Path, k: int) -> dict:
    return torch.load(population.exchange_dir(run) / f"{k}.pt", map_location="cpu", weights_only=True)


def final(run: Path, k: int) -> dict:
    loaded = load_latest(run / "checkpoints" if k == 0 else run / "candidates" / str(k) / "checkpoints")
    assert loaded is not None
    return loaded[0]


def independent_mean(state: dict, config: dict, seed: int) -> float:
    spec = get_spec("snake")
    settings = spec.settings_of(spec.params(config))
    policy = policy_from_checkpoint({**state, "config": config})
    return evaluate(torch_actor(policy), "snake", episodes=GAMES, seed=seed, **settings)["mean"]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("z", ["0", "4"])
def test_a_candidate_clearly_behind_continues_from_the_best_and_the_rest_from_their_own(tmp_path: Path, z: str) -> None:
    run = tmp_path / "run"
    stale = population.exchange_dir(run) / "7.pt"  # an earlier run's in the same directory
    save_atomically(stale, {"step": 40960, "candidate": 7, "score": {"candidate": 7, "mean": 1000.0}})
    done = exchange_run(run, "--exploit-z", z)
    assert not stale.exists()  # cleared before the candidates started
    record = done[0]["exchange"]
    assert all(d["exchange"] == record for d in done)  # every process decided the same from the same files
    assert record["seed"] == population.exchange_seed(1_000_002) and record["missing"] == []
    rows = record["scores"]
    for k, row in enumerate(rows):  # each score is its published policy's, played again here
        assert row["candidate"] == k
        mean = independent_mean(published(run, k), final(run, k)["config"], record["seed"])
        assert row["mean"] == pytest.approx(mean)
    best = max(rows, key=lambda r: r["mean"])
    # by hand: behind when the gap passes z standard errors of the difference
    expected = {str(r["candidate"]): best["candidate"] for r in rows
                if best["mean"] - r["mean"] > max(0.0, float(z) * (best["sem"] ** 2 + r["sem"] ** 2) ** 0.5)}
    assert record["continued_from"] == expected
    assert bool(expected) == (z == "0")  # this seed's gap: past 0 standard errors, not past 4
    for k in range(3):
        own = done[0]["candidate"] if k == 0 else k  # the run's own checkpoint ends as the kept candidate
        source = published(run, record["continued_from"].get(str(own), own))
        state = final(run, k)
        assert same(state["model"], source["model"])
        assert state["optimizer"]["t"] == source["optimizer"]["t"]
        assert all(torch.equal(a, b) for a, b in zip(state["optimizer"]["exp_avg"], source["optimizer"]["exp_avg"],
                                                      strict=True))


def test_the_rule_moves_only_a_candidate_clearly_behind() -> None:
    rows = [{"candidate": 0, "mean": 80.0, "sem": 1.0}, {"candidate": 1, "mean": 90.0, "sem": 1.0},
            {"candidate": 2, "mean": 86.0, "sem": 1.0}]
    assert population.behind(rows, 4.0) == {0: 1}  # 10 apples > 4 x 1.41; 4 apples < 5.66
    assert population.behind(rows, 2.0) == {0: 1, 2: 1}
    assert population.behind(rows, 0.0) == {0: 1, 2: 1}
    tie = [{"candidate": 0, "mean": 5.0, "sem": 0.0}, {"candidate": 1, "mean": 5.0, "sem": 0.0}]
    assert population.behind(tie, 0.0) == {}  # equal scores: nobody gives up its own policy


def test_a_child_learns_its_place_from_its_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_args = parse_args(["--env", "snake", "--candidates", "3"])
    member = population.member_of(run_args, tmp_path)
    assert member == population.Member(0, 3, population.exchange_dir(tmp_path))
    monkeypatch.setenv(population.POPULATION_ENV, member.env_for(2))
    child_args = parse_args(["--env", "snake", "--candidates", "1"])
    assert population.member_of(child_args, tmp_path / "candidates" / "2") == population.Member(2, 3, member.directory)
    for junk in ("", "2", "x 3 /d", "2 3"):
        monkeypatch.setenv(population.POPULATION_ENV, junk)
        assert population.member_of(child_args, tmp_path) is None
    monkeypatch.delenv(population.POPULATION_ENV)
    assert population.member_of(child_args, tmp_path) is None  # a run alone has nobody to compare with


def test_a_resumed_run_exchanges_unless_its_checkpoint_came_after_the_exchange(tmp_path: Path) -> None:
    args = parse_args(["--env", "snake", "--candidates", "2", "--exploit-at", "0.6"])
    member = population.member_of(args, tmp_path)
    assert member is not None
    fresh = population.Exchange(member, args, 1000, 7)
    assert fresh.at == 600 and not fresh.due(599) and fresh.due(600) and fresh.due(640)
    past = population.Exchange(member, args, 1000, 7)
    past.resume(640, 40, exchanged=False)  # the iteration before 640 was at 600 already: it exchanged then
    assert not past.due(700)
    stopped = population.Exchange(member, args, 1000, 7)
    stopped.resume(600, 40, exchanged=False)  # stopped in the wait at the exchange's own step
    assert stopped.due(600)
    decided = population.Exchange(member, args, 1000, 7)
    decided.resume(600, 40, exchanged=True)
    assert not decided.due(600)
    off_args = parse_args(["--env", "snake", "--candidates", "2", "--exploit-at", "0"])
    assert not population.Exchange(member, off_args, 1000, 7).due(1000)


def test_the_wait_gives_up_on_a_missing_candidate_and_stops_with_the_run(tmp_path: Path) -> None:
    args = parse_args(["--env", "snake", "--candidates", "3", "--exploit-at", "0.5"])
    exchange = population.Exchange(population.Member(0, 3, tmp_path), args, 1000, 7)
    save_atomically(tmp_path / "1.pt", {"step": 500, "candidate": 1, "score": {"candidate": 1, "mean": 1.0}})
    save_atomically(tmp_path / "2.pt", {"step": 300, "candidate": 2, "score": {"candidate": 2, "mean": 9.0}})
    t0 = time.monotonic()
    got = exchange._wait(500, lambda: False, 0.5)
    assert got is not None and set(got) == {1}  # candidate 2's file is another step's: not this exchange's
    assert 0.5 <= time.monotonic() - t0 < 5
    assert exchange._wait(500, lambda: True, 60) is None  # a stopped run stops waiting at once
    assert not list(tmp_path.glob(".*.tmp"))  # the writes left no temp files behind


@pytest.mark.e2e
@pytest.mark.slow
def test_a_run_stopped_while_it_waits_exchanges_when_resumed_from_the_files_of_that_step(tmp_path: Path) -> None:
    """Candidate 0 of two whose sibling has not arrived: stopped in the wait, it ends at the exchange's
    step without deciding; resumed once the sibling's (better) state is there, it exchanges first."""
    run = tmp_path / "run"
    exchange = population.exchange_dir(run)
    env = {**os.environ, population.POPULATION_ENV: f"0 2 {exchange}"}
    cmd = [sys.executable, "-m", "trainer.train", *SMALL, "--total-steps", "8192", "--candidates", "1",
           "--candidate-games", str(GAMES), "--exploit-at", "1", "--run-dir", str(run)]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    mine = exchange / "0.pt"
    wait_until(mine.exists, 120, "candidate 0 to publish its state and wait")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "exchange at step" not in out  # nothing decided
    stopped = final(run, 0)
    assert stopped["step"] == 8192 and stopped[population.EXCHANGED] is False
    own = torch.load(mine, weights_only=True)
    sibling = {**own, "candidate": 1, "score": {"candidate": 1, "mean": 1000.0, "sem": 0.0},
               "model": {n: t + 0.5 for n, t in own["model"].items()}}
    save_atomically(exchange / "1.pt", sibling)
    done = subprocess.run([*cmd, "--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("THRUST_DONE ")]
    assert json.loads(line.split(" ", 1)[1])["exchange"]["continued_from"] == {"0": 1}
    resumed = final(run, 0)
    assert resumed["step"] == 8192 and resumed[population.EXCHANGED] is True
    assert same(resumed["model"], sibling["model"])


def test_an_exchange_directory_that_leads_outside_the_run_is_refused_not_emptied(tmp_path: Path) -> None:
    """A reused --run-dir whose candidates/exchange is a link elsewhere: the fresh run would empty that
    directory of its .pt files, so it stops at setup (exit 64) and the files there stay."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model.pt").write_bytes(b"somebody's weights")
    run = tmp_path / "run"
    population.exchange_dir(run).parent.mkdir(parents=True)
    population.exchange_dir(run).symlink_to(elsewhere)
    done = subprocess.run(
        [sys.executable, "-m", "trainer.train", *SMALL, "--total-steps", "4096", "--candidates", "2",
         "--exploit-at", "0.5", "--run-dir", str(run)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 64, done.stderr
    assert "outside the run directory" in done.stderr and str(elsewhere) in done.stderr
    assert "Traceback" not in done.stderr
    assert (elsewhere / "model.pt").read_bytes() == b"somebody's weights"
    assert not (run / "candidates" / "1").exists()  # refused before any candidate started


@pytest.mark.e2e
def test_an_exploit_at_given_to_a_run_alone_is_refused_and_the_presets_stays_quietly_off(tmp_path: Path) -> None:
    """`--exploit-at` on the command line of a run that trains one candidate would do nothing: exit 64
    before anything starts. The snake preset's own 0.6 under `--candidates 1` (optimize's trials) runs."""
    env = {k: v for k, v in os.environ.items() if k != population.POPULATION_ENV}
    cmd = [sys.executable, "-m", "trainer.train", *SMALL, "--total-steps", "1024", "--candidates", "1"]
    alone = subprocess.run([*cmd, "--exploit-at", "0.5", "--run-dir", str(tmp_path / "a")], cwd=REPO,
                           capture_output=True, text=True, timeout=120, env=env)
    assert alone.returncode == 64, alone.stderr
    assert "--exploit-at" in alone.stderr and "--candidates 2" in alone.stderr and "Traceback" not in alone.stderr
    assert not (tmp_path / "a").exists()
    preset = subprocess.run([*cmd, "--run-dir", str(tmp_path / "p")], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env=env)
    assert preset.returncode == 0, preset.stderr
    assert "exchange" not in preset.stdout
