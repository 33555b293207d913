"""`jobs:`: one JobConfig per name. A job's kind is settled first (as written, else from its keys), then
each key is read by its entry of JOB_VALUES, which says which JobConfig field(s) it fills. A job named
as a built-in one (snake, cartpole) changes it key by key while its kind stays."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import yaml

from thrust_remote.core.config import job_values, retry
from thrust_remote.core.config.model import JOB_KINDS, JobConfig, Workers
from thrust_remote.core.config.notify import parse_notify
from thrust_remote.core.config.reader import Reader, line
from thrust_remote.core.config.values import DATA_KEYS, argv, check_name, data_value, items, repo_path, words

JOB_KEYS = (
    "kind", "script", "module", "command", "args", "requirements", "nproc", "workers", "artifacts", "metrics",
    "objective", "export", "env", "toolchain", "example", "crate", "artifact", "tch_version", "bypass_version_check",
    "notify", "idle_stop", "max_duration", "checkpoints", "resume", "sync_every", "retry", "flags", *DATA_KEYS,
)
# Keys only some kinds take: another kind's job names them as an error (the cargo keys stay lenient).
KIND_ONLY = {
    "script": ("python",),
    "module": ("python",),
    "command": ("command",),
    "args": ("trainer", "python", "cargo"),
    # a command job's venv is made as a python job's, its bin first on the command's PATH (agent/job.py)
    "requirements": ("trainer", "python", "command"),
    "nproc": ("trainer", "python"),
    "workers": ("python", "command"),  # the built-in trainer runs under torchrun
    "flags": ("python", "command", "cargo"),  # the built-in trainer's flags are its own (trainer/args.py)
}

# (reader, the job's kind, key, field, value node) -> the JobConfig fields the key sets
JobValue = Callable[[Reader, str, str, str, yaml.Node], dict[str, Any]]


def parse_jobs(reader: Reader, node: yaml.Node, jobs: dict[str, JobConfig]) -> None:
    """`jobs:` into `jobs`, each over the built-in job of its name if there is one."""
    for name, name_node, job_node in reader.mapping(node, "jobs"):
        check_name(reader, name_node, f"jobs.{name}", name)
        jobs[name] = parse_job(reader, name, job_node, jobs.get(name), name_node)


def parse_job(reader: Reader, name: str, node: yaml.Node, base: JobConfig | None, name_node: yaml.Node) -> JobConfig:
    keys = {key: (key_node, value) for key, key_node, value in reader.mapping(node, f"jobs.{name}")}
    for key, (key_node, _value) in keys.items():
        if key not in JOB_KEYS:
            raise reader.unknown(key_node, f"jobs.{name}.{key}", JOB_KEYS)
    kind = _job_kind(reader, name, keys, base)
    values: dict[str, Any] = {"kind": kind} if "kind" in keys else {}
    for key, (key_node, value) in keys.items():
        f = f"jobs.{name}.{key}"
        allowed = KIND_ONLY.get(key, JOB_KINDS)
        if kind not in allowed:
            raise reader.fail(key_node, f, f"not for a {kind} job (only {', '.join(allowed)} jobs take it)")
        if key == "module" and "script" in keys:
            raise reader.fail(key_node, f, "give script: or module:, not both")
        if key != "kind":
            values.update(JOB_VALUES[key](reader, kind, key, f, value))
    if kind == "cargo" and not (values.get("example") or (base and base.example)):
        raise reader.fail(name_node, f"jobs.{name}.example", "a cargo job needs `example:` (the --example to build)")
    if kind == "command" and "command" not in keys:
        raise reader.fail(name_node, f"jobs.{name}.command",
                          "a command job needs `command:`, a list like [bash, devops/train.sh]")
    retry.check_resumable(reader, name, kind, keys, values, base)
    values["lines"] = {"job": line(name_node), **{key: line(kn) for key, (kn, _v) in keys.items()}}
    start = base if base is not None and base.kind == kind else JobConfig(name=name, kind=kind)
    return replace(start, **values)


def _job_kind(reader: Reader, name: str, keys: Mapping[str, tuple[yaml.Node, yaml.Node]],
              base: JobConfig | None) -> str:
    """`kind:` as written, else what the keys say; `kind: python` without script:/module: is the
    built-in trainer, as it was before the kinds existed (docs/architecture.md, "Config")."""
    if "kind" in keys:
        kind = reader.choice(keys["kind"][1], f"jobs.{name}.kind", JOB_KINDS)
        if kind == "python" and "script" not in keys and "module" not in keys:
            return "trainer"
        return kind
    if "script" in keys or "module" in keys:
        return "python"
    if "command" in keys:
        return "command"
    return base.kind if base is not None else "trainer"


def _field(parse: Callable[[Reader, str, yaml.Node], Any]) -> JobValue:
    """A parser of one value as the entry that sets the job's field named as the key."""
    return lambda reader, kind, key, f, value: {key: parse(reader, f, value)}


def _text(reader: Reader, kind: str, key: str, f: str, value: yaml.Node) -> dict[str, Any]:
    """export:, example:, artifact: (each may be null), toolchain:, tch_version:, crate:."""
    text = reader.string(value, f, nullable=key in ("export", "example", "artifact"))
    if text is not None and (not text or text.startswith("-")):
        raise reader.fail(value, f, "expected a non-empty value that does not start with '-'")
    return {key: text}


# pip's own spelling of "the specs in this file" inside a list: `-r requirements.txt` (or --requirement)
_FILE_WORD = re.compile(r"(?:-r|--requirement)(?:\s+|=)(\S.*)")


def _requirements(reader: Reader, kind: str, key: str, f: str, value: yaml.Node) -> dict[str, Any]:
    """A requirements file in the repo (one value), or a list of pip specs, which may name one file
    of the repo as pip does (`[-r requirements.txt, tensorboard]`): the file's specs and the list's
    together, so a project's own file needs no copy to add what a thrust.yaml key asks (tensorboard)."""
    if isinstance(value, yaml.ScalarNode):
        return {"requirements_file": repo_path(reader, f, value)}
    expected = "a requirements file or a list of pip specs like [gymnasium>=1.0]"
    specs, files = [], []
    for item in items(reader, f, value, expected):
        named = _FILE_WORD.fullmatch(item.value.strip()) if isinstance(item, yaml.ScalarNode) else None
        (files if named else specs).append(item)
    if len(files) > 1:
        raise reader.fail(files[1], f, "one requirements file per job (`-r FILE` once); list the other's "
                                       "specs here, or join the files")
    out: dict[str, Any] = {key: tuple(words(reader, f, yaml.SequenceNode(value.tag, specs), expected, pip=True))}
    if files:
        path = _FILE_WORD.fullmatch(files[0].value.strip()).group(1)  # type: ignore[union-attr]
        out["requirements_file"] = repo_path(reader, f, yaml.ScalarNode(
            "tag:yaml.org,2002:str", path, files[0].start_mark, files[0].end_mark))
    return out


WORKERS_KEYS = ("count", "port")
WORKERS_EXAMPLE = "workers: {count: --num-gpus, port: --master-port}"


def _workers(reader: Reader, kind: str, key: str, f: str, value: yaml.Node) -> dict[str, Any]:
    """`workers: {count: FLAG, port: FLAG}`: the flags a script that starts its own workers takes its
    process count and its rendezvous port by (model.Workers)."""
    if not isinstance(value, yaml.MappingNode):
        raise reader.fail(value, f, f"expected the flags the job takes its workers by, like `{WORKERS_EXAMPLE}`")
    flags: dict[str, str] = {}
    for name, name_node, flag_node in reader.mapping(value, f):
        if name not in WORKERS_KEYS:
            raise reader.unknown(name_node, f"{f}.{name}", WORKERS_KEYS)
        flag = reader.string(flag_node, f"{f}.{name}")
        if not flag or not flag.startswith("-") or not flag.strip("-") or any(c.isspace() or c == "=" for c in flag):
            raise reader.fail(flag_node, f"{f}.{name}",
                              f"expected a flag of the job's own like --num-gpus, got {flag!r}")
        flags[name] = flag
    if "count" not in flags:
        raise reader.fail(value, f"{f}.count", "say the flag the job takes its process count by, like "
                          "`count: --num-gpus` (and `port: --master-port` if it takes a port)")
    if flags.get("port") == flags["count"]:
        raise reader.fail(value, f"{f}.port", f"count and port are one flag ({flags['count']})")
    return {key: Workers(flags["count"], flags.get("port"))}


def _data(reader: Reader, kind: str, key: str, f: str, value: yaml.Node) -> dict[str, Any]:
    """files:, setup:, shared: (the job's own: they replace the top level's)."""
    return {key: data_value(reader, key, f, value)}


JOB_VALUES: Mapping[str, JobValue] = {
    **dict.fromkeys(("export", "example", "artifact", "toolchain", "tch_version", "crate"), _text),
    "bypass_version_check": _field(lambda reader, f, value: reader.boolean(value, f)),
    "env": _field(job_values.env),
    "args": lambda reader, kind, key, f, value: {key: job_values.args(reader, kind, f, value)},
    "script": _field(repo_path),
    "module": _field(job_values.module),
    "command": _field(argv),
    "requirements": _requirements,
    "nproc": _field(job_values.nproc),
    "workers": _workers,
    "artifacts": _field(job_values.artifacts),
    "metrics": _field(job_values.metrics),
    "flags": _field(job_values.flags),
    "notify": _field(parse_notify),
    "idle_stop": _field(job_values.idle_stop_section),
    "max_duration": _field(job_values.max_duration),
    "checkpoints": _field(repo_path),
    "resume": retry.resume_fields,
    "sync_every": _field(retry.sync_every),
    "retry": _field(retry.retry_section),
    "objective": _field(job_values.objective),
    **dict.fromkeys(DATA_KEYS, _data),
}
