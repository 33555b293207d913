"""`wait`'s end line leads with the job's `objective: {metric:}` as the live line does (a TensorBoard
job's tags come sorted by name), and Lightning's placeholder `hp_metric` (-1 at every step when the job
logs no hparams metric) takes no place on any line (issue 53 leftovers, items 3 and 4). Real runs over
the `sshd` host, and the rendering alone beside them."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir
from rich.console import Console

from thrust_remote.cli.follow import LogView
from thrust_remote.runs.progress import RunProgress

pytestmark = pytest.mark.xdist_group("test_wait_objective")

# Lightning's tags as its TensorBoardLogger writes them for a job without an hparams metric
TB_PY = '''\
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("tbruns")
for step in (10, 20, 30):
    writer.add_scalar("hp_metric", -1, step)
    writer.add_scalar("train/acc", 0.99 + step / 10000, step)
    writer.add_scalar("val/acc", 0.9 + step / 1000, step)
writer.close()
print("wrote", flush=True)
'''

JOBS = """\
jobs:
  tb:
    script: tb.py
    metrics: {tensorboard: tbruns}
    objective: {metric: val/acc, mode: max}
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "wait-objective"
    return new_project(tmp_path_factory.mktemp("waitobj") / "project", sshd, workdir, files={"tb.py": TB_PY},
                       jobs=JOBS, message="a Lightning-like TensorBoard job")


def test_waits_end_line_leads_with_the_objective_and_leaves_out_the_placeholder(cli, project):
    started = cli("train", "tb", "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"run (\S+) started", started.stdout).group(1)  # type: ignore[union-attr]
    got = cli("wait", run_id, cwd=project)
    assert got.returncode == 0, got.stderr
    assert f"{run_id}: FINISHED (exit code 0) (step 30, val/acc 0.93, train/acc 0.993)" in got.stderr, got.stderr


def test_the_live_line_in_a_pipe_leaves_out_the_placeholder(cli, project):
    got = cli("train", "tb", cwd=project, env={"COLUMNS": "160"})
    assert got.returncode == 0, got.stderr
    lines = [line for line in got.stdout.splitlines() if "val/acc 0.93" in line]
    assert lines and "hp_metric" not in lines[-1] and "train/acc 0.993" in lines[-1], got.stdout


# ------------------------------------------------------------------------------------------ rendering

def test_the_placeholder_is_left_out_only_while_it_has_been_minus_one_at_every_step():
    progress = RunProgress()
    progress.take_metrics({"step": 1, "hp_metric": -1.0, "loss": -1.0})
    assert progress.shown() == {"step": 1, "loss": -1.0}  # another metric at -1 is the job's own
    assert progress.shown("hp_metric") == progress.metrics  # the job's objective: always shown
    progress.take_metrics({"step": 2, "hp_metric": 0.5})  # the job logs its own hparams metric
    progress.take_metrics({"step": 3, "hp_metric": -1.0})
    assert progress.shown()["hp_metric"] == -1.0


def test_a_plain_line_has_no_placeholder():
    buf = io.StringIO()
    out = Console(file=buf, width=160, force_terminal=False, color_system=None)
    with LogView("r1", "lines", out=out, interval=0.0) as view:
        view.take_metrics({"step": 10, "hp_metric": -1, "train/acc": 0.99})
    assert "r1: 10 steps  train/acc 0.99" in buf.getvalue() and "hp_metric" not in buf.getvalue(), buf.getvalue()
