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


def resume(reader: Reader, f: str, node: yaml.Node) -> tuple[str, ...]:
    """The arguments that continue a run from a checkpoint, like [--resume-from, "{checkpoint}"]."""
    argv = words(reader, f, node, 'a list of arguments like [--resume-from, "{checkpoint}"]')
    if not any(CHECKPOINT_FIELD in w for w in argv):
        raise reader.fail(node, f, f'expected the checkpoint\'s place in the arguments, "{CHECKPOINT_FIELD}", '
                                   'as in [--resume-from, "{checkpoint}"]')
    return tuple(argv)


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
    has = {k: values.get(k, getattr(base, k, None) if base is not None else None) for k in ("checkpoints", "resume")}
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
