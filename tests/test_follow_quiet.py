"""Issue 53 items 14 and 15, and the live line of a quiet run: a reattach's time and end line are the
run's and train's; `wait` in a pipe says the runs now and then and what their end pull brought; a pull
of a job without `checkpoints:` says what came; a pattern with a `total` group gives %, bar and ETA; a
run without log or metrics for long says it may be stuck. Real runs over the `sshd` host, and the
rendering alone beside them (a driven clock: nothing here sleeps to pass)."""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir, wait_until
from rich.console import Console

from thrust_remote.cli import follow, runs
from thrust_remote.cli.follow import FILLED, LogView, _layout, stuck_line
from thrust_remote.runs.progress import LinePattern, RunProgress
from thrust_remote.runs.pull import Pulled

pytestmark = pytest.mark.xdist_group("test_follow_quiet")

# silent 4 s (the reattach comes after, so the run is older than its follow), a line, silent 6 s (a
# quiet stretch past the threshold the test sets) or, given "gate", silent until a file `go` appears in
# its cwd (the test makes it once the follow has said the run is quiet: a busy machine may attach the
# follow after a fixed stretch is over), the rest; an artifact (from the start, rewritten at the end)
# and a checkpoint in out/
COUNTED_PY = '''\
import os
import sys
import time

quiet = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
os.makedirs("out", exist_ok=True)
with open("out/result.txt", "w") as fh:
    fh.write("started")
time.sleep(quiet)
print("it 1/4 loss 0.9", flush=True)
if sys.argv[2:] == ["gate"]:
    waited = 0.0
    while not os.path.exists("go") and waited < 300:
        time.sleep(0.1)
        waited += 0.1
else:
    time.sleep(quiet * 1.5)
for i in range(2, 5):
    print(f"it {i}/4 loss {1.0 / i:.3f}", flush=True)
with open("out/ckpt-4.pt", "w") as fh:
    fh.write("4")
with open("out/result.txt", "w") as fh:
    fh.write("done")
'''

# a job whose numbers are TensorBoard scalars only (no THRUST_METRICS, nothing a pattern reads)
TB_PY = '''\
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("tbruns")
for step in (10, 20, 30):
    writer.add_scalar("charts/score", step / 10, step)
writer.close()
print("wrote", flush=True)
'''

PATTERN = "it (?P<step>\\\\d+)/(?P<total>\\\\d+) loss (?P<loss>[\\\\d.]+)"
JOBS = f"""\
jobs:
  counted:
    script: counted.py
    args: ["4", "gate"]
    metrics: {{pattern: "{PATTERN}"}}
  artifacts_only:
    script: counted.py
    args: ["4"]
    artifacts: ["out/result.txt"]
  checkpointed:
    script: counted.py
    checkpoints: out/ckpt-*.pt
    artifacts: ["out/ckpt-*.pt"]
  tb:
    script: tb.py
    metrics: {{tensorboard: tbruns}}
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "quiet"
    return new_project(tmp_path_factory.mktemp("quiet") / "project", sshd, workdir,
                       files={"counted.py": COUNTED_PY, "tb.py": TB_PY}, jobs=JOBS, message="a job that counts to 4")


def _run_id(text: str) -> str:
    return re.search(r"launching run (\S+)", text).group(1)  # type: ignore[union-attr]


def _detached(cli, project: Path, job: str) -> str:
    started = cli("train", job, "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    return _run_id(started.stdout + started.stderr)


def test_a_reattach_shows_the_runs_time_its_pattern_total_a_quiet_stretch_and_trains_end_line(
        cli, project, monkeypatch):
    """`logs RUN -f` (a pipe) after the run has gone 4 s: elapsed from the run's start, not from zero;
    the pattern's `total` gives 100% and 4/4 steps; the quiet stretch after the first line (threshold
    set to 1 s; it lasts until the view said so) says the job may be stuck with the command that shows
    its log; the end line is train's."""
    monkeypatch.setattr(follow, "STUCK_AFTER_S", 1.0)
    monkeypatch.setattr(follow, "IDLE_EVERY_S", 0.1)
    said = threading.Event()
    real_line = follow.stuck_line

    def stuck_line(*args, **kwargs):  # the real line, and a word to the gate below that it was said
        said.set()
        return real_line(*args, **kwargs)

    monkeypatch.setattr(follow, "stuck_line", stuck_line)
    run_id = _detached(cli, project, "counted")
    wait_until(lambda: "it 1/4" in cli("logs", run_id, cwd=project).stdout, 60, "the run's first line")
    cwd = json.loads(cli("status", run_id, "--json", cwd=project).stdout)["cwd"]

    def open_gate() -> None:  # the job's quiet stretch lasts until the follow has said it is quiet
        said.wait(120)
        Path(cwd, "go").write_text("go")

    gate = threading.Thread(target=open_gate, daemon=True)
    gate.start()
    got = cli("logs", run_id, "--follow", cwd=project, env={"COLUMNS": "60"})  # narrow, and a pipe
    gate.join(5)
    assert got.returncode == 0, got.stderr
    out = got.stdout
    assert f"{run_id}: 100%  4/4 steps" in out, out
    elapsed = [int(s) for s in re.findall(r"elapsed (\d+)s", out)]
    assert elapsed and max(elapsed) >= 4, out  # the run's 4 silent seconds are in it
    assert "no log or metrics for " in out and f"the job may be stuck; thrust-remote logs {run_id}" in out, out
    done = re.search(rf"FINISHED: run {run_id} on sandbox, done in ([\d.]+) s", got.stderr)
    assert done and float(done.group(1)) >= 4, got.stderr


def test_wait_in_a_pipe_says_the_runs_and_what_the_pull_brought_for_a_job_without_checkpoints(cli, project):
    """`wait` (stderr a pipe) says the run going at once, the pull of a job without `checkpoints:` says
    the files that came (never "no checkpoint yet"), and the pull at its end says what it brought."""
    run_id = _detached(cli, project, "artifacts_only")
    got = cli("wait", run_id, "--sync-every", "1", cwd=project, env={"COLUMNS": "60"})
    assert got.returncode == 0, got.stderr
    err = " ".join(got.stderr.split())
    assert f"{run_id}: RUNNING" in err or f"{run_id}: QUEUED" in err, err
    assert "no checkpoint yet" not in err, err
    assert "of its artifacts" in err and "the job names no checkpoints:" in err, err
    assert f"{run_id}: artifacts: 1 file(s) in" in err, err
    assert f"{run_id}: FINISHED" in err, err


def test_artifacts_that_are_the_checkpoints_are_not_said_to_match_nothing(cli, project):
    """The artifacts glob matches only the checkpoint: it comes as an artifact and as the checkpoint (one
    file, linked: issue 56 item 3), and the end says so, never "nothing matched"."""
    got = cli("train", "checkpointed", cwd=project)
    assert got.returncode == 0, got.stderr
    err = " ".join(got.stderr.split())
    assert "nothing matched on the host, nothing fetched" not in err, err
    assert "ckpt-4.pt is also artifacts/out/ckpt-4.pt (a hard link)" in err, err


def test_waits_end_line_has_a_tensorboard_jobs_last_scalars(cli, project):
    """A job whose metrics are TensorBoard scalars: `wait`'s end line has them, as for THRUST_METRICS."""
    run_id = _detached(cli, project, "tb")
    got = cli("wait", run_id, cwd=project)
    assert got.returncode == 0, got.stderr
    assert f"{run_id}: FINISHED (exit code 0) (step 30, charts/score 3)" in got.stderr, got.stderr


# ------------------------------------------------------------------------------------ the rendering


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _view(mode: str = "lines", **kw) -> tuple[LogView, io.StringIO, Clock]:
    buf, clock = io.StringIO(), Clock()
    out = Console(file=buf, width=60, force_terminal=False, color_system=None)
    view = LogView("r1", mode, out=out, clock=clock, interval=0.0, **kw)
    return view, buf, clock


def test_a_pattern_with_a_total_group_gives_percent_steps_and_an_eta_from_the_pace():
    pattern = LinePattern(r"(?P<step>\d+)/(?P<total>\d+) loss (?P<loss>[\d.]+)")
    assert pattern.read("1200/50000 loss 0.5") == {"step": 1200, "total_steps": 50000, "loss": 0.5}
    progress = RunProgress(pattern)
    progress.take_block(b"100/1000 loss 1.0\n200/1000 loss 0.5\n", shown=False)
    assert progress.metrics == {"step": 200, "total_steps": 1000, "loss": 0.5}
    view, buf, clock = _view()
    view.progress.pattern = pattern
    view.feed(b"100/1000 loss 1.0\n")
    clock.now += 10.0  # 100 steps in 10 s: 800 left take 80 s
    view.feed(b"200/1000 loss 0.5\n")
    assert view.eta() == pytest.approx(80.0)
    assert "20%  200/1,000 steps  eta 1m20s" in buf.getvalue()
    line, filled = _layout(view.progress.metrics, 60, view.elapsed(), True, eta=view.eta())
    assert len(line) <= 60 and line.startswith(FILLED) and "20%" in line and filled > 0, line


def test_a_quiet_run_says_it_may_be_stuck_piped_and_live_at_60_columns():
    view, buf, clock = _view(stuck_after=600.0, logs_hint="thrust-remote logs r1 --host box")
    view.feed(b"epoch 1\n")
    clock.now += 599.0
    view.tick()
    assert "stuck" not in buf.getvalue()
    clock.now += 121.0
    view.tick()
    view.tick()  # said once per threshold, not every tick
    said = buf.getvalue()
    assert said.count("no log or metrics for 12m00s — the job may be stuck; thrust-remote logs r1 --host box") == 1
    view.feed(b"epoch 2\n")
    assert view.stuck_for() is None
    narrow = stuck_line(720.0, "thrust-remote logs r1 --host box", 60)
    assert len(narrow) <= 60 and "12m00s" in narrow and "stuck" in narrow


def test_a_queued_run_is_waiting_not_stuck():
    view, _, clock = _view(queued="queued on box (position 2): starts when what it asks frees")
    clock.now += 3600.0
    assert view.stuck_for() is None


def test_a_pull_of_a_job_without_checkpoints_says_what_came():
    said = Pulled(0.0, None, 219, 5_500_000, 0.4, checkpoints=False).text()
    assert said.startswith("pulled 219 file(s), 5,500,000 bytes of its artifacts") and "no checkpoint yet" not in said
    assert "the job names no checkpoints:" in said


def test_wait_says_its_runs_at_most_every_interval(monkeypatch):
    clock = Clock()
    shown = runs._WaitShown(every=60.0, clock=clock)
    said: list[str] = []
    monkeypatch.setattr(runs, "say", said.append)
    st = {"run_id": "r1", "state": "RUNNING", "wall_hours": 0.5}
    shown.going([st], lambda _: {"step": 3, "total_steps": 10, "loss": 0.25})
    clock.now += 30.0
    shown.going([st], lambda _: {})
    clock.now += 31.0
    shown.going([st], lambda _: {})
    assert said == ["r1: RUNNING 30m00s (step 3/10, loss 0.25)", "r1: RUNNING 30m00s"]
