"""A job of your own as it is (issue 38): the flag style it takes, progress read from its own log lines,
a next step after every ending. The logic here is in-process (core); the runs against a real sshd are
in tests/test_own_job_ssh.py."""

from __future__ import annotations

import io
import json
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from thrust_remote.cli.follow import IDLE_EVERY_S, LogView
from thrust_remote.core.config import JobConfig, parse_config_text
from thrust_remote.core.errors import ConfigError
from thrust_remote.fetch import checkpoints
from thrust_remote.fetch.artifacts import glob_matches
from thrust_remote.optimize.usage import UsageSources, refused_early
from thrust_remote.run import arguments, endings, flags
from thrust_remote.runs.progress import LinePattern, RunProgress, last_metrics

NANO_PATTERN = r"iter (?P<step>\d+): loss (?P<loss>[\d.]+)"


def _job(text: str, name: str = "j") -> JobConfig:
    return parse_config_text("jobs:\n  j:\n" + textwrap.indent(text, "    "), Path("thrust.yaml")).job(name)


def _refused(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config_text(textwrap.dedent(text), Path("thrust.yaml"))
    return err.value.message


# ------------------------------------------------------------------------------------------ flag styles

@pytest.mark.parametrize(("style", "names", "expected"), [
    (None, None, ["--learning_rate", "3e-4", "--compile", "--batch_size", "8"]),
    ("--key=value", None, ["--learning_rate=3e-4", "--compile=True", "--batch_size=8", "--dropout=False"]),
    ("key=value", None, ["learning_rate=3e-4", "compile=true", "batch_size=8", "dropout=false"]),
    ("-k value", None, ["-learning_rate", "3e-4", "-compile", "-batch_size", "8"]),
    (None, "dashes", ["--learning-rate", "3e-4", "--compile", "--batch-size", "8"]),
])
def test_set_args_and_params_are_written_in_the_jobs_flag_style(style, names, expected):
    """`--set`, an `args:` mapping and `--params` in the job's own style; a true switch is bare where a
    flag has no `=`, a false one left out there, and spelled as True/False or true/false where it has."""
    spec = {k: v for k, v in (("style", style), ("names", names)) if v}
    text = "script: train.py\nargs: {learning_rate: 1.0, compile: true}\n"
    if spec:
        text += "flags: {" + ", ".join(f"{k}: {v!r}" for k, v in spec.items()) + "}\n"
    job = _job(text.replace("'", '"'))
    sets = arguments.parse_sets(["learning_rate=3e-4", "dropout=false"])
    assert arguments.job_arguments(job, sets, {"batch_size": 8}) == expected


def test_a_command_job_keeps_key_value_words_unless_its_flags_say_otherwise():
    assert arguments.job_arguments(_job("command: [sh, t.sh]\n"), {"seed": "1"}, {}) == ["seed=1"]
    job = _job("command: [sh, t.sh]\nflags: {style: '--key=value'}\n")
    assert arguments.job_arguments(job, {"seed": "1"}, {}) == ["--seed=1"]


def test_a_python_list_gets_the_sets_appended_in_its_style():
    job = _job("script: train.py\nargs: [config/train.py]\nflags: {style: '--key=value'}\n")
    assert arguments.job_arguments(job, {"backend": "gloo"}, {}) == ["config/train.py", "--backend=gloo"]


@pytest.mark.parametrize(("body", "words"), [
    ("jobs:\n  j:\n    script: t.py\n    flags: {style: --key:value}\n", ":4: jobs.j.flags.style: expected one of"),
    ("jobs:\n  j:\n    script: t.py\n    flags: {names: snake}\n", ":4: jobs.j.flags.names: expected one of"),
    ("jobs:\n  j:\n    script: t.py\n    flags: {spelling: x}\n", ":4: jobs.j.flags.spelling: unknown key"),
    ("jobs:\n  j:\n    kind: trainer\n    flags: {style: key=value}\n", ":4: jobs.j.flags: not for a trainer job"),
    ("jobs:\n  j:\n    script: t.py\n    args: {--lr: 1}\n", ":4: jobs.j.args.--lr: write the flag name alone (lr)"),
    ("search:\n  j:\n    --learning_rate: {low: 0.1, high: 1}\n",
     ":3: search.j.--learning_rate: write the parameter name alone (learning_rate)"),
])
def test_a_bad_flags_setting_or_a_name_written_as_a_flag_is_78_at_its_line(body, words):
    """A search key written `--learning_rate` is refused, not stripped: how a name reaches the job is
    its `flags:` alone, so `args:`, `search:` and `--set` never disagree on it."""
    message = _refused(body)
    assert message.startswith("thrust.yaml") and words in message, message
    if "alone" in words:
        assert "flags: {style: ...}" in message


def test_the_hint_names_the_flag_style_when_the_job_dies_of_its_arguments():
    """nanoGPT's configurator asserts on `--backend gloo` (it takes `--backend=gloo` only): the hint says
    how the flags were written and the key that changes it; an unrelated failure gets none."""
    job = _job("script: train.py\n")
    tail = ("Traceback (most recent call last):\n  File \"configurator.py\", line 22\n"
            "    assert arg.startswith('--')\nAssertionError\n")
    hint = flags.refused_hint(job, tail, gave_flags=True)
    assert hint is not None and "--learning_rate 0.1" in hint and "flags: {style: '--key=value'}" in hint
    usage = "usage: train.py [-h] [--lr LR]\ntrain.py: error: unrecognized arguments: --learning-rate 3\n"
    assert flags.refused_hint(job, usage, gave_flags=True) is not None
    assert flags.refused_hint(job, "CUDA out of memory\n", gave_flags=True) is None
    assert flags.refused_hint(job, tail, gave_flags=False) is None  # it was given no flags of ours


# ------------------------------------------------------------------------------------------ metrics pattern

def test_a_pattern_reads_named_numbers_from_the_jobs_own_lines():
    progress = RunProgress(LinePattern(NANO_PATTERN))
    assert progress.take("iter 0: loss 4.2173, time 35.1ms") is False  # still shown: the job's own text
    progress.take("step 250: train loss 2.1, val loss 2.3")
    progress.take("iter 250: loss 1.9512")
    assert progress.metrics == {"step": 250, "loss": 1.9512} and progress.updates == 2
    assert progress.summary()["steps"] == 250


def test_a_pattern_without_step_and_the_tail_a_wait_reads():
    pattern = LinePattern(r"reward=(?P<reward>-?[\d.]+)")
    text = 'THRUST_METRICS {"step": 5, "x": 1}\nepisode reward=-3.5\nreward=nan\n'
    assert last_metrics(text, pattern) == {"step": 5, "x": 1, "reward": -3.5}  # nan is no number


@pytest.mark.parametrize(("pattern", "words"), [
    ("iter (?P<step>\\\\d+", ":4: jobs.j.metrics.pattern: not a regular expression"),
    ("iter (\\\\d+): loss ([\\\\d.]+)", ":4: jobs.j.metrics.pattern: expected named groups"),
    ("iter (?P<step>\\\\d+)", "step alone is only the x axis"),
    ("loss (?P<loss>[\\\\d.]+)(?=x)", ":4: jobs.j.metrics.pattern: lookahead (?=...) is not supported by RE2"),
    ("^(?P<loss>(a+)+)(?P=loss)$", ":4: jobs.j.metrics.pattern: backreference (?P=name) is not supported"),
])
def test_a_bad_pattern_is_78_at_its_line(pattern, words):
    message = _refused(f'jobs:\n  j:\n    script: t.py\n    metrics: {{pattern: "{pattern}"}}\n')
    assert words in message, message


# ------------------------------------------------------------------------------------------ endings

def _record(root: Path, run_id: str, name: str, written: float, pulled: str) -> None:
    kept = root / ".thrust" / "fetched" / run_id
    (kept / "checkpoints").mkdir(parents=True)
    (kept / "checkpoints" / name).write_bytes(b"500")
    (kept / "checkpoints.json").write_text(json.dumps({
        "files": {name: {"sha256": "x", "size": 3, "mtime": written}}, "newest": name, "host": "gpu",
        "pulled_at": pulled}))


def test_a_lost_run_of_a_resumable_job_names_resume_with_its_pulled_checkpoints_step_and_age(tmp_path, monkeypatch):
    """After a LOST end: `resume RUN --host H` and how old the copy here is; a job that cannot resume says
    how to run it again instead; FINISHED needs no next step."""
    config = parse_config_text(textwrap.dedent("""\
        hosts: {gpu: {address: gpu-box}}
        jobs:
          nano:
            script: train.py
            checkpoints: out/ckpt-*.pt
            resume: ["--resume_from={checkpoint}"]
          plain: {script: train.py}
        """), tmp_path / "thrust.yaml")
    monkeypatch.chdir(tmp_path)  # the project (config.root): no git here, so where the command runs
    assert config.root == tmp_path
    now = time.time()
    _record(tmp_path, "r1", "ckpt-500.pt", now - 250, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 182)))
    lost = {"run_id": "r1", "state": "LOST"}
    said = endings.next_steps(config, lost, config.job("nano"), RunProgress(), config.host("gpu"), now=now)
    assert said == ["continue it from its checkpoint ckpt-500.pt (step 500, written 4m10s ago on gpu, pulled "
                    "3m02s ago): thrust-remote resume r1 --host gpu (or --host another host; the pulled copy is "
                    "used when its host does not answer)"]
    described = "ckpt-500.pt (step 500, written 4m10s ago on gpu, pulled 3m02s ago)"
    assert checkpoints.describe(tmp_path, "r1", now) == described
    checkpoints.note_step(tmp_path, "r1", 600)  # the follow had seen step 600 when it came
    assert checkpoints.describe(tmp_path, "r1", now) == described[:-1] + ", when the run had reached step 600)"
    plain = endings.next_steps(config, {"run_id": "r2", "state": "LOST"}, config.job("plain"), RunProgress(),
                               config.host("gpu"))
    assert "run it again: thrust-remote train plain --host gpu" in plain[0]
    assert "`checkpoints:` and `resume:`" in plain[0]
    assert endings.next_steps(config, {"run_id": "r1", "state": "FINISHED"}, config.job("nano"), RunProgress(),
                              config.host("gpu")) == []


def test_a_first_trial_that_asserts_before_its_metrics_stops_the_study_naming_the_flag_style(tmp_path):
    config = parse_config_text("jobs:\n  j:\n    script: train.py\n", tmp_path / "thrust.yaml")
    sources = UsageSources(config, config.job("j"), {})
    error = refused_early(1, "Traceback (most recent call last):\nAssertionError\n", 0, sources)
    assert error is not None and error.exit_code == 78
    assert "jobs.j: trial 0 died (exit code 1) before its first metrics: AssertionError" in error.message
    assert "flags: {style: '--key=value'}" in (error.hint or "")
    assert refused_early(1, "RuntimeError: CUDA out of memory\n", 0, sources) is None


@pytest.mark.parametrize(("glob", "entry", "both"), [
    ("out/ckpt-*.pt", {"base": "cwd", "path": "out/ckpt-3.pt"}, True),
    ("out/ckpt-*.pt", {"base": "cwd", "path": "out/result.txt"}, False),
    ("out", {"base": "cwd", "path": "out/deep/ckpt.pt"}, True),  # a directory stands for its files
    ("**/*.pt", {"base": "cwd", "path": "a/b/.hidden.pt"}, True),
    ("$THRUST_RUN_DIR/checkpoints/ckpt-*.pt", {"base": "run", "path": "checkpoints/ckpt-1.pt"}, True),
    ("$THRUST_RUN_DIR/checkpoints/ckpt-*.pt", {"base": "cwd", "path": "checkpoints/ckpt-1.pt"}, False),
])
def test_a_file_under_both_artifacts_and_checkpoints_is_known_as_the_checkpoint(glob, entry, both):
    assert glob_matches(glob, entry) is both


def test_a_piped_run_without_metrics_gets_an_idle_line_at_a_sane_rate():
    """No metrics at all: the pipe still hears that the run goes and when its log last grew, once per
    IDLE_EVERY_S however often it is asked; the live line says the same, never 'waiting' alone."""
    clock = _Clock()
    out = Console(file=io.StringIO(), width=200)
    view = LogView("run-1", "lines", out=out, clock=clock)
    view.feed(b"loading data\n")
    clock.now += 65.0
    for _ in range(3):
        view.tick()
    text = out.file.getvalue()  # type: ignore[attr-defined]
    assert text.count("run-1: running, no metrics yet  elapsed 1m05s  log grew 1m05s ago") == 1, text
    clock.now += IDLE_EVERY_S
    view.tick()
    assert out.file.getvalue().count("run-1: running") == 2  # type: ignore[attr-defined]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
