"""A job's sections of several keys are types (issue 52): `flags`, `metrics`, `objective` parsed into
frozen dataclasses at their line, and `retry`, `idle_stop` with theirs ready (retry_section,
idle_stop_section) for when their readers switch. Messages stay `thrust.yaml:N: jobs.J.KEY...`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from thrust_remote.core.config import (
    FlagsConfig,
    IdleStop,
    JobConfig,
    MetricsConfig,
    ObjectiveConfig,
    RetryConfig,
    parse_config_text,
)
from thrust_remote.core.config.bounded import compose_yaml
from thrust_remote.core.config.job_values import idle_stop_section
from thrust_remote.core.config.reader import Reader
from thrust_remote.core.config.retry import retry, retry_section
from thrust_remote.core.errors import ConfigError
from thrust_remote.optimize.objective import objective_for
from thrust_remote.run import flags as job_flags
from thrust_remote.runs.progress import pattern_of

OWN = """\
jobs:
  j:
    script: t.py
    flags: {names: dashes, style: "--key=value"}
    metrics: {pattern: "loss (?P<loss>[0-9.]+)", tensorboard: runs}
    objective: {metric: loss, mode: min}
"""


def test_flags_metrics_and_objective_are_typed_sections() -> None:
    job = parse_config_text(OWN, Path("thrust.yaml")).job("j")
    assert job.flags == FlagsConfig(style="--key=value", names="dashes")
    assert (job.metrics.tensorboard, job.metrics.pattern) == ("runs", "loss (?P<loss>[0-9.]+)")
    assert isinstance(job.metrics, MetricsConfig) and isinstance(job.objective, ObjectiveConfig)
    assert (job.objective.metric, job.objective.mode) == ("loss", "min")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.metrics.pattern = "x"  # type: ignore[misc]


def test_a_job_that_writes_none_has_empty_sections_and_no_objective() -> None:
    job = JobConfig(name="j")
    assert job.flags == FlagsConfig() and job.flags.style is None and job.flags.as_dict() == {}
    assert job.metrics == MetricsConfig() and job.metrics.as_dict() == {}
    assert job.objective is None
    assert pattern_of(job.metrics) is None and pattern_of(None) is None


def test_a_section_equals_the_mapping_of_its_keys_written() -> None:
    assert MetricsConfig(tensorboard="runs") == {"tensorboard": "runs"}
    assert MetricsConfig(tensorboard="runs") != {"tensorboard": "runs", "pattern": None}
    assert FlagsConfig(style="key=value") != FlagsConfig(style="key=value", names="dashes")
    assert len({FlagsConfig(), FlagsConfig(), MetricsConfig()}) == 2  # hashable: a field default


def test_the_readers_take_the_attributes() -> None:
    job = parse_config_text(OWN, Path("thrust.yaml")).job("j")
    assert job_flags.render(job, {"learning_rate": 0.1}) == ["--learning-rate=0.1"]
    assert pattern_of(job.metrics) is not None
    config = parse_config_text(OWN, Path("thrust.yaml"))
    o = objective_for(config, job, "auto")
    assert (o.metric, o.mode, o.source, o.events_dir, o.pattern) == ("loss", "min", "tensorboard", "runs",
                                                                    job.metrics.pattern)


def _node(text: str) -> tuple[Reader, object]:
    reader = Reader(Path("thrust.yaml"))
    return reader, compose_yaml(text, reader.label)


def test_retry_section_is_the_policy_without_its_line() -> None:
    reader, node = _node("{max: 2, on: [lost, failed], hosts: [b], grace: 5}\n")
    policy = retry_section(reader, "jobs.j.retry", node)  # type: ignore[arg-type]
    assert policy == RetryConfig(max=2, on=("lost", "failed"), hosts=("b",), grace=5.0)
    assert policy.hosts_line == 1 and "hosts_line" not in policy.as_dict()
    assert policy == {k: v for k, v in retry(reader, "jobs.j.retry", node).items()  # type: ignore[arg-type]
                      if k != "hosts_line"}
    reader, node = _node("{max: 0}\n")
    policy = retry_section(reader, "jobs.j.retry", node)  # type: ignore[arg-type]
    assert (policy.on, policy.hosts, policy.grace) == (("host-lost", "lost"), (), None)


def test_idle_stop_section() -> None:
    reader, node = _node("{below: 5, minutes: 10}\n")
    stop = idle_stop_section(reader, "jobs.j.idle_stop", node)  # type: ignore[arg-type]
    assert stop == IdleStop(below=5.0, minutes=10.0) and stop.every is None
    assert stop.as_dict() == {"below": 5.0, "minutes": 10.0}  # run.json's idle_stop, as it was


@pytest.mark.parametrize(("parse", "text", "said"), [
    (retry_section, "\n{on: [lost]}\n", "thrust.yaml:2: jobs.j.retry.max: missing"),
    (retry_section, "{max: 1, on: [reboot]}\n", "thrust.yaml:1: jobs.j.retry.on: 'reboot' is not one of"),
    (idle_stop_section, "{below: 5}\n", "thrust.yaml:1: jobs.j.idle_stop.minutes: missing"),
])
def test_the_typed_parsers_fail_at_the_line(parse, text: str, said: str) -> None:  # type: ignore[no-untyped-def]
    reader, node = _node(text)
    key = "retry" if parse is retry_section else "idle_stop"
    with pytest.raises(ConfigError) as e:
        parse(reader, f"jobs.j.{key}", node)
    assert str(e.value).startswith(said), str(e.value)

