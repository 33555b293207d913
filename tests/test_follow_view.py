"""The log follower at the CLI edge: no THRUST_* JSON ever reaches the screen; the terminal view lays
its progress line out for the width it has (bar kept, whole fields dropped); without a terminal one
plain progress line every few seconds and at the end; `raw` copies the bytes exactly."""

from __future__ import annotations

import io
import os
import re
import subprocess
import time

import pytest
from helpers import EXE, clone_repo
from rich.console import Console

from thrust_remote.cli.follow import EMPTY, FILLED, LogView, _fields, progress_line

CHUNKS = [
    b"starting\nTHRUST_INFO {\"device\": \"cpu\"}\nTHRUST_MET",
    b'RICS {"step": 0, "total_steps": null, "return_mean": null, "sps": null}\n',
    b'THRUST_METRICS {"step": 4096, "total_steps": 8192, "return_mean": 12.5, "sps": 30000.0, "gpu_util": null}\n',
    "caf\u00e9 \u2713 half a ".encode()[:-1],
    "caf\u00e9 \u2713 half a ".encode()[-1:] + b"line\nTHRUST_METRICS not json\nno newline at the end",
]
METRICS = {"step": 25_000, "total_steps": 60_000, "sps": 31_234.5, "return_mean": 212.53, "gpu_util": 97,
           "loss_value": 0.5}
SNAKE = {"step": 1_200_000, "total_steps": 8_000_000, "sps": 61_234.5, "return_mean": -0.7, "score_mean": 3.5}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _console(width: int = 80, terminal: bool = False) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=width, force_terminal=terminal, color_system=None), buf


def _metrics_line(step: int, total: int = 60_000) -> bytes:
    return f'THRUST_METRICS {{"step": {step}, "total_steps": {total}, "return_mean": 20.0, "sps": 1000.0}}\n'.encode()


def test_terminal_view_takes_nulls_split_lines_and_junk():
    out, buf = _console(terminal=True)
    with LogView("run-1", "live", out=out) as view:
        for chunk in CHUNKS:
            view.feed(chunk)
    assert view.last["step"] == 4096
    assert view.last["return_mean"] == 12.5
    text = buf.getvalue()
    assert "THRUST_" not in text
    assert "café ✓ half a line" in text and "no newline at the end" in text
    assert " 50%" in text and FILLED in text


def test_raw_view_copies_bytes_exactly(capfdbinary):
    with LogView("run-1", "raw") as view:
        for chunk in CHUNKS:
            view.feed(chunk)
    out = capfdbinary.readouterr().out
    assert out == b"".join(CHUNKS)
    assert view.last["total_steps"] == 8192


def test_lines_view_prints_one_readable_line_every_interval_and_at_the_end():
    """Without a terminal (a pipe, CI): ~130 raw JSON lines used to scroll past; now one plain line per
    interval (the first at once) and the last metrics at the end, and the log's own text lines."""
    clock = Clock()
    out, buf = _console(width=80)
    with LogView("run-1", "lines", out=out, clock=clock, interval=5.0) as view:
        view.feed(b"a warning from the trainer\nTHRUST_INFO {\"device\": \"cpu\"}\nTHRUST_METRICS {broken\n")
        for i in range(1, 131):  # 130 reports, 1/8 s apart: 16.25 s
            clock.now += 0.125
            view.feed(_metrics_line(i * 400))
        view.feed(b'THRUST_DONE {"step": 52000, "solved": false}\n')
    lines = buf.getvalue().splitlines()
    assert "THRUST" not in buf.getvalue() and "{" not in buf.getvalue()
    assert lines[0] == "a warning from the trainer"
    progress = lines[1:]
    # the first at once, then every 5 s, then the end: the last metrics, whatever the interval
    assert [p.split("  ")[1] for p in progress] == ["400/60,000 steps", "16,400/60,000 steps", "32,400/60,000 steps",
                                                    "48,400/60,000 steps", "52,000/60,000 steps"]
    assert progress[-1].startswith("run-1: 87%  52,000/60,000 steps  return 20.00  eta 8s  1,000 sps")
    for line in progress:  # no bar, no width cut in a log
        assert FILLED not in line and EMPTY not in line


def test_lines_view_with_no_metrics_prints_only_the_text():
    out, buf = _console()
    with LogView("run-1", "lines", out=out) as view:
        view.feed(b"cargo job output\n")
    assert buf.getvalue() == "cargo job output\n"


def _allowed_fields(m: dict) -> set[str]:
    pct, optional = _fields(m, 83.0)
    return {pct.strip(), *(v for f in optional for v in f)}


def _split(line: str) -> tuple[str, list[str]]:
    bar, _, rest = line.partition(" ")
    return bar, [f.strip() for f in rest.split("  ") if f.strip()]


@pytest.mark.parametrize("m", [METRICS, SNAKE], ids=["cartpole", "snake"])
@pytest.mark.parametrize("width", [60, 80, 120])
def test_progress_line_fits_the_width_keeps_the_bar_and_whole_fields(m, width):
    line = progress_line(m, width, elapsed=83.0)
    assert len(line) <= width
    bar, fields = _split(line)
    assert set(bar) <= {FILLED, EMPTY} and len(bar) >= 10
    assert fields, line
    assert set(fields) <= _allowed_fields(m), line  # every field whole: nothing cut mid-word
    assert fields[0].endswith("%") and ("/" in fields[1])  # % and steps are the last to go


def test_progress_line_drops_the_least_important_first():
    wide = progress_line(METRICS, 120, elapsed=83.0)
    assert _split(wide)[1] == ["42%", "25,000/60,000 steps", "return 212.53", "eta 1s", "31,234 sps", "GPU 97%",
                               "elapsed 1m23s"]
    assert len(_split(wide)[0]) >= 20
    at80 = progress_line(METRICS, 80, elapsed=83.0)
    assert _split(at80)[1] == ["42%", "25,000/60,000 steps", "return 212.53", "eta 1s"]
    assert len(_split(at80)[0]) >= 20
    at60 = progress_line(METRICS, 60, elapsed=83.0)
    assert _split(at60)[1] == ["42%", "25k/60k", "ret 212.5", "eta 1s", "31.2k sps"]
    # snake: its score before eta, its return after sps
    assert _split(progress_line(SNAKE, 120, elapsed=3600.0))[1][2:5] == ["score 3.50", "eta 1m51s", "61,234 sps"]
    assert _split(progress_line(SNAKE, 80, elapsed=3600.0))[1] == [
        "15%", "1,200,000/8,000,000 steps", "score 3.50", "eta 1m51s"]


@pytest.mark.parametrize("width", range(8, 200, 7))
def test_progress_line_never_exceeds_any_width(width):
    for m in (METRICS, SNAKE, {"step": 5, "total_steps": None, "sps": None}):
        assert len(progress_line(m, width, elapsed=1.0)) <= width


def test_live_view_on_an_80_column_terminal_keeps_the_bar():
    out, buf = _console(width=80, terminal=True)
    with LogView("cartpole-20261123-101010-abcd", "live", out=out) as view:
        view.feed(b'THRUST_METRICS {"step": 25000, "total_steps": 60000, "return_mean": 212.53, "sps": 31234.5}\n')
    last = [ln for ln in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", buf.getvalue()).splitlines() if "%" in ln][-1]
    assert len(last) <= 80 and FILLED in last and "25,000/60,000 steps" in last


@pytest.mark.e2e  # the built-in trainer, for real
@pytest.mark.slow
def test_train_through_a_pipe_prints_readable_progress_lines(tmp_path):
    """`make demo | tee log`: the real CLI, host local, stdout a pipe: readable lines, no THRUST_METRICS."""
    proj = clone_repo(tmp_path / "project", plain=True)
    env = {**os.environ, "COLUMNS": "80"}
    env.pop("THRUST_CONFIG", None)
    t0 = time.monotonic()
    res = subprocess.run(
        [EXE, "train", "cartpole", "--host", "local", "--set", "total-steps=12000", "--set", "target-return=0",
         "--set", "log-interval=0.1"],
        cwd=proj, env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert "THRUST_" not in res.stdout and "THRUST_" not in res.stderr
    lines = res.stdout.splitlines()
    progress = [ln for ln in lines if re.match(r"cartpole-\S+: +\d+%  [\d,]+/[\d,]+ steps", ln)]
    assert progress, res.stdout
    assert re.search(r": 100%  ([\d,]+)/\1 steps", progress[-1]), progress  # the end is always shown
    assert len(progress) <= 2 + wall / 5  # one every 5 s (and the end), not one per report
    assert (proj / "web" / "public" / "cartpole.onnx").exists()


@pytest.mark.parametrize(("step", "words"), [(1, "1 step"), (2, "2 steps"), (0, "0 steps")])
def test_a_job_without_a_total_counts_its_steps_in_words_that_agree(step, words):
    line = progress_line({"step": step, "total_steps": None, "return_mean": 1.0}, 120, bar=False)
    assert re.search(rf"(^|\s){words}(\s|$)", line), line


@pytest.mark.parametrize("width", [60, 30])
def test_a_job_without_a_total_gets_no_empty_bar_and_keeps_its_metrics(width):
    """No total, no progress to draw: an empty bar would only push the metrics off a narrow terminal."""
    m = {"step": 1234, "total_steps": None, "return_mean": 3.5, "sps": 1000.0}
    line = progress_line(m, width, elapsed=12.0)
    assert EMPTY not in line and FILLED not in line and len(line) <= width
    assert line.startswith("1,234 steps") and "return 3.5" in line


def test_elapsed_is_the_runs_own_time_after_a_reattach_not_the_time_watched():
    """The trainer's metrics carry `wall_s` (since its start): a view opened on a run 10 minutes old says
    10 minutes and counts on from there; a job without it counts from when the view began."""
    clock = Clock()
    out, _ = _console()
    with LogView("run-1", "lines", out=out, clock=clock) as view:
        clock.now += 2.0
        assert view.elapsed() == 2.0
        view.feed(b'THRUST_METRICS {"step": 10, "wall_s": 600.0}\n')
        clock.now += 3.0
        assert view.elapsed() == 603.0
        assert "elapsed 10m03s" in progress_line(view.last, 120, elapsed=view.elapsed())


def test_a_live_view_of_a_job_without_metrics_leaves_only_its_lines():
    """A command job that prints no metrics: its lines stay on screen; the placeholder does not."""
    out, buf = _console(terminal=True)
    with LogView("run-1", "live", out=out) as view:
        view.feed(b"start\nend\n")
    text = buf.getvalue()
    assert "start" in text and "end" in text
    last_drawn = text[text.rindex("\x1b[2K"):]  # what stays after the live line's last erase
    assert "running, no metrics yet" not in last_drawn, repr(text)


def test_a_followed_run_that_waits_in_the_queue_says_where_until_its_log_starts():
    """`train --queue` attached, or a reattach to a QUEUED run: the live line names the queue and the
    place in it (not 'running, no metrics yet'), then counts the run's time from its start."""
    from thrust_remote.cli.follow import LogReporter

    clock = Clock()
    out, buf = _console(width=100, terminal=True)
    reporter = LogReporter(True, out=out)
    reporter.queued("box", 2)
    reporter.following("run-1", 0)
    view = reporter.view
    view.clock = clock
    view.live.refresh()
    assert "queued on box (position 2): starts when what it asks frees" in buf.getvalue()
    clock.now += 600.0  # ten minutes in the queue
    reporter.log(b"starting\n")
    view.live.refresh()
    assert view.elapsed() == 0.0  # the run's time begins when it starts, not when the view opened
    drawn = buf.getvalue()
    assert drawn.rindex("running, no metrics yet") > drawn.rindex("queued on box")
    reporter.followed()


def test_the_last_pull_of_the_runs_checkpoint_shows_its_age_and_a_pipe_gets_a_line_only_when_something_came():
    """While a run is followed its checkpoint is pulled every sync_every s (runs/pull.py): the live line
    ends with how old the copy here is (the first field a narrow terminal drops); a pipe gets one line
    for a pull that brought something and none for a pull with nothing new."""
    from thrust_remote.cli.follow import _layout
    from thrust_remote.runs.pull import Pulled

    wide, _ = _layout(METRICS, 160, 30.0, True, pulled=80.0)
    assert wide.endswith("pulled 1m20s ago")
    narrow, _ = _layout(METRICS, 60, 30.0, True, pulled=80.0)
    assert "pulled" not in narrow and "25k/60k" in narrow
    clock = Clock()
    out, buf = _console(width=120)
    with LogView("run-1", "lines", out=out, clock=clock) as view:
        view.take_pull(Pulled(0.0, "ckpt-000000004096.pt", 1, 132_081, 0.2))
        clock.now += 5
        view.take_pull(Pulled(0.0, "ckpt-000000004096.pt", 0, 0, 0.1))
        assert view.pulled_ago() == 0.0
    assert buf.getvalue().splitlines() == [
        "run-1: pulled checkpoint ckpt-000000004096.pt (1 file(s), 132,081 bytes, 0.2 s)"]
