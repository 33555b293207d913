"""A job as the host sees it: one plain spec, converted once where the job leaves the laptop's config.

The spec is what envcheck's `--job-json` carries (host/report.py), what a preflight's cache key is built
from (run/preflight.py) and what every stage of a run passes on (docs/architecture.md, "The flow of one
train"). It lives here, below run/ and doctor/, because both send a job to a host.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, TypeAlias

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
