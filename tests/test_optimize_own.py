"""`optimize` on jobs of your own (docs/optimize.md, "A job of your own"): a test project that is not this
repository, with its own script, run over the sshd fixture. The objective comes from THRUST_METRICS
lines or from TensorBoard scalars (written with torch.utils.tensorboard, read on the host); a metric
that never appears stops the study after its first trial. Plus the parsing underneath, without a host."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import new_project, remote_tempdir

from thrust_remote.agent import poll as agent_poll
from thrust_remote.agent import scalars
from thrust_remote.agent.protocol import AgentExit
from thrust_remote.core.config import load_config
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.host import payload
from thrust_remote.optimize.objective import objective_for
from thrust_remote.optimize.ownmonitor import value_at
from thrust_remote.optimize.space import search_space
from thrust_remote.optimize.usage import UsageSources, usage_error
from thrust_remote.runs.progress import own_metrics

# one worker runs this module's tests, in order: its tests count the runs in one shared workdir
pytestmark = pytest.mark.xdist_group("test_optimize_own")

# A score with its best at lr = 0.3, reported every 10 steps: as THRUST_METRICS lines, or as
# TensorBoard scalars with --tb DIR (then no THRUST_METRICS at all).
SCORE_PY = '''\
import argparse
import json
import os


parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--tb", default=None)
args = parser.parse_args()
writer = None
if args.tb:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(args.tb)
print("training with lr", args.lr, flush=True)
for step in range(10, args.steps + 1, 10):
    score = -((args.lr - 0.3) ** 2) * step / args.steps
    if writer is not None:
        writer.add_scalar("charts/score", score, step)
        writer.add_scalar("losses/other", 1.0, step)
    else:
        print("THRUST_METRICS " + json.dumps({"step": step, "charts/score": score, "loss": -score}), flush=True)
if writer is not None:
    writer.close()
'''

JOBS = """\
jobs:
  lines:
    script: score.py
    objective: {metric: charts/score, mode: max}
  loss:
    script: score.py
    objective: {metric: loss, mode: min}
  tb:
    script: score.py
    args: [--tb, tbruns]
    metrics: {tensorboard: tbruns}
    objective: {metric: charts/score, mode: max}
  typo:
    script: score.py
    objective: {metric: charts/scroe, mode: max}
  words:
    kind: command
    command: [sh, words.sh]
    objective: {metric: charts/score, mode: max}
  badflag:
    script: score.py
    objective: {metric: charts/score, mode: max}
search:
  lines: {lr: {low: 0.01, high: 1.0, log: true}}
  loss: {lr: {low: 0.01, high: 1.0, log: true}}
  tb: {lr: {low: 0.01, high: 1.0, log: true}}
  typo: {lr: {low: 0.01, high: 1.0, log: true}}
  words: {lr: {choices: [0.1, 0.3]}}
  badflag:
    lr: {low: 0.01, high: 1.0, log: true}
    momentum: {low: 0.1, high: 0.9}   # score.py has no --momentum: argparse exits 2
"""

# a command job: its parameters arrive as KEY=VALUE words
WORDS_SH = """\
#!/bin/sh
for w in "$@"; do case "$w" in lr=*) lr="${w#lr=}";; esac; done
echo "THRUST_METRICS {\\"step\\": 1, \\"charts/score\\": $lr}"
"""


@pytest.fixture(scope="module")
def own_project(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir): a fresh git repo of a user's own, not this repository."""
    workdir = remote_tempdir(sshd) / "own"
    proj = new_project(tmp_path_factory.mktemp("ownopt") / "project", sshd, workdir,
                       files={"score.py": SCORE_PY, "words.sh": WORDS_SH}, jobs=JOBS, message="my own project")
    return proj, workdir


def _optimize(cli, proj: Path, job: str, *extra: str):
    return cli("optimize", job, "--trials", "3", "--seed", "1", "--json", *extra, cwd=proj, timeout=400)


def _trial_args(workdir: Path, run_id: str) -> list[str]:
    return json.loads((workdir / ".thrust" / "runs" / run_id / "run.json").read_text())["argv"]


# ------------------------------------------------------------------------------------------ over SSH

@pytest.mark.slow
def test_thrust_metrics_objective_runs_n_trials_and_writes_the_best(cli, own_project):
    proj, workdir = own_project
    result = _optimize(cli, proj, "lines")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["counts"]["done"] == 3 and out["metric"] == "charts/score" and out["direction"] == "maximize"
    values = [t["value"] for t in out["trials"] if t["state"] == "COMPLETE"]
    assert out["best"]["value"] == max(values)
    best = yaml.safe_load(Path(out["best_params_file"]).read_text())
    assert best["params"]["lr"] == out["best"]["params"]["lr"] and best["job"] == "lines"
    # the parameter reached the script as `--lr VALUE`, and its value is the score the script printed
    for t in out["trials"]:
        argv = _trial_args(workdir, t["run_id"])
        lr = float(argv[argv.index("--lr") + 1])
        assert t["params"]["lr"] == pytest.approx(lr)
        if t["state"] == "COMPLETE":
            assert t["value"] == pytest.approx(-((lr - 0.3) ** 2))


@pytest.mark.slow
def test_min_objective_is_minimised(cli, own_project):
    proj, _ = own_project
    result = _optimize(cli, proj, "loss")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    values = [t["value"] for t in out["trials"] if t["state"] == "COMPLETE"]
    assert out["direction"] == "minimize" and out["best"]["value"] == min(values)


@pytest.mark.slow
def test_tensorboard_objective_is_read_on_the_host(cli, own_project):
    proj, workdir = own_project
    result = _optimize(cli, proj, "tb")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["counts"]["done"] == 3, out
    # each trial runs in a tree of its own (issue 53 item 18): its event files in its own tbruns/
    first = workdir / ".thrust" / "runs" / out["trials"][0]["run_id"] / "run.json"
    tree = Path(json.loads(first.read_text())["tree"])
    assert tree.parent == workdir / ".thrust" / "trees"
    assert list((tree / "tbruns").glob("events.out.tfevents.*")), "the script wrote no event files"
    for t in out["trials"]:
        argv = _trial_args(workdir, t["run_id"])
        lr = float(argv[argv.index("--lr") + 1])
        log = (workdir / ".thrust" / "runs" / t["run_id"] / "log").read_text()
        assert "THRUST_METRICS" not in log  # the value can only have come from the event files
        if t["state"] == "COMPLETE":
            # each trial's own events: another trial's, in another tree, never count
            assert t["value"] == pytest.approx(-((lr - 0.3) ** 2), rel=1e-5)
    best = yaml.safe_load(Path(out["best_params_file"]).read_text())
    assert best["params"]["lr"] == out["best"]["params"]["lr"]


@pytest.mark.slow
def test_command_job_gets_trial_params_as_words(cli, own_project):
    proj, _ = own_project
    result = cli("optimize", "words", "--trials", "2", "--seed", "2", "--json", cwd=proj, timeout=300)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert all(t["value"] == t["params"]["lr"] for t in out["trials"] if t["state"] == "COMPLETE")


@pytest.mark.slow
def test_metric_that_never_appears_stops_after_the_first_trial(cli, own_project):
    proj, workdir = own_project
    started = time.time()
    result = _optimize(cli, proj, "typo")
    assert result.returncode == 78, result.stderr
    err = " ".join(result.stderr.split())
    line = next(i for i, text in enumerate((proj / "thrust.yaml").read_text().splitlines(), 1)
                if "charts/scroe" in text)
    assert f"thrust.yaml:{line}: jobs.typo.objective" in err
    assert "'charts/scroe' never appeared" in err and "names seen: charts/score, loss" in err
    assert "Traceback" not in result.stderr
    runs = [d for d in (workdir / ".thrust" / "runs").iterdir()
            if d.name.startswith("typo-t") and d.stat().st_mtime >= started - 1]
    assert len(runs) == 1  # one trial, not three


@pytest.mark.slow
def test_a_usage_error_stops_the_study_after_one_trial_naming_the_flag_and_key(cli, own_project):
    proj, workdir = own_project
    started = time.time()
    result = _optimize(cli, proj, "badflag")
    assert result.returncode == 78, result.stderr
    err = " ".join(result.stderr.split())
    line = next(i for i, text in enumerate((proj / "thrust.yaml").read_text().splitlines(), 1)
                if text.strip().startswith("momentum:"))
    assert f"thrust.yaml:{line}: search.badflag.momentum: trial 0 exited 2 with a usage error " \
           "(unrecognized arguments: --momentum" in err
    assert "the job does not take --momentum" in err and "Traceback" not in result.stderr
    assert err.count("exited 2 with a usage error") == 1  # said once: the trial's line points to it
    assert "trial 0 failed: the study stops: the error below says why" in err
    runs = [d for d in (workdir / ".thrust" / "runs").iterdir()
            if d.name.startswith("badflag-t") and d.stat().st_mtime >= started - 1]
    assert len(runs) == 1  # one trial, not three identical failures


# ------------------------------------------------------------------------------------------ no host

def _config(tmp_path: Path, body: str):
    path = tmp_path / "thrust.yaml"
    path.write_text(body)
    return load_config(path)


def test_own_objective_and_space_come_from_thrust_yaml(tmp_path):
    cfg = _config(tmp_path, JOBS)
    o = objective_for(cfg, cfg.job("tb"), "auto")
    assert (o.metric, o.mode, o.source, o.direction) == ("charts/score", "max", "tensorboard", "maximize")
    assert objective_for(cfg, cfg.job("loss"), "auto").direction == "minimize"
    assert objective_for(cfg, cfg.job("lines"), "auto").source == "lines"
    assert set(search_space(cfg, cfg.job("lines"), {})) == {"lr"}  # any name: the script's own flags
    with pytest.raises(UsageError, match="--metric is the built-in trainer's"):
        objective_for(cfg, cfg.job("lines"), "return_mean")


def test_own_job_without_objective_or_search_is_a_config_error(tmp_path):
    cfg = _config(tmp_path, "jobs:\n  a:\n    script: a.py\n  b:\n    script: a.py\n"
                            "    objective: {metric: x, mode: max}\n")
    with pytest.raises(ConfigError, match=r"thrust.yaml:2: job 'a' has no objective"):
        objective_for(cfg, cfg.job("a"), "auto")
    with pytest.raises(ConfigError, match="has no search space"):
        search_space(cfg, cfg.job("b"), {})


def test_usage_errors_name_the_flag_and_where_it_came_from(tmp_path):
    cfg = _config(tmp_path, JOBS)
    sources = UsageSources(cfg, cfg.job("badflag"), {"steps": "5"})
    usage = "usage: score.py [-h] --lr LR [--steps STEPS] [--tb TB]\n"
    err = usage_error(2, f"training\n{usage}score.py: error: argument --lr: invalid float value: 'x'\n", 4, sources)
    assert err is not None and err.exit_code == 78
    line = JOBS.splitlines().index("    lr: {low: 0.01, high: 1.0, log: true}") + 1
    where = f"{tmp_path / 'thrust.yaml'}:{line}: search.badflag.lr"
    assert err.message.startswith(f"{where}: trial 4 exited 2 with a usage error "
                                  "(argument --lr: invalid float value: 'x'): the job refused --lr's value")
    err = usage_error(2, f"{usage}score.py: error: unrecognized arguments: --steps=5\n", 0, sources)
    assert err is not None and err.message.startswith("--set steps: trial 0")
    words = UsageSources(cfg, cfg.job("words"), {})
    err = usage_error(2, "usage: train [-h]\ntrain: error: unrecognized arguments: lr=0.1\n", 0, words)
    assert err is not None and "search.words.lr" in err.message and "does not take lr=0.1" in err.message
    # once a trial ran through, only a searched choice the job refuses stays fatal (later trials draw it again)
    refused = "usage: train [-h] [--lr {0.1}]\ntrain: error: argument --lr: invalid choice: '0.3' (choose from '0.1')\n"
    err = usage_error(2, refused, 5, words, only_choices=True)
    assert err is not None and "search.words.lr" in err.message and "invalid choice: '0.3'" in err.message
    assert usage_error(2, f"{usage}score.py: error: argument --lr: invalid float value: 'x'\n", 4, sources,
                       only_choices=True) is None  # a float range, not a choice: one trial's bad luck
    assert usage_error(2, f"{usage}score.py: error: unrecognized arguments: --steps=5\n", 0, sources,
                       only_choices=True) is None
    # not argparse's usage error: a plain failure, left to the usual count of failures
    assert usage_error(2, "Traceback ...\nValueError: x\n", 0, sources) is None
    assert usage_error(1, f"{usage}score.py: error: unrecognized arguments: --x\n", 0, sources) is None


def test_rungs_take_the_last_value_at_or_before_the_step():
    series = [(10, 1.0), (20, 2.0), (40, 4.0)]
    assert [value_at(series, s) for s in (5, 10, 25, 39, 40, 99)] == [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]


def test_progress_line_keys_of_your_own_job():
    assert own_metrics({"step": 3, "charts/r": 1.5, "ok": True, "name": "x", "loss": 2}) == [
        ("charts/r", 1.5), ("loss", 2.0)]
    assert own_metrics({"step": 3, "return_mean": 1.0, "loss_value": 2.0}) == []  # the trainer's


def test_poll_reads_thrust_metrics_lines_from_the_log(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "log").write_bytes(b'hello\nTHRUST_METRICS {"step": 1, "a": 2}\nnoise THRUST_METRICS x\n'
                              b'THRUST_METRICS {"step": 2, "a": 3}\r\nTHRUST_METRICS {"step": 3')
    got = agent_poll.poll([(str(run), 0, "log")], str(tmp_path / "stop"), 0)["runs"][str(run)]
    assert [json.loads(x) for x in got["data"].splitlines()] == [{"step": 1, "a": 2}, {"step": 2, "a": 3}]
    # the cut line is read whole on the next poll
    with open(run / "log", "ab") as fh:
        fh.write(b', "a": 4}\n')
    again = agent_poll.poll([(str(run), got["offset"], "log")], str(tmp_path / "stop"), 0)["runs"][str(run)]
    assert json.loads(again["data"]) == {"step": 3, "a": 4}


def test_scalars_reads_only_the_runs_own_event_files(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    events, run = tmp_path / "tb", tmp_path / "run"
    run.mkdir()
    old = SummaryWriter(str(events / "old"))
    old.add_scalar("m", -1.0, 5)
    old.close()
    # an older run's file: its name's creation time is before this run started
    for f in (events / "old").iterdir():
        stamp = int(f.name.split(".")[3])
        f.rename(f.with_name(f.name.replace(f".{stamp}.", f".{stamp - 100}.")))
    (run / "run.json").write_text(json.dumps({"started_ts": time.time()}))
    new = SummaryWriter(str(events / "new"))
    for step in (1, 2, 3):
        new.add_scalar("m", float(step), step)
    new.add_scalar("other", 0.0, 1)
    new.close()
    got = scalars.read_run(str(run), str(events), 1, "m")
    assert got == {"tags": ["m", "other"], "points": [[2, 2.0], [3, 3.0]]}


def test_scalars_without_tensorboard_says_so(tmp_path):
    """The agent's zipapp with a python that has no tensorboard (-I: no site-packages at all)."""
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(payload.agent().data)
    result = subprocess.run([sys.executable, "-I", "-S", str(pyz), "scalars", "--runs", "[]", "--tag", "m"],
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert result.returncode == AgentExit.REFUSED  # no tensorboard: refused, said as JSON
    assert json.loads(result.stdout)["error"] == "missing"


def test_follow_view_of_your_own_job_shows_its_metrics_never_its_json():
    import io

    from rich.console import Console

    from thrust_remote.cli.follow import LogView, progress_line

    buf = io.StringIO()
    out = Console(file=buf, width=100, force_terminal=False, color_system=None)
    with LogView("r1", "lines", out=out) as view:
        view.feed(b'epoch 1 done\nTHRUST_METRICS {"step": 200, "charts/episodic_return": 12.5, '
                  b'"losses/value_loss": 0.0031}\nTHRUST_METRICS {broken\nepoch 2 done\n')
    text = buf.getvalue()
    assert "epoch 1 done" in text and "epoch 2 done" in text  # plain lines pass through
    assert "{" not in text and "THRUST_METRICS" not in text
    assert "r1: 200 steps  charts/episodic_return 12.5  losses/value_loss 0.0031" in text
    narrow = progress_line({"step": 200, "charts/episodic_return": 12.5, "losses/value_loss": 0.0031}, 50)
    assert len(narrow) <= 50 and "episodic_return 12.5" in narrow


def test_a_study_rerun_with_another_search_names_what_changed_and_the_way_out():
    import optuna

    from thrust_remote.optimize.store import remember_settings

    class Warned:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def warn(self, message: str) -> None:
            self.lines.append(message)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, said = optuna.create_study(study_name="ppo"), Warned()
    remember_settings(study, {"job": "ppo", "space": {"lr": [0.1, 1.0]}, "metric": "score"}, said)
    assert said.lines == []
    remember_settings(study, {"job": "ppo", "space": {"lr": [0.01, 1.0]}, "metric": "score"}, said)
    (line,) = said.lines
    assert "study ppo was started with other settings (space changed)" in line
    assert "--study NEW_NAME" in line and "{" not in line  # no raw dict
