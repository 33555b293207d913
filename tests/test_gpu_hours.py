"""GPU-hours: every run's `wall_hours` and `gpu_hours` (the GPUs it could use x its wall time, by the
host's clock) in `runs --json`, and `runs --summary [--since]` totals per host and job.

There is no GPU here: a small program named nvidia-smi, first on PATH, prints the output recorded on a
real 4 x A100 host (tests/data/nvidia_smi), so envcheck lists four GPUs and `--gpus 2` picks two. The
runs are real runs on the `local` host (the pipeline every host runs)."""

from __future__ import annotations

import json

import pytest
from helpers import commit, git_init, gpu_shim

from thrust_remote.core.errors import UsageError
from thrust_remote.runs import usage


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= 5e-6  # both rounded to 6 decimals on the host


@pytest.mark.slow
def test_each_run_counts_its_gpus_and_the_summary_adds_them_per_host_and_job(cli, tmp_path):
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text("jobs:\n  nap:\n    command: [sh, -c, 'sleep 0.3']\n")
    commit(proj, "a job that takes a moment")
    gpu_host = gpu_shim(tmp_path)
    for extra, env in ((["--gpus", "2"], gpu_host), ([], gpu_host), ([], {})):
        result = cli("train", "nap", "--host", "local", *extra, cwd=proj, env=env)
        assert result.returncode == 0, result.stderr
    two, four, cpu = json.loads(cli("runs", "--host", "local", "--json", cwd=proj).stdout)  # oldest first
    for row in (two, four, cpu):
        assert row["wall_hours"] > 0
    assert _close(two["gpu_hours"], 2 * two["wall_hours"])  # --gpus 2: the two chosen
    assert _close(four["gpu_hours"], 4 * four["wall_hours"])  # none chosen: every GPU the job could see
    assert cpu["gpu_hours"] == 0.0  # a CPU host: no GPU time
    summary = cli("runs", "--host", "local", "--summary", "--since", "1h", "--json", cwd=proj)
    assert summary.returncode == 0, summary.stderr
    (total,) = json.loads(summary.stdout)
    assert total["host"] == "local" and total["job"] == "nap" and total["runs"] == 3
    assert abs(total["gpu_hours"] - (two["gpu_hours"] + four["gpu_hours"])) <= 1e-4
    plain = cli("runs", "--host", "local", "--summary", cwd=proj)
    assert plain.stdout.splitlines()[0].split() == ["host", "job", "runs", "wall_hours", "gpu_hours"]
    bad = cli("runs", "--host", "local", "--since", "7d", cwd=proj)
    assert bad.returncode == 64 and "--since goes with --summary" in bad.stderr


def test_the_summary_keeps_only_runs_started_within_since_and_skips_hosts_that_failed():
    now = 1_800_000_000.0
    rows = [
        {"host": "gpu", "job": "ppo", "started_at": "2027-01-15T08:00:00Z", "wall_hours": 1.0, "gpu_hours": 8.0},
        {"host": "gpu", "job": "ppo", "started_at": "2020-01-01T00:00:00Z", "wall_hours": 5.0, "gpu_hours": 40.0},
        {"host": "gpu", "job": "dqn", "started_at": "2027-01-15T07:00:00Z", "wall_hours": 0.5, "gpu_hours": None},
        {"host": "down", "error": "no answer within 10 s"},
        {"host": "gpu", "job": "ppo", "started_at": None, "wall_hours": None, "gpu_hours": None},  # never started
    ]
    recent = usage.summarize(rows, since_s=usage.parse_since("7d"), now=now)
    assert recent == [{"host": "gpu", "job": "dqn", "runs": 1, "wall_hours": 0.5, "gpu_hours": 0.0},
                      {"host": "gpu", "job": "ppo", "runs": 1, "wall_hours": 1.0, "gpu_hours": 8.0}]
    everything = usage.summarize(rows)
    assert everything[1]["gpu_hours"] == 48.0 and everything[1]["runs"] == 2  # the never-started one is no run
    for text, seconds in (("30m", 1800), ("24h", 86400), ("2w", 1_209_600), ("90s", 90)):
        assert usage.parse_since(text) == seconds
    with pytest.raises(UsageError):
        usage.parse_since("7 days")
