"""Runs that outlive their host (docs/architecture.md, "Checkpoints and resume"): a job's `resume:`,
`sync_every:` and `retry:`, and the checks that tie them to its `checkpoints:` and to the hosts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from thrust_remote.agent.protocol import CHECKPOINT_FIELD  # the field the agent fills: the protocol's word
from thrust_remote.core.config.model import HostConfig, JobConfig
from thrust_remote.core.config.reader import Reader, line, pytype
from thrust_remote.core.config.sections import RETRY_ON, RETRY_ON_DEFAULT, RetryConfig
from thrust_remote.core.config.values import words
from thrust_remote.core.errors import ConfigError

RESUME_KEYS = ("args", "checkpoint_at")
RESUME_FORMS = ('[--resume-from, "{checkpoint}"] (the path in the arguments), or {args: [--init_from=resume], '
                "checkpoint_at: out/ckpt.pt} (where your code reads it, relative to its working directory)")


def resume_fields(reader: Reader, kind: str, key: str, f: str, node: yaml.Node) -> dict[str, Any]:
    """A job's `resume:` as JobConfig's two fields: `resume` (the arguments that continue a run) and
    `resume_at` (where the job reads its checkpoint, relative to its working directory; None: the
    arguments name it, "{checkpoint}"). Both set, so a job's `resume:` replaces a built-in's whole."""
    if isinstance(node, yaml.MappingNode):
        args, at = _resume_at(reader, f, node)
        return {"resume": args, "resume_at": at}
    return {"resume": resume(reader, f, node), "resume_at": None}


def resume(reader: Reader, f: str, node: yaml.Node) -> tuple[str, ...]:
    """The list form of `resume:`: the arguments that continue a run from a checkpoint, naming it, like
    [--resume-from, "{checkpoint}"]."""
    argv = words(reader, f, node, f"either {RESUME_FORMS}")
    if not any(CHECKPOINT_FIELD in w for w in argv):
        raise reader.fail(node, f, f'expected the checkpoint\'s place in the arguments, "{CHECKPOINT_FIELD}", '
                                   'as in [--resume-from, "{checkpoint}"]; a job that reads it from a fixed place '
                                   "of its tree says where: {args: [--init_from=resume], checkpoint_at: out/ckpt.pt}")
    return tuple(argv)


def _resume_at(reader: Reader, f: str, node: yaml.Node) -> tuple[tuple[str, ...], str]:
    """`{args: [...], checkpoint_at: PATH}` as (the arguments, PATH): PATH inside the job's tree (relative,
    no `..`: checked again on the host, links resolved), the arguments without "{checkpoint}" (the job
    finds it at PATH; `{checkpoint_at: P}` alone: none, a job that continues whenever P is there)."""
    argv: list[str] = []
    at: str | None = None
    for key, key_node, value in reader.mapping(node, f):
        if key == "args":
            argv = words(reader, f"{f}.args", value, "a list of arguments like [--init_from=resume]")
            if any(CHECKPOINT_FIELD in w for w in argv):
                raise reader.fail(value, f"{f}.args", f'"{CHECKPOINT_FIELD}" has no place here: with '
                                  "`checkpoint_at:` the checkpoint is put where your code reads it; either "
                                  f"drop `checkpoint_at:` and write {RESUME_FORMS.split(' (')[0]}, or drop "
                                  f'"{CHECKPOINT_FIELD}"')
        elif key == "checkpoint_at":
            at = _inside(reader, f"{f}.checkpoint_at", value)
        else:
            raise reader.unknown(key_node, f"{f}.{key}", RESUME_KEYS)
    if at is None:
        raise reader.fail(node, f"{f}.checkpoint_at", "missing: where your code reads the checkpoint, relative to "
                                                      "its working directory, as in {args: [--init_from=resume], "
                                                      "checkpoint_at: out/ckpt.pt}")
    return tuple(argv), at


def _inside(reader: Reader, f: str, node: yaml.Node) -> str:
    """A file's path relative to the job's working directory that stays inside its tree."""
    text = reader.string(node, f) or ""
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if text.startswith(("/", "~")) or "$" in text:
        raise reader.fail(node, f, f"expected a path relative to the job's working directory (inside the run's "
                                   f"own tree), like out/ckpt.pt, got {text!r}")
    if ".." in parts or not parts or text.endswith("/"):
        raise reader.fail(node, f, f"expected a file's path inside the run's own tree (no `..`), like out/ckpt.pt, "
                                   f"got {text!r}")
    return "/".join(parts)


def sync_every(reader: Reader, f: str, node: yaml.Node) -> float:
    return reader.seconds(node, f, "seconds between pulls", zero=True)


def retry_section(reader: Reader, f: str, node: yaml.Node) -> RetryConfig:
    """`retry:` as its type (JobConfig.retry): where `hosts:` was written is the section's own
    bookkeeping field (`hosts_line`), never one of its keys."""
    return RetryConfig(**retry(reader, f, node))


def retry(reader: Reader, f: str, node: yaml.Node) -> dict[str, Any]:
    """`{max: N, on: [host-lost, lost, failed], hosts: [a, b]}`; `max` is needed, the rest has defaults."""
    out: dict[str, Any] = {"on": RETRY_ON_DEFAULT, "hosts": ()}
    for key, key_node, value in reader.mapping(node, f):
        if key == "max":
            n = reader.scalar(value, f"{f}.max")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise reader.fail(value, f"{f}.max",
                                  f"expected a number of retries (an integer >= 0), got {pytype(n)}")
            out["max"] = n
        elif key == "on":
            events = words(reader, f"{f}.on", value, f"a list of {', '.join(RETRY_ON)}")
            for event in events:
                if event not in RETRY_ON:
                    raise reader.fail(value, f"{f}.on", f"{event!r} is not one of {', '.join(RETRY_ON)}")
            out["on"] = tuple(events)
        elif key == "hosts":
            out["hosts"] = tuple(words(reader, f"{f}.hosts", value, "a list of host names"))
            out["hosts_line"] = line(value)
        elif key == "grace":
            out["grace"] = sync_every(reader, f"{f}.grace", value)  # seconds >= 0, as sync_every's
        else:
            raise reader.unknown(key_node, f"{f}.{key}", ("max", "on", "hosts", "grace"))
    if "max" not in out:
        raise reader.fail(node, f"{f}.max", "missing: retry takes {max: N, on: [...], hosts: [...]}")
    return out


def check_resumable(reader: Reader, name: str, kind: str, keys: Mapping[str, tuple[yaml.Node, yaml.Node]],
                    values: Mapping[str, Any], base: JobConfig | None) -> None:
    """`retry:` resumes from checkpoints, and `resume:` continues from one: a job of your own that gives
    either says where its checkpoints are and how it continues (the built-in trainer's are known)."""
    if kind == "trainer":
        return
    has = {k: values.get(k, getattr(base, k, None) if base is not None else None)
           for k in ("checkpoints", "resume", "resume_at")}
    has["resume"] = has["resume"] or has["resume_at"]  # `{checkpoint_at: P}` alone says how it continues
    for key, needs in (("retry", ("checkpoints", "resume")), ("resume", ("checkpoints",))):
        missing = [n for n in needs if not has[n]]
        if key in keys and missing:
            raise reader.fail(keys[key][0], f"jobs.{name}.{key}",
                              f"needs {' and '.join(f'`{n}:`' for n in missing)} too (where your code writes its "
                              'checkpoints, and the arguments that continue from one: [--resume-from, "{checkpoint}"])')


def check_retry_hosts(reader: Reader, jobs: Mapping[str, JobConfig], hosts: Mapping[str, HostConfig],
                      groups: Mapping[str, tuple[str, ...]]) -> None:
    """A job's `retry: {hosts: [...]}` names hosts (or groups) this config defines."""
    for job in jobs.values():
        unknown = [n for n in (job.retry.hosts if job.retry else ()) if n not in hosts and n not in groups]
        if job.retry and unknown:
            raise ConfigError(f"{reader.label}:{job.retry.hosts_line}: jobs.{job.name}.retry.hosts: {unknown[0]!r} "
                              "is not a host defined under hosts: (or a group)")
