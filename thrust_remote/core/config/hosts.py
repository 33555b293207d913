"""`hosts:`: one HostConfig per name, each key read by its own entry of HOST_VALUES; a Slurm login
node's keys (core/scheduler.py) are gathered and checked together, since they only mean something with
`scheduler: slurm`."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import yaml

from thrust_remote.core.config.model import HOST_KEY_POLICIES, LOCAL, HostConfig, local_host
from thrust_remote.core.config.reader import Reader, kind, pytype
from thrust_remote.core.config.values import check_name
from thrust_remote.core.errors import ConfigError
from thrust_remote.core.names import parse_address, valid_host
from thrust_remote.core.scheduler import (
    LIMIT_WARNING_S,
    NAME_RE,
    OPTION_RE,
    SCHEDULERS,
    TIME_RE,
    SlurmConfig,
    option_clash,
)

# a Slurm login node's keys (core/scheduler.py)
SLURM_KEYS = ("scheduler", "partition", "account", "time", "limit_warning", "sbatch", "login_shell")
HOST_KEYS = (
    "address", "workdir", "python", "identity", "known_hosts", "host_key_policy", "gpus", "connect_timeout",
    "cpu_slots", "rdzv_address", "rdzv_port", "ifname", "keep", "torch_index", *SLURM_KEYS,
)
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}\Z")  # Linux: at most 15 bytes

# (reader, field, key, value node) -> the HostConfig fields the key sets
HostValue = Callable[[Reader, str, str, yaml.Node], dict[str, Any]]


def parse_hosts(reader: Reader, node: yaml.Node, hosts: dict[str, HostConfig]) -> None:
    """`hosts:` into `hosts` (the built-in `local` may be redefined)."""
    for name, name_node, host_node in reader.mapping(node, "hosts"):
        check_name(reader, name_node, f"hosts.{name}", name)
        hosts[name] = parse_host(reader, name, host_node, name_node)


def parse_host(reader: Reader, name: str, node: yaml.Node, name_node: yaml.Node) -> HostConfig:
    base = local_host() if name == LOCAL else HostConfig(name=name)
    values: dict[str, Any] = {}
    slurm_values: dict[str, Any] = {}
    slurm_nodes: dict[str, yaml.Node] = {}
    for key, key_node, value in reader.mapping(node, f"hosts.{name}"):
        f = f"hosts.{name}.{key}"
        if key in SLURM_KEYS:
            slurm_values[key] = _slurm_value(reader, f, key, value)
            slurm_nodes[key] = key_node
        elif key in HOST_VALUES:
            values.update(HOST_VALUES[key](reader, f, key, value))
        else:
            raise reader.unknown(key_node, f, HOST_KEYS)
    if slurm_values:
        values["slurm"] = _slurm_host(reader, name, slurm_values, slurm_nodes)
    if name != LOCAL and not values.get("address"):
        raise reader.fail(
            name_node, f"hosts.{name}.address", "missing; expected an ~/.ssh/config alias or user@host[:port]"
        )
    if name == LOCAL and values.get("address"):
        raise reader.fail(name_node, "hosts.local.address", "the host 'local' is this machine and takes no address")
    return replace(base, **values)


def _address(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    addr = reader.string(value, f)
    try:
        parse_address(addr or "")
    except ValueError as exc:
        raise reader.fail(value, f, f"{exc}; expected an ~/.ssh/config alias or user@host[:port]") from None
    return {"address": addr}


def _path(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    text = reader.string(value, f)
    if not text or text.startswith("-") or "\n" in text:
        raise reader.fail(value, f, "expected a non-empty path that does not start with '-'")
    return {key: text}


def _gpus(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    if isinstance(value, yaml.ScalarNode) and reader.scalar(value, f) is None:
        return {key: None}
    if not isinstance(value, yaml.SequenceNode):
        raise reader.fail(value, f, f"expected a list of GPU indices like [0, 1], got {kind(value)}")
    gpus = []
    for item in value.value:
        v = reader.scalar(item, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise reader.fail(item, f, f"expected a GPU index (integer >= 0), got {v!r}")
        gpus.append(v)
    return {key: tuple(gpus)}


def _rendezvous_name(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    text = reader.string(value, f) or ""
    ok = valid_host(text) if key == "rdzv_address" else bool(_IFNAME_RE.match(text))
    if not ok:
        what = "an IP address or host name the other nodes reach" if key == "rdzv_address" else \
            "a network interface name like eth0 (ip -o link lists them)"
        raise reader.fail(value, f, f"expected {what}, got {text!r}")
    return {key: text}


def _rdzv_port(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    port = reader.scalar(value, f)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise reader.fail(value, f, f"expected a TCP port (1-65535), got {port!r}")
    return {key: port}


def _cpu_slots(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    slots = reader.scalar(value, f)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise reader.fail(value, f, f"expected how many runs at once (an integer >= 1), got {slots!r}")
    return {key: slots}


def _keep(reader: Reader, f: str, key: str, node: yaml.Node) -> dict[str, Any]:
    """`keep: {runs: N}`: how many ended runs keep their trees on the host."""
    for k, k_node, v in reader.mapping(node, f):
        if k != "runs":
            raise reader.unknown(k_node, f"{f}.{k}", ("runs",))
        n = reader.scalar(v, f"{f}.runs")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise reader.fail(v, f"{f}.runs", f"expected how many ended runs keep their trees (an integer >= 0), "
                                               f"got {pytype(n)}")
        return {"keep_runs": n}
    raise reader.fail(node, f, "expected {runs: N}")


TORCH_INDEX = "https://download.pytorch.org/whl/{variant}"  # PyTorch's install instructions' index per variant


def torch_index(configured: str | None, torch: object) -> str | None:
    """The index of torchvision / torchaudio built for the host torch's variant (`2.13.0+cpu`: cpu):
    `hosts.H.torch_index` (a mirror) or PyTorch's, `{variant}` filled in; None for a torch without a
    label (PyPI's own build, whose companions PyPI serves)."""
    variant = str(torch or "").partition("+")[2]
    return (configured or TORCH_INDEX).replace("{variant}", variant) if variant else None


def _torch_index(reader: Reader, f: str, key: str, value: yaml.Node) -> dict[str, Any]:
    """A package index URL, `{variant}` standing for the host torch's label (`cpu`, `cu128`): what pip
    is given as `--index-url` for torchvision / torchaudio built for that torch (run/venv.py)."""
    url = reader.string(value, f, nullable=True)
    if url is not None and not url.startswith(("http://", "https://", "file://")):
        raise reader.fail(value, f, f"expected a package index URL (http://, https:// or file://), got {url!r}; "
                                    "e.g. https://download.pytorch.org/whl/{variant}")
    return {key: url}


HOST_VALUES: Mapping[str, HostValue] = {
    "address": _address,
    "workdir": _path,
    "python": _path,
    "known_hosts": _path,
    "identity": lambda reader, f, key, value: {key: reader.string(value, f, nullable=True)},
    "host_key_policy": lambda reader, f, key, value: {key: reader.choice(value, f, HOST_KEY_POLICIES)},
    "gpus": _gpus,
    "rdzv_address": _rendezvous_name,
    "ifname": _rendezvous_name,
    "rdzv_port": _rdzv_port,
    "cpu_slots": _cpu_slots,
    "keep": _keep,
    "torch_index": _torch_index,
    "connect_timeout": lambda reader, f, key, value: {key: reader.seconds(value, f, "seconds")},
}


def _slurm_value(reader: Reader, f: str, key: str, value: yaml.Node) -> Any:
    """One of a Slurm host's keys, checked (core/scheduler.py)."""
    if key == "scheduler":
        return reader.choice(value, f, SCHEDULERS)
    if key == "time":
        reader.scalar(value, f)
        # the text as written, as sbatch reads it: YAML 1.1 would make 24:00 the number 1440
        text = value.value if isinstance(value, yaml.ScalarNode) else ""
        if not TIME_RE.match(text):
            raise reader.fail(value, f, f"expected a Slurm time limit like \"24:00:00\" (HH:MM:SS) or "
                                        f"\"2-00:00:00\" (D-HH:MM:SS), got {text!r}")
        return text
    if key == "limit_warning":
        seconds = reader.scalar(value, f)
        if isinstance(seconds, bool) or not isinstance(seconds, int) or not 1 <= seconds <= 65535:
            raise reader.fail(value, f, f"expected seconds before the time limit the job is told (1-65535), "
                                        f"got {seconds!r}")
        return seconds
    if key == "login_shell":
        given = reader.scalar(value, f)
        if not isinstance(given, bool):
            raise reader.fail(value, f, f"expected true or false, got {given!r}")
        return given
    if key in ("partition", "account"):
        text = reader.string(value, f) or ""
        if not NAME_RE.match(text):
            raise reader.fail(value, f, f"expected a Slurm {key} name (letters, digits, _ . + -), got {text!r}")
        return text
    return _sbatch_options(reader, f, value)


def _sbatch_options(reader: Reader, f: str, value: yaml.Node) -> tuple[tuple[str, str | None], ...]:
    """`sbatch: {option: value}`: long options of sbatch's own, none that thrust-remote sets itself."""
    options: list[tuple[str, str | None]] = []
    for option, option_node, option_value in reader.mapping(value, f):
        where = f"{f}.{option}"
        clash = option_clash(option.lstrip("-"))
        if clash:  # one of ours, one that breaks one run = one job, or a beginning sbatch reads as either
            raise ConfigError(reader.fail(option_node, where, clash[0]).message, clash[1])
        if not OPTION_RE.match(option):
            raise reader.fail(option_node, where, "expected an sbatch long option's name without dashes, like qos "
                                                  "or constraint")
        given = reader.scalar(option_value, where)
        if given is True or given is None:
            options.append((option, None))
        elif isinstance(given, bool) or not isinstance(given, str | int | float) or "\n" in str(given) \
                or not str(given).strip():
            raise reader.fail(option_value, where, f"expected the option's value (or true for a flag), got {given!r}")
        else:
            options.append((option, str(given)))
    return tuple(options)


def _slurm_host(reader: Reader, name: str, values: Mapping[str, Any], nodes: Mapping[str, yaml.Node]) -> SlurmConfig:
    """partition:, account:, time:, sbatch: belong to a `scheduler: slurm` host only."""
    if "scheduler" not in values:
        key = next(iter(values))
        raise ConfigError(reader.fail(nodes[key], f"hosts.{name}.{key}", "only for a Slurm cluster's login "
                                                                          "node").message,
                          f"add `scheduler: slurm` to hosts.{name}, or remove {key}:")
    if name == LOCAL:
        raise reader.fail(nodes["scheduler"], "hosts.local.scheduler", "the host 'local' is this machine; a Slurm "
                                                                       "cluster is reached at its login node's address")
    return SlurmConfig(partition=values.get("partition"), account=values.get("account"), time=values.get("time"),
                       sbatch=values.get("sbatch", ()), limit_warning=values.get("limit_warning", LIMIT_WARNING_S),
                       login_shell=values.get("login_shell", False))
