"""A job as the host sees it: one plain spec, converted once where the job leaves the laptop's config.

The spec is what envcheck's `--job-json` carries (host/report.py), what a preflight's cache key is built
from (run/preflight.py) and what every stage of a run passes on (docs/architecture.md, "The flow of one
train"). It lives here, below run/ and doctor/, because both send a job to a host.

It is built from an allow-list: HOST_FIELDS are sent, LAPTOP_FIELDS never are, and every JobConfig field
is in exactly one of them (tests/test_jobspec_fields.py). A new job field reaches no host, and changes
no preflight cache key, until someone decides it should.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from thrust_remote.core.config import JobConfig

JobSpec: TypeAlias = dict[str, Any]  # a job as plain JSON-able data (docs/architecture.md, "JSON shapes")
JobLike: TypeAlias = "JobConfig | JobSpec"


def _plain(value: Any) -> Any:
    """A value as it has always crossed: a section as the keys written, a mapping as a dict."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    return dict(value) if isinstance(value, Mapping) else value


def _listed(value: tuple[Any, ...]) -> list[Any]:
    return list(value)


# The fields the host needs, in JobConfig's order, each with how it becomes JSON-able: what the job runs
# (kind, script, module, command, args, nproc, env), what its venv or build takes (requirements, the cargo
# keys), what its tree and results are (files, setup, shared, artifacts, export), and what the host reads
# of its output (metrics, flags, objective, idle_stop).
HOST_FIELDS: Mapping[str, Callable[[Any], Any]] = {
    "name": _plain,
    "kind": _plain,
    "args": lambda args: dict(args) if isinstance(args, Mapping) else list(args),
    "export": _plain,
    "env": _plain,
    "requirements": _listed,
    "requirements_file": _plain,
    "script": _plain,
    "module": _plain,
    "nproc": _plain,
    "command": _listed,
    "artifacts": _listed,
    "metrics": _plain,
    "flags": _plain,
    "objective": lambda objective: {} if objective is None else objective.as_dict(),  # none: as it always was
    "idle_stop": _plain,
    "files": _plain,
    "setup": _plain,
    "shared": _plain,
    "toolchain": _plain,
    "example": _plain,
    "crate": _plain,
    "artifact": _plain,
    "tch_version": _plain,
    "bypass_version_check": _plain,
}
# The fields that stay on the laptop, and why
LAPTOP_FIELDS: Mapping[str, str] = {
    "lines": "where thrust.yaml wrote each key: not the host's business, and not part of any cache key",
    "config_path": "the config file the user named, for the laptop's hints: not the host's business",
    "notify": "the laptop's own (a webhook URL is a secret): never sent to a host",
    # what the laptop does while it follows a run (pulls, resume, retry): a preflight cached on the spec
    # stays valid when they change
    "checkpoints": "the laptop pulls them while it follows",
    "resume": "the laptop fills it in when it resumes a run",
    "resume_at": "the laptop places the checkpoint there when it resumes a run (a cluster's run: in its retry plan)",
    "sync_every": "the laptop's pull interval",
    "workers": "the laptop writes its count and port flags into the argv it sends",
    "retry": "the laptop's policy while it follows (a cluster's run's own is sent in run.json)",
    "max_duration": "sent in the launch's run.json (each run's own, `train --max-duration`), not the spec",
}


def job_spec(job: JobConfig | Mapping[str, Any] | None) -> JobSpec:
    """A JobConfig as the plain dict envcheck takes (what `--job-json` carries): HOST_FIELDS only. A spec
    is returned as it is: the conversion happens once, where the job leaves the laptop's config."""
    if job is None:
        return {}
    if isinstance(job, Mapping):
        return job  # type: ignore[return-value]
    return {name: convert(getattr(job, name)) for name, convert in HOST_FIELDS.items()}
