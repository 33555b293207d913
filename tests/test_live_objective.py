"""Issue 56 item 4: the live line leads with the job's `objective: {metric:}` (a TensorBoard scalar of
that name included) at every width, then what fits; its last drawing once the run ended is final (the
run's last values, no eta, no quiet-run warning, its time at the end); a `metrics: {pattern:}` that
matched none of the lines the job printed says so on the line. Real runs over the `sshd` host (a pipe
and a terminal, COLUMNS=60), and the rendering alone beside them (a driven clock: nothing sleeps)."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir
from rich.console import Console

from thrust_remote.cli.follow import LogView, progress_line

pytestmark = pytest.mark.xdist_group("test_live_objective")

# Lightning's TensorBoard tags, sorted as the host reads them: hp_metric and train/* before val/acc
TB_PY = '''\
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("tbruns")
for step in (10, 20, 30):
    writer.add_scalar("hp_metric", -1, step)
    writer.add_scalar("train/acc", 0.99 + step / 10000, step)
    writer.add_scalar("train/loss", 1.0 / step, step)
    writer.add_scalar("val/acc", 0.9 + step / 1000, step)
writer.close()
print("wrote", flush=True)
'''

# what a Rich progress bar leaves in a pipe: lines of its own, none the pattern reads
QUIET_PY = '''\
for i in range(120):
    print(f"Epoch 0: {i}/120", flush=True)
'''

JOBS = """\
jobs:
  tb:
    script: tb.py
    metrics: {tensorboard: tbruns}
    objective: {metric: val/acc, mode: max}
  unmatched:
    script: quiet.py
    metrics: {pattern: "loss=(?P<loss>[0-9.]+)"}
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "objective"
    return new_project(tmp_path_factory.mktemp("objective") / "project", sshd, workdir,
                       files={"tb.py": TB_PY, "quiet.py": QUIET_PY}, jobs=JOBS, message="TensorBoard and a pattern")


def _run_id(text: str) -> str:
    return re.search(r"following (\S+)", text).group(1)  # type: ignore[union-attr]


def _last_frame(text: str) -> str:
    """What a terminal shows last of the live line: the text after its last erase, codes dropped."""
    tail = text[text.rindex("\x1b[2K"):]
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", tail).strip().splitlines()[0]


def test_a_tensorboard_jobs_objective_leads_its_line_in_a_narrow_pipe(cli, project):
    """COLUMNS=60, piped: the line leads with val/acc at its last value (step 30), before steps and the
    tags sorted before it (hp_metric, train/acc); `logs -f` of the ended run too."""
    got = cli("train", "tb", cwd=project, env={"COLUMNS": "60"})
    assert got.returncode == 0, got.stderr
    run_id = _run_id(got.stderr)
    lines = [line for line in got.stdout.splitlines() if line.startswith(f"{run_id}: ")]
    assert lines and lines[-1].startswith(f"{run_id}: val/acc 0.93  30 steps"), got.stdout
    again = cli("logs", run_id, "--follow", cwd=project, env={"COLUMNS": "60"})  # a reattach: the same job's line
    assert again.returncode == 0, again.stderr
    assert f"{run_id}: val/acc 0.93  30 steps" in again.stdout, again.stdout


def test_on_a_narrow_terminal_the_last_drawing_is_the_objectives_final_value(cli, project):
    """A terminal of 60 columns (rich told so): the live line's last drawing has val/acc at step 30, no
    eta; a pattern that read none of 120 lines says so as the line's last word."""
    env = {"COLUMNS": "60", "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    got = cli.process("train", "tb", cwd=project, env=env)
    assert got.returncode == 0, got.stderr
    last = _last_frame(got.stdout)
    assert last.startswith("val/acc 0.93  30 steps") and "eta" not in last and len(last) <= 60, repr(got.stdout)
    quiet = cli.process("train", "unmatched", cwd=project, env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert _last_frame(quiet.stdout) == "metrics pattern matched none of 120 lines", repr(quiet.stdout)


def test_a_pattern_that_matched_nothing_says_so_in_a_pipe(cli, project):
    got = cli("train", "unmatched", cwd=project, env={"COLUMNS": "60"})
    assert got.returncode == 0, got.stderr
    run_id = _run_id(got.stderr)
    assert f"{run_id}: metrics pattern matched none of 120 lines" in got.stdout, got.stdout


# ------------------------------------------------------------------------------------------ rendering

SCALARS = {"step": 300, "hp_metric": -1.0, "train/acc": 0.9988, "train/loss": 0.01, "val/acc": 0.9812}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _console(width: int, terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=terminal, color_system=None), buf


@pytest.mark.parametrize("width", [160, 60, 30, 16])
@pytest.mark.parametrize("total", [None, 1000])
def test_the_objective_leads_at_every_width(width, total):
    m = {**SCALARS, **({"total_steps": total} if total else {})}
    line = progress_line(m, width, elapsed=65.0, objective="val/acc")
    assert len(line) <= width
    assert "val/acc 0.98" in line, line
    assert line.index("val/acc") < (line.index("hp_metric") if "hp_metric" in line else len(line))
    if width >= 60:
        assert "300" in line  # then the steps


def test_at_160_columns_what_fits_after_the_objective_and_a_plain_line_keeps_a_few():
    wide = progress_line(SCALARS, 160, elapsed=65.0, objective="val/acc")
    assert wide.startswith("val/acc 0.9812  300 steps  hp_metric -1  train/acc 0.9988  train/loss 0.01"), wide
    plain = progress_line(SCALARS, None, elapsed=65.0, objective="val/acc")
    assert plain == "val/acc 0.9812  300 steps  hp_metric -1  train/acc 0.9988  train/loss 0.01  elapsed 1m05s"
    assert "val/acc" not in progress_line(SCALARS, 60, elapsed=65.0)  # no objective: as the job wrote them


def test_the_last_drawing_after_the_end_has_the_last_values_no_eta_and_the_runs_time():
    clock = Clock()
    out, buf = _console(100, terminal=True)
    with LogView("run-1", "live", out=out, clock=clock, objective="val/acc") as view:
        view.take_metrics({"step": 100, "total_steps": 1000, "val/acc": 0.5})
        clock.now += 10
        view.take_metrics({"step": 200, "total_steps": 1000, "val/acc": 0.6})  # a pace: an eta
        assert view.eta() is not None
        clock.now += 5
        view.take_metrics({"step": 250, "val/acc": 0.75})  # the end's last read of the scalars
    clock.now += 3600  # long after: the drawing stays as it was at the end
    assert view.elapsed() == 15.0
    last = _last_frame(buf.getvalue())
    assert "val/acc 0.75" in last and "250/1,000 steps" in last and "eta" not in last, last
    assert last.endswith("elapsed 15.0 s"), last  # the run's time, as its end line says it


def test_a_pattern_that_matched_none_of_the_lines_says_so_first():
    clock = Clock()
    out, buf = _console(60, terminal=False)
    with LogView("run-1", "lines", out=out, clock=clock, pattern=True) as view:
        view.feed(b"".join(b"Epoch 0: %d/3\n" % i for i in range(3)))
        assert view.waiting_line().startswith("metrics pattern matched none of 3 lines  elapsed")
        view.take_metrics({"loss": 0.5})  # a match: nothing to say
        assert view.unmatched() is None
    without = LogView("run-2", "lines", out=out, clock=clock)
    without.feed(b"a\n")
    assert without.unmatched() is None  # no pattern: nothing it could have missed
