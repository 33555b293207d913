"""The live line's final drawing (after the run ended) keeps the run's time at every width, and that
time is the run's own at its end: the figure its end line says (`done in 47.2 s`), rounded the same
way, never our clock's a poll later (issue 53 leftovers, items 1 and 2). A real reattach over the
`sshd` host on a 60-column terminal, and the rendering alone beside it (no sleeping to pass)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir, wait_until
from rich.console import Console

from thrust_remote.cli.follow import LogReporter, _layout

pytestmark = pytest.mark.xdist_group("test_final_drawing")

# a total and enough metrics that a 60-column line drops fields; a first report, then a wait for a
# file the test makes once the reattach has begun (a run older than its follow), then the rest
JOB_PY = '''\
import json
import os
import time

def report(step):
    print("THRUST_METRICS " + json.dumps({"step": step, "total_steps": 4, "loss": 1.0 / step,
          "reward": 0.25 * step, "entropy": 0.5, "kl": 0.01}), flush=True)

report(1)
waited = 0.0
while not os.path.exists("go") and waited < 300:
    time.sleep(0.1)
    waited += 0.1
for step in (2, 3, 4):
    report(step)
'''

JOBS = """\
jobs:
  counted:
    script: job.py
"""

TTY = {"COLUMNS": "60", "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "final-drawing"
    return new_project(tmp_path_factory.mktemp("final") / "project", sshd, workdir, files={"job.py": JOB_PY},
                       jobs=JOBS, message="a job with a total and several metrics")


def _last_frame(text: str) -> str:
    """What a terminal shows last of the live line: the text after its last erase, codes dropped."""
    tail = text[text.rindex("\x1b[2K"):]
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tail).strip().splitlines()[0]


def test_a_reattached_follows_final_drawing_has_the_runs_time_as_its_end_line_says_it(cli, project):
    """`logs RUN -f` on a 60-column terminal, attached while the run waits: its final drawing ends with
    the run's time, the figure `done in` says, to the tenth."""
    started = cli("train", "counted", "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"run (\S+) started", started.stdout).group(1)  # type: ignore[union-attr]
    wait_until(lambda: "THRUST_METRICS" in cli("logs", run_id, cwd=project).stdout, 60, "the run's first report")
    cwd = Path(cli("status", run_id, "--json", cwd=project).stdout.split('"cwd": "')[1].split('"')[0])
    cwd.joinpath("go").write_text("go")  # the sshd host is this machine: the run goes on now
    got = cli.process("logs", run_id, "--follow", cwd=project, env=TTY)
    assert got.returncode == 0, got.stderr
    last = _last_frame(got.stdout)
    done = re.search(rf"FINISHED: run {run_id} on sandbox, done in ([\d.]+) s", got.stderr)
    assert done, got.stderr
    assert len(last) <= 60 and last.endswith(f"elapsed {done.group(1)} s"), (last, got.stderr)
    assert "4/4" in last, last


# ------------------------------------------------------------------------------------------ rendering

M = {"step": 300, "total_steps": 1000, "val/acc": 0.9812, "train/acc": 0.9988, "loss": 0.01, "sps": 1234}


@pytest.mark.parametrize("width", [160, 60, 40, 30, 16])
@pytest.mark.parametrize("total", [True, False])
def test_the_final_drawing_keeps_the_runs_time_at_every_width(width, total):
    m = M if total else {k: v for k, v in M.items() if k != "total_steps"}
    line = _layout(m, width, 47.25, True, objective="val/acc", final=True)[0]
    assert len(line) <= width, line
    assert line.endswith("47.2 s"), line
    if width >= 30:
        assert "val/acc 0.98" in line and line.endswith("elapsed 47.2 s"), line


def test_the_runs_time_at_its_end_is_what_the_follow_was_told_not_the_clock_a_poll_later():
    """The reporter is told the run's time at its end (its status's wall time) after the log ended:
    the final drawing says that figure, whenever our clock stopped."""
    buf = io.StringIO()
    reporter = LogReporter(True, out=Console(file=buf, width=60, force_terminal=True, color_system=None))
    reporter.running(40.0, "thrust-remote logs r1")  # a reattach: the run had gone 40 s
    reporter.following("r1", 0)
    reporter.metrics({"step": 4, "total_steps": 4, "loss": 0.25})
    reporter.running(47.23, "thrust-remote logs r1")  # its end, as its status says it
    reporter.followed()
    last = _last_frame(buf.getvalue())
    assert last.endswith("elapsed 47.2 s"), last


@pytest.mark.parametrize("width", [160, 60])
def test_the_final_drawing_has_no_eta_even_from_the_jobs_own_sps(width):
    line = _layout(M, width, 47.25, True, objective="val/acc", final=True)[0]
    assert "eta" not in line and "val/acc" in line, line
    assert "eta" in _layout(M, 160, 47.25, True, objective="val/acc")[0]  # while it runs
