"""`--candidates K`: K trainings side by side (one process each), the best on held-out games kept.

Real trainer processes on a small snake board: the kept policy is the one an independent evaluation
of every candidate's final checkpoint on the held-out games ranks first; a stop reaches every
candidate and chooses nothing, and `--resume` finishes them all; a candidate whose run is killed
outright stops by itself."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers import REPO, wait_until

from trainer import candidates
from trainer.args import parse_args, to_argv
from trainer.checkpoint import checkpoint_paths, load_latest
from trainer.envs.registry import get_spec
from trainer.envs.snake import danger_at
from trainer.eval import evaluate, evaluate_groups, stacked_actor, torch_actor
from trainer.export import policy_from_checkpoint
from trainer.policy import build_policy

SMALL = ("--env", "snake", "--grid-size", "6", "--num-envs", "16", "--log-interval", "0")


def tagged(stdout: str, tag: str) -> list[dict]:
    return [json.loads(line[len(tag) + 1 :]) for line in stdout.splitlines() if line.startswith(tag + " ")]


def train(*flags: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainer.train", *flags], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def scores_by_step(text: str) -> dict[int, float]:
    return {int(s.replace(",", "")): float(m) for s, m in re.findall(r"step ([\d,]+) ([\d.]+)", text)}


def held_out_mean(state: dict, seed: int, games: int) -> float:
    spec = get_spec("snake")
    settings = spec.settings_of(spec.params(state["config"]))
    return evaluate(torch_actor(policy_from_checkpoint(state)), "snake", episodes=games,
                    seed=candidates.HELD_OUT_BASE + seed, **settings)["mean"]


def test_a_child_is_given_the_same_flags_but_its_own_seed_and_directory() -> None:
    args = parse_args(["--env", "snake", "--mask", "1", "--seed", "3", "--candidates", "3", "--run-dir", "r",
                       "--export", "m.onnx", "--resume"])
    assert parse_args(to_argv(args)) == args  # every flag spelled out: no preset fills in for a child
    assert candidates.seed_of(3, 0) == 3 and len({candidates.seed_of(3, k) for k in range(3)}) == 3
    assert candidates.held_out_seed(args) not in (0, 3)  # not trainer.eval's games, nor the training's
    child = parse_args(["--env", "snake", "--seed", "10003", "--held-out-seed", str(candidates.held_out_seed(args))])
    assert candidates.held_out_seed(child) == candidates.held_out_seed(args)  # a candidate plays its run's games
    assert candidates.snapshot_steps(1000, 4) == [700, 800, 900]  # evenly over the last 30%
    assert candidates.snapshot_steps(1000, 7) == [700, 750, 800, 850, 900, 950]
    assert candidates.snapshot_steps(1000, 1) == []


def test_auto_trains_one_candidate_a_usable_core_within_its_range(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The snake preset's `--candidates auto`: 2 on one or two cores (the demo's time), 3 from three
    on; 1 under torchrun; a resumed run keeps the count it was started with; a number given stays."""
    assert [candidates.auto_count(n) for n in (1, 2, 3, 4, 64)] == [2, 2, 3, 3, 3]
    preset = parse_args(["--env", "snake", "--run-dir", str(tmp_path)])
    assert preset.candidates == "auto"
    monkeypatch.setattr(candidates, "usable_cores", lambda: 8)
    assert candidates.resolved(preset).candidates == 3
    monkeypatch.setattr(candidates, "usable_cores", lambda: 2)
    assert candidates.resolved(preset).candidates == 2
    (tmp_path / "config.json").write_text(json.dumps({"candidates": 3}))
    resumed = parse_args(["--env", "snake", "--run-dir", str(tmp_path), "--resume"])
    assert candidates.resolved(resumed).candidates == 3  # its candidates' directories are for three
    assert candidates.resolved(preset).candidates == 2  # a fresh run in that directory counts the cores
    given = parse_args(["--env", "snake", "--candidates", "4"])
    assert candidates.resolved(given).candidates == 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert candidates.resolved(preset).candidates == 1  # torchrun's ranks are one training


def test_a_cpu_quota_caps_the_usable_cores(tmp_path: Path) -> None:
    """A container limited to some CPUs' time (cgroup v2 cpu.max, v1's CFS files) counts those, rounded up."""
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir()
    (v1 / "cpu").mkdir(parents=True)
    for text, cores in (("200000 100000", 2), ("250000 100000", 3), ("50000 100000", 1), ("max 100000", None)):
        (v2 / "cpu.max").write_text(text + "\n")
        assert candidates.quota_cores(v2) == cores
    for quota, cores in (("300000", 3), ("-1", None)):
        (v1 / "cpu" / "cpu.cfs_quota_us").write_text(quota + "\n")
        (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
        assert candidates.quota_cores(v1) == cores
    assert candidates.quota_cores(tmp_path / "none") is None


@pytest.mark.e2e
@pytest.mark.slow
def test_auto_counts_the_cores_it_may_use_and_a_resumed_run_keeps_its_own_count(tmp_path: Path) -> None:
    """Started with three candidates and stopped, the run resumed on one usable core (taskset) with the
    preset's `--candidates auto` continues all three, and its THRUST_INFO says the cores it saw."""
    run = tmp_path / "run"
    flags = (*SMALL, "--total-steps", "30720", "--candidate-games", "8", "--run-dir", str(run),
             "--checkpoint-interval", "1000")
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", *flags, "--candidates", "3"], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("THRUST_METRICS"):
            break
    for k in (1, 2):
        wait_until(lambda k=k: (candidates.candidate_dir(run, k) / "metrics.jsonl").is_file(), 60,
                   f"candidate {k}'s first report")
    proc.terminate()
    proc.communicate(timeout=120)
    assert proc.returncode == 143
    again = subprocess.run(["taskset", "-c", "0", sys.executable, "-m", "trainer.train", *flags, "--resume"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    info = next(i for i in tagged(again.stdout, "THRUST_INFO") if "candidates" in i)
    assert info["candidates"]["usable_cores"] == 1 and len(info["candidates"]["seeds"]) == 3
    end = tagged(again.stdout, "THRUST_DONE")[0]
    assert [r["candidate"] for r in end["candidates"]["candidates"]] == [0, 1, 2]
    for k in (1, 2):
        child_end = tagged((candidates.candidate_dir(run, k) / "train.log").read_text(), "THRUST_DONE")[-1]
        assert child_end["step"] == end["step"] >= 30_720


@pytest.mark.e2e
@pytest.mark.slow
def test_the_run_keeps_the_candidate_that_plays_best_on_the_held_out_games(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = train(*SMALL, "--total-steps", "40960", "--seed", "2", "--candidates", "3", "--candidate-games", "64",
                 "--run-dir", str(run), "--export", str(tmp_path / "m.onnx"))
    assert done.returncode == 0, done.stderr
    (end,) = tagged(done.stdout, "THRUST_DONE")
    (info,) = tagged(done.stdout, "THRUST_INFO")  # one, as for any run: the candidates are in it
    assert info["candidates"]["seeds"] == [2, 10_002, 20_002]
    choice = end["candidates"]
    assert [r["seed"] for r in choice["candidates"]] == [2, 10_002, 20_002]
    # every candidate's final checkpoint, evaluated here on the same held-out games
    finals = {0: load_latest(run / "checkpoints")[0]}
    for k in (1, 2):
        finals[k] = load_latest(candidates.candidate_dir(run, k) / "checkpoints")[0]
        assert finals[k]["step"] == end["step"] and finals[k]["config"]["seed"] == candidates.seed_of(2, k)
    means = {k: held_out_mean(finals[k], 2, 64) for k in (1, 2)}  # each child scored its own kept policy
    reported = {r["candidate"]: r["mean"] for r in choice["candidates"]}
    assert {k: reported[k] for k in (1, 2)} == pytest.approx(means)
    assert all(finals[k]["held_out"]["held_out_seed"] == candidates.HELD_OUT_BASE + 2 for k in (1, 2))
    best = max(reported, key=lambda k: (reported[k], 0))
    assert end["candidate"] == choice["chosen"] == best
    kept = finals[0]  # the run's last checkpoint holds the kept policy
    want = finals[best]["model"] if best else kept["model"]
    assert all(torch.equal(kept["model"][n], want[n]) for n in want)
    assert kept["config"]["candidate"] == best
    line = next(x for x in done.stdout.splitlines() if x.startswith("candidates over 64 held-out"))
    assert f"keeping candidate {best}" in line
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["steps"] == end["step"]
    assert manifest["held_out"] == end["held_out"]  # the exported policy's own score, what a fetch shows


@pytest.mark.e2e
@pytest.mark.slow
def test_a_stop_reaches_every_candidate_chooses_nothing_and_resume_finishes_them_all(tmp_path: Path) -> None:
    run = tmp_path / "run"
    flags = (*SMALL, "--total-steps", "200000", "--candidates", "2", "--candidate-games", "16", "--run-dir", str(run),
             "--checkpoint-interval", "1000")
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", *flags], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("THRUST_METRICS"):
            break
    child_dir = candidates.candidate_dir(run, 1)
    wait_until(lambda: (child_dir / "metrics.jsonl").is_file(), 60, "the candidate's first report")
    proc.terminate()  # the run's pid only: the run passes the stop on
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143
    assert "none chosen" in out and "candidates" not in tagged(out, "THRUST_DONE")[0]
    assert checkpoint_paths(run / "checkpoints") and checkpoint_paths(child_dir / "checkpoints")
    assert tagged((child_dir / "train.log").read_text(), "THRUST_DONE")[-1]["stopped_by_signal"] == 15
    again = train(*flags, "--resume")
    assert again.returncode == 0, again.stderr
    assert tagged(again.stdout, "THRUST_DONE")[0]["candidates"]["chosen"] in (0, 1)
    child_end = tagged((child_dir / "train.log").read_text(), "THRUST_DONE")[-1]
    assert child_end["step"] == tagged(again.stdout, "THRUST_DONE")[0]["step"] >= 200_000


@pytest.mark.e2e
@pytest.mark.slow
def test_a_candidate_whose_run_is_killed_outright_stops_by_itself(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainer.train", *SMALL, "--total-steps", "100000000",
                             "--candidates", "2", "--run-dir", str(run)], cwd=REPO, stdout=subprocess.DEVNULL)
    child_dir = candidates.candidate_dir(run, 1)
    wait_until(lambda: (child_dir / "metrics.jsonl").is_file(), 60, "the candidate's first report")
    (child,) = psutil.Process(proc.pid).children()
    os.kill(proc.pid, signal.SIGKILL)  # no chance to pass anything on
    proc.wait()
    started = time.monotonic()
    child.wait(timeout=60)  # not our child: psutil sees it end, not its exit code (the log has that)
    assert time.monotonic() - started < 60
    assert tagged((child_dir / "train.log").read_text(), "THRUST_DONE")[-1]["stopped_by_signal"] == 15


@pytest.mark.e2e
@pytest.mark.slow
def test_snapshots_keep_the_point_of_the_run_that_plays_best_on_the_held_out_games(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = train(*SMALL, "--total-steps", "40960", "--seed", "4", "--snapshots", "7", "--candidate-games", "64",
                 "--candidates", "1", "--run-dir", str(run))
    assert done.returncode == 0, done.stderr
    assert "choosing: 7 kept policies play held-out greedy games; the best is kept" in done.stdout.splitlines()
    line = next(x for x in done.stdout.splitlines() if x.startswith("snapshots over 64 held-out"))
    final, first = line.split(" (the best 3 of 7 over 12 games each: ")
    firsts, finals = scores_by_step(first), scores_by_step(final)
    assert len(firsts) == 7 and max(firsts) == 40960 and min(firsts) >= 0.7 * 40960  # the last 30% of the run
    # the finalists are the first round's best three, and the kept one the best of them on all the games
    assert len(finals) == 3 and min(firsts[s] for s in finals) >= sorted(firsts.values())[-3]
    kept = int(re.search(r"keeping step ([\d,]+)", final).group(1).replace(",", ""))
    assert finals[kept] == max(finals.values())
    (end,) = tagged(done.stdout, "THRUST_DONE")
    assert end["held_out"]["step"] == kept and end["step"] == 40960
    state = load_latest(run / "checkpoints")[0]  # the last checkpoint holds the kept policy
    assert held_out_mean(state, 4, 64) == pytest.approx(end["held_out"]["mean"])
    assert round(end["held_out"]["mean"], 1) == finals[kept]


def test_a_first_round_plays_each_policy_on_its_own_rows() -> None:
    """K policies scored in one batch: each row's move is its own policy's greedy move, and a player's
    summary covers its own games only."""
    torch.manual_seed(0)
    spec = get_spec("snake")
    dim, n = spec.obs_dim(spec.params({"space": 1})), spec.n_actions(spec.params({}))
    policies = [build_policy("mlp", dim, n, 16, activation="relu", mask_at=danger_at(10)) for _ in range(3)]
    obs = torch.rand(12, dim)
    obs[:, danger_at(10) : danger_at(10) + 3] = (torch.rand(12, 3) < 0.3).float()  # danger values are 0 or 1
    together = stacked_actor(policies)(obs)
    alone = torch.cat([torch_actor(p)(obs[4 * i : 4 * (i + 1)]) for i, p in enumerate(policies)])
    assert torch.equal(together, alone)
    # player 0 goes straight (into the wall at move 5), player 1 turns left every move (a 2x2 loop until
    # the hunger limit, or longer where an apple falls on it): each summary is its own player's games
    moves = torch.tensor([0] * 8 + [1] * 8)
    straight, loop = evaluate_groups(lambda o: moves, "snake", 2, 8, seed=1)
    assert straight["episodes"] == loop["episodes"] == 8
    assert straight["length_mean"] == 5 and loop["length_mean"] >= 100


def test_candidates_under_torchrun_are_refused(tmp_path: Path) -> None:
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "trainer.train", *SMALL, "--candidates", "2", "--run-dir",
                           str(tmp_path / "r")], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 64, done.stderr
    assert "--candidates" in done.stderr and "torchrun" in done.stderr
