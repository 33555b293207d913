"""A job's `max_duration:` on the host `local` and the rules around it (the same stop over SSH, over two
nodes and on the Slurm cluster: tests/test_backends.py). The run is stopped by its own supervisor at
that age, TERM first, and ends STOPPED [max-duration]; `retry:` continues it only when `on:` names
max-duration; a value it cannot be is refused at its line (78) or as a usage error (64), before anything
runs; a cluster's time limit is set past the stop when the host's `time:` is unset."""

from __future__ import annotations

import json
import re

import pytest
from backend_hosts import CKPT_SH
from helpers import commit, git_init

from thrust_remote.agent.protocol import RunState
from thrust_remote.core.durations import parse_duration
from thrust_remote.core.scheduler import SlurmConfig, sbatch_options
from thrust_remote.run.resume import event_of

CKPT_JOB = "    command: [sh, ckpt.sh]\n    checkpoints: ckpt/*.txt\n    resume: [--resume-from, '{checkpoint}']\n"


def _project(path, jobs: str):
    proj = git_init(path)
    (proj / "ckpt.sh").write_text(CKPT_SH)
    (proj / "thrust.yaml").write_text("jobs:\n" + jobs)
    commit(proj, "a project whose job runs until stopped")
    return proj


def _run_id(stderr: str) -> str:
    return re.search(r"launching run (\S+)", stderr).group(1)


@pytest.mark.e2e
def test_a_local_run_is_stopped_at_its_max_duration_term_first_and_not_retried_by_default(cli, tmp_path):
    proj = _project(tmp_path / "p", "  ckpt:\n" + CKPT_JOB + "    max_duration: 2\n    retry: {max: 1}\n")
    done = cli("train", "ckpt", "--host", "local", cwd=proj)
    said = done.stdout + done.stderr
    assert done.returncode == 143, said  # STOPPED: the job's exit, as a stop on request
    run_id = _run_id(done.stderr)
    assert f"run {run_id} ended STOPPED (exit code 143) [max-duration: it reached its max_duration of 2s]" in said
    assert "stopped at step 7" in said  # its TERM handler ran
    assert "retry" not in said  # retry's default `on:` (host-lost, lost) leaves a stop at its bound stopped
    st = cli("status", run_id, "--host", "local", "--json", cwd=proj)
    assert '"reason": "max-duration"' in st.stdout, st.stdout


@pytest.mark.e2e
def test_retry_on_max_duration_resumes_the_run_from_its_checkpoint(cli, tmp_path):
    proj = _project(tmp_path / "p", "  ckpt:\n" + CKPT_JOB + "    max_duration: 2\n"
                    "    retry: {max: 1, on: [max-duration]}\n")
    done = cli("train", "ckpt", "--host", "local", cwd=proj)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "it reached its max_duration; retry 1 of 1" in said, said
    assert "resumed from step 7" in said and "FINISHED" in said, said


@pytest.mark.core
def test_a_max_duration_it_cannot_be_is_refused_at_its_line_and_on_the_command_line(cli, tmp_path):
    proj = _project(tmp_path / "p", "  ckpt:\n" + CKPT_JOB + "    max_duration: 8 hours\n")
    bad = cli("train", "ckpt", "--host", "local", cwd=proj)
    assert bad.returncode == 78, bad.stderr
    said = ("thrust.yaml:6: jobs.ckpt.max_duration: expected a duration like 8h, 1h30m, 90m "
            "(whole numbers with d, h, m, s)")
    assert said in bad.stderr and "got str '8 hours'" in bad.stderr, bad.stderr
    (proj / "thrust.yaml").write_text("jobs:\n  ckpt:\n" + CKPT_JOB)
    flag = cli("train", "ckpt", "--host", "local", "--max-duration", "-5m", cwd=proj)
    assert flag.returncode == 64 and "--max-duration -5m: expected a duration like 8h" in flag.stderr, flag.stderr
    assert not (proj / ".thrust" / "runs").exists()  # nothing ran


@pytest.mark.core
@pytest.mark.parametrize(("text", "seconds"), [("8h", 28800), ("1h30m", 5400), ("90m", 5400), ("2d", 172800),
                                               ("45s", 45), ("3600", 3600), (120, 120), ("0.5", 0.5)])
def test_durations_as_users_write_them(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.core
@pytest.mark.parametrize("text", ["", "h", "8 hours", "1m2h", "-1h", "0", 0, True, "367d", "nan", None])
def test_durations_it_cannot_be(text):
    with pytest.raises(ValueError, match="a duration like 8h"):
        parse_duration(text)


@pytest.mark.core
def test_a_clusters_time_limit_is_set_past_the_stop_unless_the_host_sets_it():
    bare = SlurmConfig(partition="debug")
    assert not any(o.startswith("--time") for o in sbatch_options(bare))
    # 2 h of job and 60 s of grace, then the limit warning (default) and a minute: the warning never comes first
    limit = int(next(o for o in sbatch_options(bare, stops_at=7260) if o.startswith("--time="))[7:])
    assert limit * 60 >= 7260 + bare.limit_warning + 60 and limit * 60 < 7260 + bare.limit_warning + 120
    own = SlurmConfig(partition="debug", time="04:00:00")
    assert [o for o in sbatch_options(own, stops_at=7260) if o.startswith("--time")] == ["--time=04:00:00"]


@pytest.mark.core
def test_a_stop_at_max_duration_is_its_own_retry_event_never_a_timeout():
    stopped = {"state": RunState.STOPPED.value, "reason": "max-duration"}
    assert event_of(stopped) == "max-duration"
    assert event_of({"state": RunState.STOPPED.value, "reason": "user"}) is None
    assert event_of({"state": RunState.FAILED.value, "reason": "timeout"}) == "timeout"


@pytest.mark.e2e
def test_a_resumed_run_keeps_the_bound_its_run_was_given(cli, tmp_path):
    proj = _project(tmp_path / "p", "  ckpt:\n" + CKPT_JOB)
    first = cli("train", "ckpt", "--host", "local", "--max-duration", "2", cwd=proj)
    assert first.returncode == 143, first.stdout + first.stderr
    resumed = cli("resume", _run_id(first.stderr), "--host", "local", "--detach", cwd=proj)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    second = _run_id(resumed.stderr)
    record = json.loads((proj / ".thrust" / "runs" / second / "run.json").read_text())
    assert record["max_duration"] == 2.0, record  # train --max-duration's bound, not none


@pytest.mark.core
def test_a_narrow_terminal_drops_a_states_reason_before_it_cuts_a_run_id():
    import io

    from rich.console import Console

    from thrust_remote.cli.runs import COLUMNS, _print_table

    run_id = "ppolong-20261202-011706-eb3d"
    row = ("ppolong", "STOPPED [max-duration]", "143", "2026-12-02T01:17:06Z", "2026-12-02T01:17:26Z",
           "fe8d8a03aa11", "", run_id)
    for width, state in ((50, "STOPPED"), (160, "STOPPED [max-duration]")):
        out = io.StringIO()
        _print_table(COLUMNS, [row], out=Console(file=out, width=width, force_terminal=True, color_system=None))
        shown = out.getvalue()
        assert run_id in shown and state in shown and "…" not in shown, (width, shown)


@pytest.mark.e2e
def test_resume_takes_a_bound_of_its_own_and_train_json_says_why_the_run_stopped(cli, tmp_path):
    proj = _project(tmp_path / "p", "  ckpt:\n" + CKPT_JOB)
    first = cli("train", "ckpt", "--host", "local", "--max-duration", "1", "--json", cwd=proj)
    out = json.loads(first.stdout)
    assert (out["state"], out["reason"], out["reason_detail"]) == \
        ("STOPPED", "max-duration", "it reached its max_duration of 1s"), out
    bad = cli("resume", out["run_id"], "--host", "local", "--max-duration", "soon", cwd=proj)
    assert bad.returncode == 64 and "--max-duration soon: expected a duration like 8h" in bad.stderr, bad.stderr
    resumed = cli("resume", out["run_id"], "--host", "local", "--detach", "--max-duration", "90m", cwd=proj)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    record = json.loads((proj / ".thrust" / "runs" / _run_id(resumed.stderr) / "run.json").read_text())
    assert record["max_duration"] == 5400.0, record  # resume's own bound, over the run's 1 s
