"""A job as the host sees it, and its environment, from envcheck's facts.

The job crosses to the host as one plain spec (`job_spec(job)`: what envcheck's `--job-json`
carries), built once per train at the boundary and passed on. `build_env` is a job's environment:
for a python job PYTHONUNBUFFERED=1 and PYTHONFAULTHANDLER=1 plus the job's `env:`; for a cargo job
the tch-rs variables (LIBTORCH_USE_PYTORCH, LD_LIBRARY_PATH, LD_PRELOAD, RUSTFLAGS), whose rules live
in envcheck.buildenv (standard library, also used on the host to judge a build's env). A cargo job's
build and run are run/cargo.py's plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, TypeAlias

from envcheck import buildenv as _core
from thrust_remote.core.config import JobConfig

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
    del data["notify"]  # the laptop's own (a webhook URL is a secret): never sent to a host
    # what the laptop does while it follows a run (pulls, resume, retry): no concern of the host's, and
    # a preflight cached on the spec stays valid when they change
    for key in ("checkpoints", "resume", "sync_every", "retry"):
        del data[key]
    return data


job_dict = job_spec  # the name envcheck's tests and older callers know
without_env_values = _core.without_env_values  # a spec a report or a cache key may keep: env names only


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
