"""Following a run stays bounded (issue 51, items 8, 11, 16): a job's `metrics: {pattern:}` is matched by
a linear-time engine (RE2) on a bounded part of each line, so no pattern stalls a follow or a `wait`; a
follow whose laptop is gone ends on the host within seconds even while the log is silent; a follow keeps
pace with a job that prints fast, and one enormous line does not stall it. The matcher's own rules
first (no SSH), then end to end over a real sshd."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import EXE, ended, new_project, remote_tempdir, wait_until

from thrust_remote.core.errors import ConfigError
from thrust_remote.runs import progress as prog
from thrust_remote.runs.progress import LinePattern, LineSplitter, RunProgress, last_metrics

# one worker runs this module's tests: they share one project and one host workdir
pytestmark = pytest.mark.xdist_group("test_follow_bounded")

EVIL = r"^(?P<loss>(a+)+)$"  # exponential under a backtracking engine on 'a' * 34 + 'b'
EVIL_LINE = "a" * 34 + "b"
MANY = 2_000_000  # lines of `many` (~22 MB): 285 s to follow before the fix, seconds after


# ------------------------------------------------------------------------------------------ the matcher

def _in_child(code: str, timeout: float) -> subprocess.CompletedProcess:
    """`code` in a python of its own: a backtracking match cannot be interrupted in this process."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_a_catastrophic_pattern_is_matched_in_linear_time():
    done = _in_child(
        "import time\n"
        "from thrust_remote.runs.progress import LinePattern, last_metrics\n"
        f"p = LinePattern({EVIL!r})\n"
        "t = time.monotonic()\n"
        f"assert p.read({EVIL_LINE!r}) is None\n"
        f"assert p.read('a' * 100000) == {{'loss': None}} or p.read('a' * 100000) is None\n"
        f"assert last_metrics(({EVIL_LINE!r} + '\\n') * 1000, p) == {{}}\n"
        "print(time.monotonic() - t)\n", timeout=30)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 5.0


def test_a_pattern_reads_only_a_bounded_head_of_each_line():
    pattern = LinePattern(r"loss (?P<loss>[\d.]+)")
    assert pattern.read("loss 0.5") == {"loss": 0.5}
    assert pattern.read("x" * (prog.LINE_MAX + 10) + " loss 0.5") is None  # past the head: never read
    assert pattern.read("loss 0.25 " + "x" * (10 * prog.LINE_MAX)) == {"loss": 0.25}


@pytest.mark.parametrize(("text", "words"), [
    (r"x (?P<v>\d+)(?=$)", "lookahead"),
    (r"(?P<v>\d+) \1", "backreference"),
    (r"(?P<v>(?>\d+))", "atomic"),
    (r"(?P<v>\d+", "missing )"),
])
def test_a_pattern_the_engine_cannot_take_is_refused_with_why(text, words):
    why = prog.check_pattern(text)
    assert why is not None and words in why, why
    with pytest.raises(ConfigError) as info:
        LinePattern(text)
    assert "metrics.pattern" in info.value.message and words in info.value.message


def test_check_pattern_takes_what_jobs_write():
    for text in (r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)", r"(?i)reward=(?P<r>-?[\d.]+(?:e[-+]?\d+)?)",
                 r"^step (?P<step>\d+)\s+eval (?P<eval>[\d.]+)$", r"\bacc[:=]\s*(?P<acc>\d*\.\d+)"):
        assert prog.check_pattern(text) is None, text
        LinePattern(text)
    said = LinePattern(r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)").read("iter 2: loss 1.3")
    assert list(said or {}) == ["step", "loss"]  # in the pattern's order, as `wait` says them


def test_one_enormous_line_is_kept_to_its_head_and_the_next_lines_still_come():
    splitter, progress = LineSplitter(), RunProgress(LinePattern(r"n=(?P<n>\d+)"))
    block = b"x" * (1 << 16)
    started = time.monotonic()
    shown = []
    for _ in range(2048):  # 128 MiB of one line, in 64 KiB chunks: quadratic joins took minutes
        shown += splitter.feed(block)
    shown += splitter.feed(b"\nn=7\n")
    assert time.monotonic() - started < 20
    assert len(shown) == 2 and shown[1] == "n=7"
    assert shown[0].startswith("x" * 1000) and len(shown[0]) < prog.LINE_MAX + 200
    assert f"{128 << 20:,} bytes" in shown[0]  # says it was cut, and how long the line was
    for line in shown:
        progress.take(line)
    assert progress.metrics == {"n": 7.0}


def test_a_block_of_lines_reads_as_its_lines_one_by_one():
    """The follow's fast path (a whole chunk's lines at once) says what the lines one by one say."""
    pattern = r"(?:train (?P<loss>[\d.]+)|eval (?P<eval>[\d.]+))(?: step (?P<step>\d+))?"
    text = "\n".join(["hello", "train 0.5 step 3", 'THRUST_INFO {"x": 1}', "eval 2.5", "THRUST_METRICS {broken",
                      "train 0.25", 'THRUST_METRICS {"return_mean": 4}', "bye", ""])
    one, block = RunProgress(LinePattern(pattern)), RunProgress(LinePattern(pattern))
    shown_one = [line for line in text.splitlines() if not one.take(line)]
    shown_block = block.take_block(text.encode())
    assert shown_block == "".join(line + "\n" for line in shown_one)
    assert (block.metrics, block.info, list(block.tail)) == (one.metrics, one.info, list(one.tail))
    assert block.metrics == {"return_mean": 4}
    assert last_metrics(text, LinePattern(pattern)) == {"return_mean": 4}
    only_pattern = "\n".join(["train 0.5 step 3", "eval 2.5", "train 0.25", "noise", ""])
    by_block = RunProgress(LinePattern(pattern))
    by_block.take_block(only_pattern.encode())
    assert by_block.metrics == {"loss": 0.25, "step": 3, "eval": 2.5}  # merged: each name's last number


@pytest.mark.parametrize("source", ["log", "raw"])
def test_a_poll_moves_past_a_line_longer_than_its_read(tmp_path, source):
    """optimize's `agent poll` reads whole lines of a trial's log, 1 MiB a time: a longer line held the
    offset where it was, and the trial's metrics never moved on (its objective never read)."""
    from thrust_remote.agent import poll
    from thrust_remote.agent.protocol import LOG

    run = tmp_path / "run"
    run.mkdir()
    (run / LOG).write_bytes(b"x" * (3 << 20) + b"\nTHRUST_METRICS {\"step\": 1}\n")
    offset, got = 0, ""
    for _ in range(8):
        one = poll._one(str(run), offset, source)
        got, offset = got + one["data"], one["offset"]
        if not one["more"]:
            break
    assert got.endswith('{"step": 1}\n') and "x" not in got
    assert offset == (run / LOG).stat().st_size


# ------------------------------------------------------------------------------------------ over sshd

JOBS = f"""\
jobs:
  evil:
    command: [sh, -c, 'echo {EVIL_LINE}']
    metrics: {{pattern: '{EVIL}'}}
  many:
    command: [sh, -c, "seq -f 'line %.0f' 0 {MANY - 1}"]
  counted:
    command: [sh, -c, "seq -f 'line %.0f' 0 {MANY - 1}"]
    metrics: {{pattern: 'line (?P<n>\\d+)'}}
  wide:
    command: [sh, -c, "echo before; head -c 134217728 /dev/zero | tr '\\\\0' x; echo; echo after"]
  quiet:
    command: [sh, -c, 'echo started; exec sleep 3600']
"""


@pytest.fixture(scope="module")
def proj(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir)."""
    workdir = remote_tempdir(sshd) / "bounded"
    path = new_project(tmp_path_factory.mktemp("bounded") / "project", sshd, workdir, jobs=JOBS)
    return path, workdir


def _run_id(text: str) -> str:
    return re.search(r"launching run (\S+)", text).group(1)  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_catastrophic_pattern_stalls_neither_train_nor_wait(cli, proj):
    """Before: `train` hung at the job's one 35-character line, and `wait` on the FINISHED run too."""
    path, _ = proj
    done = cli("train", "evil", "--no-fetch", cwd=path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert EVIL_LINE in done.stdout and "FINISHED" in done.stderr
    waited = cli("wait", _run_id(done.stderr), "--json", cwd=path, timeout=60)
    assert waited.returncode == 0, waited.stderr
    assert "FINISHED" in waited.stdout


def test_a_pattern_re2_cannot_take_is_a_config_error_not_a_traceback(cli, proj, tmp_path):
    """Before, a lookahead was taken (and matched by a backtracking engine): now thrust.yaml's reader
    refuses it at its line (core/patterns.py's rules), before anything connects."""
    path, _ = proj
    config = tmp_path / "ahead.yaml"
    config.write_text((path / "thrust.yaml").read_text().split("jobs:")[0]
                      + "jobs:\n  ahead:\n    command: [sh, -c, 'echo x 1']\n"
                      + "    metrics: {pattern: 'x (?P<v>\\d+)(?=$)'}\n")
    done = cli("--config", str(config), "train", "ahead", "--no-fetch", cwd=path, timeout=120)
    err = " ".join(done.stderr.split())
    assert done.returncode == 78, done.stderr
    assert "ahead.yaml:" in err and "jobs.ahead.metrics.pattern: lookahead" in err, err
    assert "Traceback" not in err and "syncing" not in err, err


def _lines_in_order(out: str, count: int) -> None:
    got = [line for line in out.splitlines() if line.startswith("line ")]
    assert len(got) == count, (len(got), got[:3], got[-3:])
    bad = next((i for i, line in enumerate(got) if line != f"line {i}"), None)
    assert bad is None, (bad, got[bad - 2:bad + 3])


@pytest.mark.slow
@pytest.mark.parametrize("job", ["many", "counted"])
def test_a_follow_of_millions_of_lines_shows_them_all_in_order_and_the_end(cli, proj, job):
    """2,000,000 lines (22 MB) in a few seconds: every line shown, in order, then the run's end. Before,
    the follow took 285 s (510 s with a pattern): the bound here is generous, the benchmark measures."""
    path, _ = proj
    done = cli("train", job, "--no-fetch", cwd=path, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    _lines_in_order(done.stdout, MANY)
    assert "FINISHED" in done.stderr
    if job == "counted":  # the pattern's last numbers: the progress line at the end
        assert f"n {MANY - 1:.4g}" in done.stdout or f"n {MANY - 1}" in done.stdout, done.stdout[-500:]
    again = cli("logs", _run_id(done.stderr), "--follow", "--no-fetch", cwd=path, timeout=150)
    assert again.returncode == 0, again.stderr[-2000:]
    _lines_in_order(again.stdout, MANY)


@pytest.mark.slow
def test_one_enormous_line_does_not_stall_the_follow(cli, proj):
    """128 MiB in one line: its head is shown with its length, the next line after it, the end said."""
    path, _ = proj
    done = cli("train", "wide", "--no-fetch", cwd=path, timeout=150)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "before" and lines[-1] == "after"
    assert f"{128 << 20:,} bytes" in done.stdout and len(done.stdout) < 4 * prog.LINE_MAX
    assert "FINISHED" in done.stderr


def _follows(sshd, run_dir: str) -> list:
    """The host's `agent logs --follow` processes of this run (found by its run dir argument)."""
    out = []
    for proc in sshd.processes():
        try:
            argv = proc.cmdline()
        except Exception:  # noqa: BLE001 - gone meanwhile
            continue
        if "logs" in argv and "--follow" in argv and run_dir in argv:
            out.append(proc)
    return out


@pytest.mark.slow
def test_a_follow_whose_laptop_is_killed_ends_on_the_host_while_the_log_is_silent(cli, sshd, proj):
    """The follow's parent is the `sh -c` that waits for it, which outlives the SSH session: before, the
    host's follow went on polling until the run ended (a month at most)."""
    path, workdir = proj
    started = cli("train", "quiet", "--detach", "--json", cwd=path, timeout=120)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    run_dir = str(workdir / ".thrust" / "runs" / run_id)
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    laptop = subprocess.Popen([EXE, "logs", run_id, "--follow", "--no-fetch"], cwd=path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _follows(sshd, run_dir), 60, "the follow to start on the host")
        wait_until(lambda: b"started" in (laptop.stdout.peek() if laptop.stdout else b""), 30, "the log's line")
        laptop.send_signal(signal.SIGKILL)
        laptop.wait(10)
        wait_until(lambda: not _follows(sshd, run_dir), 10, "the host's follow to end after its laptop died")
    finally:
        if laptop.poll() is None:
            laptop.kill()
        cli("stop", run_id, cwd=path, timeout=120)


def _serves(sshd) -> set[int]:
    """The host's `agent serve` processes (one per laptop session)."""
    out = set()
    for proc in sshd.processes():
        with contextlib.suppress(Exception):  # gone meanwhile
            if "serve" in proc.cmdline() and any(a.endswith(".pyz") for a in proc.cmdline()):
                out.add(proc.pid)
    return out


@pytest.mark.slow
def test_a_follow_over_the_agent_link_ends_when_the_link_dies(cli, sshd, proj):
    """The same follow as a request of `agent serve` (one process per connection, each request a fork of
    it, which `ps` shows as the serve): its link closed, the serve ends and so does the follow it forked."""
    import psutil

    from thrust_remote.host.session import HostSession

    path, workdir = proj
    started = cli("train", "quiet", "--detach", "--json", cwd=path, timeout=120)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    run_dir = str(workdir / ".thrust" / "runs" / run_id)
    before = _serves(sshd)
    try:
        session = HostSession.open(sshd.runner(workdir=str(workdir)), sshd.host_config(workdir=str(workdir)))
        link = session._agent_link()
        assert link is not None
        serve = wait_until(lambda: _serves(sshd) - before, 30, "the session's agent serve")
        threading.Thread(target=_quietly, args=(link.call, ["logs", "--run-dir", run_dir, "--follow"]),
                         daemon=True).start()
        forks = wait_until(lambda: [c for pid in serve for c in psutil.Process(pid).children()], 30,
                           "the follow's fork of the serve")
        session.runner.close()  # the connection goes: the laptop, as the host sees it, died
        wait_until(lambda: all(ended(c) for c in forks), 10,
                   "the host's follow to end after its link died")
    finally:
        cli("stop", run_id, cwd=path, timeout=120)


def _quietly(call, argv: list[str]) -> None:  # noqa: ANN001 - the link's call
    with contextlib.suppress(Exception):  # the link is cut under it on purpose
        call(argv, stdin=None, timeout=None)
