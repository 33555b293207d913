"""The job spec sent to a host is built from an allow-list (host/jobspec.py, issue 52): every JobConfig
field is either sent (HOST_FIELDS) or kept on the laptop (LAPTOP_FIELDS), so a new field changes no
spec and no preflight cache key until it is classified; and today's jobs' specs are the bytes they were
before the allow-list (recorded from the code before it, `git archive` of its parent commit)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from thrust_remote.core.config import JobConfig, parse_config_text
from thrust_remote.host.jobspec import HOST_FIELDS, LAPTOP_FIELDS, job_spec

YAML = """\
hosts:
  a: {address: me@a}
  b: {address: me@b}
files: [data/x.bin]
jobs:
  ppo:
    kind: python
    script: train/train_ppo.py
    args: [--total-timesteps, "1000000"]
    requirements: requirements.txt
    nproc: 4
    artifacts: ["runs/**", "models/*.pt"]
    metrics: {pattern: "loss (?P<loss>[0-9.]+) step (?P<step>[0-9]+)", tensorboard: runs}
    objective: {mode: min, metric: loss}
    flags: {names: dashes, style: "--key=value"}
    export: web/public/ppo.onnx
    env: {SECRET: s3cr3t, A: "1"}
    idle_stop: {minutes: 10, below: 5}
    checkpoints: ckpt/*.pt
    resume: [--resume-from, "{checkpoint}"]
    sync_every: 30
    retry: {max: 2, hosts: [b], on: [lost, failed], grace: 5}
    notify: {command: [echo, hi]}
    setup: [make data]
    shared: [.cache]
  cmd:
    kind: command
    command: [bash, devops/train.sh, x=1]
    idle_stop: {below: 1, minutes: 2, every: 7}
  own:
    module: lora.train
    requirements: [peft>=0.10]
    flags: {style: key=value}
  rust:
    kind: cargo
    example: train
    args: [--steps, "5"]
    toolchain: nightly
"""

# json.dumps(job_spec(job), sort_keys=True) of each job as the code before the allow-list built it: what
# host/report.py sends as --job-json and what run/preflight.py's cache key is built on (both sort keys)
BEFORE = {
    'ppo': (
        '{"args": ["--total-timesteps", "1000000"], "artifact": null, "artifacts": ["runs/**", "models/*.'
        'pt"], "bypass_version_check": false, "command": [], "crate": ".", "env": {"A": "1", "SECRET": "s'
        '3cr3t"}, "example": null, "export": "web/public/ppo.onnx", "files": null, "flags": {"names": "da'
        'shes", "style": "--key=value"}, "idle_stop": {"below": 5.0, "minutes": 10.0}, "kind": "python", '
        '"metrics": {"pattern": "loss (?P<loss>[0-9.]+) step (?P<step>[0-9]+)", "tensorboard": "runs"}, "'
        'module": null, "name": "ppo", "nproc": 4, "objective": {"metric": "loss", "mode": "min"}, "requi'
        'rements": [], "requirements_file": "requirements.txt", "script": "train/train_ppo.py", "setup": '
        '["make data"], "shared": [".cache"], "tch_version": "auto", "toolchain": "stable"}'
    ),
    'cmd': (
        '{"args": {}, "artifact": null, "artifacts": [], "bypass_version_check": false, "command": ["bash'
        '", "devops/train.sh", "x=1"], "crate": ".", "env": {}, "example": null, "export": null, "files":'
        ' null, "flags": {}, "idle_stop": {"below": 1.0, "every": 7.0, "minutes": 2.0}, "kind": "command"'
        ', "metrics": {}, "module": null, "name": "cmd", "nproc": null, "objective": {}, "requirements": '
        '[], "requirements_file": null, "script": null, "setup": null, "shared": null, "tch_version": "au'
        'to", "toolchain": "stable"}'
    ),
    'own': (
        '{"args": {}, "artifact": null, "artifacts": [], "bypass_version_check": false, "command": [], "c'
        'rate": ".", "env": {}, "example": null, "export": null, "files": null, "flags": {"style": "key=v'
        'alue"}, "idle_stop": null, "kind": "python", "metrics": {}, "module": "lora.train", "name": "own'
        '", "nproc": null, "objective": {}, "requirements": ["peft>=0.10"], "requirements_file": null, "s'
        'cript": null, "setup": null, "shared": null, "tch_version": "auto", "toolchain": "stable"}'
    ),
    'rust': (
        '{"args": ["--steps", "5"], "artifact": null, "artifacts": [], "bypass_version_check": false, "co'
        'mmand": [], "crate": ".", "env": {}, "example": "train", "export": null, "files": null, "flags":'
        ' {}, "idle_stop": null, "kind": "cargo", "metrics": {}, "module": null, "name": "rust", "nproc":'
        ' null, "objective": {}, "requirements": [], "requirements_file": null, "script": null, "setup": '
        'null, "shared": null, "tch_version": "auto", "toolchain": "nightly"}'
    ),
    'snake': (
        '{"args": {"env": "snake"}, "artifact": null, "artifacts": [], "bypass_version_check": false, "co'
        'mmand": [], "crate": ".", "env": {}, "example": null, "export": "web/public/snake.onnx", "files"'
        ': null, "flags": {}, "idle_stop": null, "kind": "trainer", "metrics": {}, "module": null, "name"'
        ': "snake", "nproc": null, "objective": {}, "requirements": [], "requirements_file": null, "scrip'
        't": null, "setup": null, "shared": null, "tch_version": "auto", "toolchain": "stable"}'
    ),
    'cartpole': (
        '{"args": {"env": "cartpole"}, "artifact": null, "artifacts": [], "bypass_version_check": false, '
        '"command": [], "crate": ".", "env": {}, "example": null, "export": "web/public/cartpole.onnx", "'
        'files": null, "flags": {}, "idle_stop": null, "kind": "trainer", "metrics": {}, "module": null, '
        '"name": "cartpole", "nproc": null, "objective": {}, "requirements": [], "requirements_file": nul'
        'l, "script": null, "setup": null, "shared": null, "tch_version": "auto", "toolchain": "stable"}'
    ),
}


def _unclassified(cls: type) -> set[str]:
    return {f.name for f in fields(cls)} - set(HOST_FIELDS) - set(LAPTOP_FIELDS)


def test_each_job_field_is_sent_or_kept_on_the_laptop_never_both() -> None:
    assert not _unclassified(JobConfig), (
        "a JobConfig field is neither sent to hosts nor kept on the laptop: add it to HOST_FIELDS (it changes "
        "every preflight cache key) or to LAPTOP_FIELDS (with why) in host/jobspec.py")
    assert not set(HOST_FIELDS) & set(LAPTOP_FIELDS)
    assert set(HOST_FIELDS) <= {f.name for f in fields(JobConfig)}  # no stale name: each one is read


def test_a_new_job_field_reaches_no_spec_until_it_is_classified() -> None:
    @dataclass(frozen=True)
    class Wider(JobConfig):
        laptop_secret: str = "s3cr3t"

    assert _unclassified(Wider) == {"laptop_secret"}  # what the test above says of a field added to JobConfig
    spec = job_spec(Wider(name="j"))
    assert "laptop_secret" not in spec
    assert spec == job_spec(JobConfig(name="j"))  # the cache key of an unchanged job stays as it was


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_todays_jobs_send_the_spec_they_sent_before_the_allow_list(name: str) -> None:
    spec = job_spec(parse_config_text(YAML, Path("thrust.yaml")).job(name))
    assert json.dumps(spec, sort_keys=True) == BEFORE[name]
    assert json.loads(json.dumps(spec)) == json.loads(BEFORE[name])


def test_the_laptops_fields_are_not_sent() -> None:
    spec = job_spec(parse_config_text(YAML, Path("thrust.yaml")).job("ppo"))
    assert not set(LAPTOP_FIELDS) & set(spec)
    assert set(spec) == set(HOST_FIELDS)
