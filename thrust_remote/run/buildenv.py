"""A job's environment, from envcheck's facts.

The job crosses to the host as one plain spec (host/jobspec.py: `job_spec(job)`, what envcheck's
`--job-json` carries), built once per train at the boundary and passed on. `build_env` is a job's environment:
for a python job PYTHONUNBUFFERED=1 and PYTHONFAULTHANDLER=1 plus the job's `env:`; for a cargo job
the tch-rs variables (LIBTORCH_USE_PYTORCH, LD_LIBRARY_PATH, LD_PRELOAD, RUSTFLAGS), whose rules live
in envcheck.buildenv (standard library, also used on the host to judge a build's env). A cargo job's
build and run are run/cargo.py's plan.
"""

from __future__ import annotations

from envcheck import buildenv as _core
from thrust_remote.host.jobspec import JobLike, job_spec

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
