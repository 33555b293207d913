"""thrust.yaml as a Config: found (explicit path > THRUST_CONFIG > search upwards), read through the
bounded composer, each top-level key handed to its section's parser by SECTIONS, then the checks that
span sections (default_host, groups, a retry's hosts), then THRUST_HOST and the flags on top.
Precedence: command-line flags > THRUST_* environment > thrust.yaml > built-in defaults."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.config.bounded import compose_yaml, read_text
from thrust_remote.core.config.discovery import find_config
from thrust_remote.core.config.hosts import parse_hosts
from thrust_remote.core.config.job_values import check_several_words
from thrust_remote.core.config.jobs import parse_jobs
from thrust_remote.core.config.model import (
    ENV_CONFIG,
    ENV_HOST,
    LOCAL,
    Config,
    HostConfig,
    JobConfig,
    NotifyConfig,
    defaults,
)
from thrust_remote.core.config.notify import parse_notify
from thrust_remote.core.config.reader import Reader, line, shape
from thrust_remote.core.config.retry import check_retry_hosts
from thrust_remote.core.config.search import check_search_words, parse_searches
from thrust_remote.core.config.values import DATA_KEYS, check_name, data_value, words
from thrust_remote.core.errors import ConfigError
from thrust_remote.core.names import bad_name_reason


def load_config(
    path: str | Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    default_host: str | None = None,
) -> Config:
    """Load thrust.yaml (explicit path > THRUST_CONFIG > search upwards), apply env and flags."""
    env = os.environ if environ is None else environ
    explicit = path or env.get(ENV_CONFIG)
    if explicit:
        cfg_path = Path(explicit).expanduser()
        if not cfg_path.is_file():
            raise ConfigError(f"config file {cfg_path} does not exist")
    else:
        cfg_path = find_config()
    config = parse_config_text(read_text(cfg_path), cfg_path) if cfg_path else defaults(None)
    if explicit and cfg_path:
        given = str(cfg_path.resolve())
        hosts = {name: replace(h, config_path=given) for name, h in config.hosts.items()}
        jobs = {name: replace(j, config_path=given) for name, j in config.jobs.items()}
        config = replace(config, hosts=hosts, jobs=jobs, given=True)
    host = default_host or env.get(ENV_HOST) or None
    if host:
        reason = bad_name_reason(host, "host name")
        if reason:
            raise ConfigError(reason)
        config = replace(config, default_host=host, default_from_env=not default_host)
    return config


@dataclass
class _Draft:
    """What the sections have read so far; the built-in host and jobs are there before any section."""

    hosts: dict[str, HostConfig]
    jobs: dict[str, JobConfig]
    default_host: str = LOCAL
    default_host_node: yaml.Node | None = None
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    group_nodes: dict[str, yaml.Node] = field(default_factory=dict)
    search: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    search_lines: dict[str, int] = field(default_factory=dict)
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    data: dict[str, tuple[str, ...]] = field(default_factory=dict)
    data_lines: dict[str, int] = field(default_factory=dict)


# (reader, draft, key, key node, value node): reads one top-level key into the draft
Section = Callable[[Reader, _Draft, str, yaml.Node, yaml.Node], None]


def _default_host(reader: Reader, draft: _Draft, key: str, key_node: yaml.Node, value: yaml.Node) -> None:
    draft.default_host = reader.string(value, key) or LOCAL
    draft.default_host_node = value


def _groups(reader: Reader, draft: _Draft, key: str, key_node: yaml.Node, value: yaml.Node) -> None:
    for name, name_node, members in reader.mapping(value, "groups"):
        check_name(reader, name_node, f"groups.{name}", name)
        draft.groups[name] = tuple(words(reader, f"groups.{name}", members, "a list of host names"))
        draft.group_nodes[name] = members


def _notify(reader: Reader, draft: _Draft, key: str, key_node: yaml.Node, value: yaml.Node) -> None:
    draft.notify = parse_notify(reader, "notify", value)


def _data(reader: Reader, draft: _Draft, key: str, key_node: yaml.Node, value: yaml.Node) -> None:
    draft.data[key] = data_value(reader, key, key, value)
    draft.data_lines[key] = line(key_node)


# the top-level keys, in the order an unknown key's message lists them
SECTIONS: Mapping[str, Section] = {
    "default_host": _default_host,
    "hosts": lambda reader, draft, key, key_node, value: parse_hosts(reader, value, draft.hosts),
    "groups": _groups,
    "jobs": lambda reader, draft, key, key_node, value: parse_jobs(reader, value, draft.jobs),
    "search": lambda reader, draft, key, key_node, value: parse_searches(reader, value, draft.search,
                                                                         draft.search_lines),
    "notify": _notify,
    **dict.fromkeys(DATA_KEYS, _data),
}
TOP_KEYS = tuple(SECTIONS)


def parse_config_text(text: str, path: Path | None = None) -> Config:
    reader = Reader(path)
    root = compose_yaml(text, reader.label)
    config = defaults(path)
    if root is None:
        return config
    if not isinstance(root, yaml.MappingNode):  # a file given by mistake (`--config .env`): never its text
        raise reader.fail(root, "", f"expected a mapping of settings ({', '.join(TOP_KEYS)}), got "
                                    f"{shape(root)}; is this the file you meant?")
    draft = _Draft(hosts=dict(config.hosts), jobs=dict(config.jobs))
    for key, key_node, value in reader.mapping(root, ""):
        if key not in SECTIONS:
            raise reader.unknown(key_node, key, TOP_KEYS)
        SECTIONS[key](reader, draft, key, key_node, value)
    if draft.default_host not in draft.hosts:
        assert draft.default_host_node is not None
        raise reader.fail(
            draft.default_host_node, "default_host", f"{draft.default_host!r} is not a host defined under hosts:"
        )
    _check_groups(reader, draft.groups, draft.group_nodes, draft.hosts)
    check_retry_hosts(reader, draft.jobs, draft.hosts, draft.groups)
    check_several_words(reader.label, draft.jobs)
    check_search_words(reader.label, draft.search, draft.search_lines, draft.jobs)
    return Config(path=path, default_host=draft.default_host, hosts=draft.hosts, jobs=draft.jobs,
                  search=draft.search, groups=draft.groups, notify=draft.notify, search_lines=draft.search_lines,
                  data_lines=draft.data_lines, **draft.data)


def _check_groups(reader: Reader, groups: Mapping[str, tuple[str, ...]], nodes: Mapping[str, yaml.Node],
                  hosts: Mapping[str, HostConfig]) -> None:
    """Each group names hosts defined under `hosts:`, each once, and no group shadows a host."""
    for name, members in groups.items():
        where = f"groups.{name}"
        if name in hosts:
            raise reader.fail(nodes[name], where, f"{name!r} is also a host's name; give the group another name")
        if not members:
            raise reader.fail(nodes[name], where, "expected a non-empty list of host names")
        for member in members:
            if member not in hosts:
                raise reader.fail(nodes[name], where, f"{member!r} is not a host defined under hosts:")
        if len(set(members)) != len(members):
            raise reader.fail(nodes[name], where, "a host is listed twice; each host is one node")
