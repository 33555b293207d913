"""The environment and command lines of a job on a host, computed from envcheck's facts.

Nobody types LIBTORCH_USE_PYTORCH / LD_LIBRARY_PATH / LD_PRELOAD / RUSTFLAGS by hand again: the train
pipeline runs envcheck (doctor.run_doctor or doctor.collect_facts), then asks this module for the
env and the argv. The rules live in envcheck.buildenv (standard library, also used on the host to
judge the env and fingerprint builds); this module adapts them to JobConfig and the Runner.

The job crosses to the host as one plain spec (`job_spec(job)`: what envcheck's `--job-json`
carries), built once per train at the boundary and passed on; every function here takes that spec
(a JobConfig is still accepted and converted, for callers outside the pipeline).

Pipeline for a cargo job:
    job = job_spec(job_config)
    report = doctor.run_doctor(runner, host, job); facts = report.facts
    env = build_env(facts, job)                          # same env for build and run
    if report.check("stale-build").status in ("fail", "warn"):   # the env changed since the last build
        runner.run(cargo_clean_argv(facts, job), env=env, cwd=crate_dir(facts, job)).check("cargo clean")
    runner.run(cargo_build_argv(facts, job), env=env, cwd=crate_dir(facts, job)).check("cargo build")
    write_fingerprint(runner, facts, job)                # lets doctor spot a stale build later
    runner.run(cargo_run_argv(facts, job), env=env, cwd=crate_dir(facts, job))
A python job only needs build_env(facts, job) (PYTHONUNBUFFERED=1, PYTHONFAULTHANDLER=1 + job.env).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, TypeAlias

from envcheck import buildenv as _core
from thrust_remote.core.config import JobConfig
from thrust_remote.host.runner import Runner

FINGERPRINT_FILE = _core.FINGERPRINT_FILE
rustflags = _core.rustflags

JobSpec: TypeAlias = dict[str, Any]  # a job as plain JSON-able data (docs/architecture.md, "JSON shapes")
JobLike: TypeAlias = "JobConfig | JobSpec"


def job_spec(job: JobConfig | Mapping[str, Any] | None) -> JobSpec:
    """A JobConfig as the plain dict envcheck takes (what `--job-json` carries). A spec is returned
    as it is: the conversion happens once, where the job leaves the laptop's config."""
    if job is None:
        return {}
    if isinstance(job, Mapping):
        return job  # type: ignore[return-value]
    data = asdict(job)
    data["args"] = dict(job.args) if isinstance(job.args, Mapping) else list(job.args)  # tuples/mappings -> JSON
    for key in ("env", "metrics", "objective"):
        data[key] = dict(getattr(job, key))
    for key in ("requirements", "command", "artifacts"):
        data[key] = list(getattr(job, key))
    del data["lines"]  # where thrust.yaml wrote it: not the host's business, and not part of any cache key
    return data


job_dict = job_spec  # the name envcheck's tests and older callers know


def build_env(facts: dict, job: JobLike) -> dict[str, str]:
    """Variables to set (on top of the host's own env) for a job's build and run.

    cargo: LIBTORCH_USE_PYTORCH=1, LD_LIBRARY_PATH=<torch>/lib:..., LD_PRELOAD=libtorch_cuda.so:
    libtorch.so (CUDA wheels), RUSTFLAGS (--no-as-needed, -ltorch[_cuda], rpath),
    LIBTORCH_BYPASS_VERSION_CHECK=1 only with bypass_version_check, then job.env.
    python: PYTHONUNBUFFERED=1, PYTHONFAULTHANDLER=1, then job.env.
    """
    return _core.job_env(facts, job_spec(job))


def python_env(facts: dict, job: JobLike) -> dict[str, str]:
    return _core.python_env(facts, job_spec(job))


def crate_dir(facts: dict, job: JobLike) -> str:
    """The crate's absolute directory on the host (workdir/job.crate), as envcheck resolved it."""
    crate = facts.get("crate") or {}
    if crate.get("dir"):
        return crate["dir"]
    workdir = (facts.get("workdir") or {}).get("path") or "."
    return os.path.normpath(os.path.join(workdir, job_spec(job).get("crate") or "."))


def cargo_build_argv(facts: dict, job: JobLike) -> list[str]:
    """[cargo, +TOOLCHAIN, build, --release, --example, X]; run with cwd=crate_dir and build_env."""
    return _core.cargo_build_argv(facts, job_spec(job))


def cargo_clean_argv(facts: dict, job: JobLike) -> list[str]:
    """[cargo, clean] with the cargo envcheck found (~/.cargo/bin is often not on an SSH PATH);
    run with cwd=crate_dir and build_env (it carries CARGO_TARGET_DIR when the job sets one)."""
    return [_core.cargo_bin(facts), "clean"]


def cargo_run_argv(facts: dict, job: JobLike) -> list[str]:
    """[<target>/release/examples/X, *job.args]: the built binary itself, not `cargo run`."""
    return _core.cargo_run_argv(facts, job_spec(job))


def target_dir(facts: dict, job: JobLike) -> str:
    crate = facts.get("crate") or {}
    if crate.get("target_dir"):
        return crate["target_dir"]
    return _core.target_dir(crate_dir(facts, job), job_spec(job), facts.get("env") or {})


def fingerprint(facts: dict, job: JobLike) -> dict:
    """{'version', 'digest', 'inputs'} for the current env: torch version/lib/CUDA/ABI, toolchain,
    profile and the build variables torch-sys and the linker read."""
    return _core.fingerprint(facts, job_spec(job))


def fingerprint_path(facts: dict, job: JobLike) -> str:
    """<target dir>/.thrust-build-env.json (inside target/, so `cargo clean` removes it too)."""
    return os.path.join(target_dir(facts, job), FINGERPRINT_FILE)


def write_fingerprint(runner: Runner, facts: dict, job: JobLike) -> str:
    """After a successful cargo build: store the env it used on the host. Returns the remote path."""
    path = fingerprint_path(facts, job)
    with tempfile.TemporaryDirectory(prefix="thrust-fp-") as tmp:
        local = os.path.join(tmp, FINGERPRINT_FILE)
        with open(local, "w") as fh:
            json.dump(fingerprint(facts, job), fh, indent=2, sort_keys=True)
        runner.put(local, path)
    return path
