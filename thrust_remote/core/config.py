"""thrust.yaml: load, validate, and merge with THRUST_* variables and flags.

Errors name the file, the line and the field (`thrust.yaml:7: hosts.gpu.port: expected ...`), exit 78.
YAML is composed into nodes (not just loaded) so every value keeps the line it came from.
Precedence: command-line flags > THRUST_* environment > thrust.yaml > built-in defaults.
No file at all is fine: the host `local` and the jobs `snake` and `cartpole` always exist.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.errors import ConfigError
from thrust_remote.core.names import bad_name_reason, parse_address, valid_host, valid_id
from thrust_remote.core.patterns import check_pattern
from thrust_remote.core.scheduler import (
    LIMIT_WARNING_S,
    NAME_RE,
    OPTION_RE,
    SCHEDULERS,
    TIME_RE,
    SlurmConfig,
    option_clash,
)

CONFIG_NAME = "thrust.yaml"
# optimize's best params: `<study>-best.yaml` in the project, its first line ending with the mark (so a
# sync knows the file is this tool's output, not code the run lacks)
BEST_PARAMS_SUFFIX = "-best.yaml"
BEST_PARAMS_MARK = "(thrust-remote optimize)"
LOCAL = "local"

HOST_KEY_POLICIES = ("strict", "accept-new")
# a host's `keep: {runs: N}` by default: the trees of the newest 10 ended runs stay (docs/architecture.md,
# "Trees"); a running or queued run's tree always stays
DEFAULT_KEEP_RUNS = 10
# trainer: the built-in trainer; python: your own script or module; command: any argv; cargo: tch-rs.
# `kind: python` without script:/module: is the built-in trainer (what it meant before kinds existed).
JOB_KINDS = ("trainer", "python", "cargo", "command")
# How a job of your own takes its flags (`flags: {style, names}`, docs/architecture.md "Job kinds"):
# `--set`, an `args:` mapping and optimize's parameters are written in its style; the first style is a
# python or cargo job's default, `key=value` a command job's. `names: dashes` writes learning_rate as
# learning-rate; `as-is` (the default) passes the name as it was written.
FLAG_STYLES = ("--key value", "--key=value", "key=value", "-k value")
FLAG_NAMES = ("as-is", "dashes")
COMMAND_STYLE = "key=value"

# Environment overrides (flags still win over these): the path of thrust.yaml, the default host
# (default_host), and tracebacks on errors (1/true).
ENV_CONFIG, ENV_HOST, ENV_DEBUG = "THRUST_CONFIG", "THRUST_HOST", "THRUST_DEBUG"


@dataclass(frozen=True)
class HostConfig:
    name: str
    address: str | None = None  # None for the local host
    workdir: str = "~/thrust"
    python: str = "python3"
    identity: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: str = "strict"
    gpus: tuple[int, ...] | None = None
    connect_timeout: float = 10.0
    cpu_slots: int = 1  # `train --queue` on a host without GPUs: how many runs at once, the others wait
    # several hosts, one run (docs/architecture.md, "Several hosts"): how the other nodes reach this
    # one when it is node 0 (default: the address its SSH connection resolves to), a fixed rendezvous
    # port (default: a free one, checked there), the interface NCCL/gloo use (default: from `ip route get`)
    rdzv_address: str | None = None
    rdzv_port: int | None = None
    ifname: str | None = None
    keep_runs: int = DEFAULT_KEEP_RUNS  # `keep: {runs: N}`: the trees of the newest N ended runs stay
    # `scheduler: slurm`: a cluster's login node; runs are submitted with sbatch (core/scheduler.py)
    slurm: SlurmConfig | None = None
    # not a thrust.yaml key: the config file the user named (--config / THRUST_CONFIG), absolute, so
    # that a hint's command reads the same file (hints.command_hint); None when it was found by search
    config_path: str | None = None

    @property
    def is_local(self) -> bool:
        return self.address is None


@dataclass(frozen=True)
class NotifyConfig:
    """`notify:` (top level, or a job's own, which replaces it): what runs on the laptop when a followed
    run ends (docs/architecture.md, "Notifications")."""

    command: tuple[str, ...] = ()  # argv, never a shell string; THRUST_RUN_* in its environment
    webhook: str | None = None  # an http(s) URL, or $NAME / ${NAME}: the URL is that variable's value here
    desktop: bool = False  # notify-send or osascript, where present

    @property
    def enabled(self) -> bool:
        return bool(self.command or self.webhook or self.desktop)


@dataclass(frozen=True)
class JobConfig:
    """One job of thrust.yaml (docs/architecture.md, "Config (thrust.yaml)": the job kinds)."""

    name: str
    kind: str = "trainer"
    # trainer: flags as a mapping (--key value); python: a list (passed as is) or a mapping;
    # cargo: a list of argv items; command: none (its argv is `command`)
    args: Mapping[str, Any] | tuple[str, ...] = field(default_factory=dict)
    export: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[str, ...] = ()  # pip specs for the job's venv (python jobs)
    requirements_file: str | None = None  # a requirements file in the repo
    script: str | None = None  # python: a path in the repo, run as `PYTHON SCRIPT ARGS...`
    module: str | None = None  # python: run as `PYTHON -m MODULE ARGS...`
    nproc: int | None = None  # processes under torchrun (None: one, or one per GPU with --gpus)
    command: tuple[str, ...] = ()  # command: the argv, run as is in the checkout
    artifacts: tuple[str, ...] = ()  # globs under the job's working directory on the host
    # {"tensorboard": DIR} and/or {"pattern": REGEX} (named groups read from the job's own log lines);
    # default: THRUST_METRICS lines
    metrics: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)  # {"style": FLAG_STYLES[i], "names": FLAG_NAMES[j]}
    objective: Mapping[str, str] = field(default_factory=dict)  # {"metric": NAME, "mode": "max"|"min"}
    notify: NotifyConfig | None = None  # the job's own `notify:`; None: the top level's
    # {"below": PERCENT, "minutes": M, "every": S}: stopped when its GPUs idle that long (agent/idlewatch.py)
    idle_stop: Mapping[str, float] | None = None
    # runs that outlive their host (docs/architecture.md, "Checkpoints and resume"): the glob of the job's
    # checkpoints (relative to the checkout, or $THRUST_RUN_DIR/...), the arguments that continue from one
    # ("{checkpoint}" is its path on the host), seconds between pulls while a run is followed (None: the
    # default, 0: off), and the retry policy {"max": N, "on": (...), "hosts": (...)}
    checkpoints: str | None = None
    resume: tuple[str, ...] = ()
    sync_every: float | None = None
    retry: Mapping[str, Any] | None = None
    # data that is not in git (docs/architecture.md, "Trees"): laptop paths placed into each run's tree,
    # a command run in the tree before the job (once per host for the same inputs), paths of the tree
    # kept across runs on a host. None: the top level's (`Config.files`...), () none.
    files: tuple[str, ...] | None = None
    setup: tuple[str, ...] | None = None
    shared: tuple[str, ...] | None = None
    # thrust.yaml's line of each key the job wrote, and of the job's name under "job": a check after
    # the sync (a script missing from the synced commit) names file:line as the loader does
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # cargo jobs
    toolchain: str = "stable"
    example: str | None = None
    crate: str = "."
    artifact: str | None = None
    tch_version: str = "auto"
    bypass_version_check: bool = False


@dataclass(frozen=True)
class Config:
    path: Path | None
    default_host: str = LOCAL
    hosts: Mapping[str, HostConfig] = field(default_factory=dict)
    jobs: Mapping[str, JobConfig] = field(default_factory=dict)
    search: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> host names, in node order
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    # `files:`, `setup:`, `shared:` at the top level: every job's that gives none of its own
    files: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    data_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # each searched parameter's line, "JOB.PARAM" -> line: optimize names the key a trial's usage error came from
    search_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # the user named this file (--config / THRUST_CONFIG) rather than it being found upwards
    given: bool = False
    default_from_env: bool = False  # default_host is THRUST_HOST's: an unknown one says where it came from

    @property
    def given_path(self) -> str | None:
        """The config file as hints repeat it (`--config PATH`, absolute): only when the user named it."""
        return str(self.path.resolve()) if self.given and self.path else None

    @cached_property
    def root(self) -> Path:
        """The project: the git work tree the thrust.yaml belongs to; a config kept outside any work
        tree (`--config /elsewhere/thrust.yaml`) only configures the work tree the command runs in."""
        return project_root(Path.cwd(), self.path, given=self.given)

    def host(self, name: str | None = None) -> HostConfig:
        from thrust_remote.core.errors import UnknownHostError

        from_env = not name and self.default_from_env
        name = name or self.default_host
        if name not in self.hosts and name in self.groups:
            from thrust_remote.core.errors import UsageError

            raise UsageError(f"{name!r} is a group of hosts ({', '.join(self.groups[name])}); this command "
                             "takes one host", "name one of them with --host")
        if name not in self.hosts:
            known = ", ".join(sorted(self.hosts))
            where = f" in {self.path}" if self.path else " (no thrust.yaml found)"
            near = self._near_host(name)
            said = f" (from {ENV_HOST} in your environment)" if from_env else ""
            raise UnknownHostError(
                f"unknown host {name!r}{said}{near}{where}; known hosts: {known}",
                (f"unset {ENV_HOST} or set it to a known host; or " if from_env else "")
                + ("give that host's name" if " is the address of host " in near else
                   f"add it under `hosts:` in {self.path or CONFIG_NAME} (address: user@host[:port] or an "
                   "~/.ssh/config alias)"),
            )
        return self.hosts[name]

    def _near_host(self, name: str | None) -> str:
        """A configured host whose address is what was typed (its SSH alias, or user@alias), else a near name."""
        for host in self.hosts.values():
            address = host.address or ""
            if name and name in (address, address.rpartition("@")[2].split(":")[0]):
                return f" ({name!r} is the address of host {host.name!r}: --host {host.name})"
        return _did_you_mean(name, [*self.hosts, *self.groups])

    def host_list(self, names: Sequence[str] | None) -> list[HostConfig]:
        """`--host a --host b` (a group name stands for its hosts, in order): the hosts, node 0 first.
        None or empty: the default host alone. A host named twice is a usage error."""
        from thrust_remote.core.errors import UsageError

        out: list[HostConfig] = []
        for name in names or [self.default_host]:
            members = self.groups.get(name, (name,)) if name not in self.hosts else (name,)
            for member in members:
                host = self.host(member)
                if host in out:
                    raise UsageError(f"host {member!r} is named twice (--host / groups: in {CONFIG_NAME})",
                                     "name each host once: every host is one node of the run")
                out.append(host)
        return out

    def notify_for(self, job: str | None) -> NotifyConfig:
        """A job's own `notify:` when it has one, else the top level's."""
        own = self.jobs[job].notify if job in self.jobs else None
        return own if own is not None else self.notify

    def job(self, name: str) -> JobConfig:
        if name not in self.jobs:
            from thrust_remote.core.errors import UsageError

            raise UsageError(
                f"unknown job {name!r}{_did_you_mean(name, self.jobs)}; known jobs: {', '.join(sorted(self.jobs))}",
                f"add it under `jobs:` in {self.path or CONFIG_NAME}",
            )
        return self.jobs[name]


def _did_you_mean(name: str | None, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name or "", list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def builtin_jobs() -> dict[str, JobConfig]:
    """snake and cartpole work with no thrust.yaml at all."""
    return {
        "snake": JobConfig(name="snake", args={"env": "snake"}, export="web/public/snake.onnx"),
        "cartpole": JobConfig(name="cartpole", args={"env": "cartpole"}, export="web/public/cartpole.onnx"),
    }


def local_host(workdir: str | None = None) -> HostConfig:
    # The local host runs in the project itself (the code is already exactly what the user has), with
    # the interpreter thrust-remote runs in: the one its installer gave torch.
    return HostConfig(name=LOCAL, address=None, workdir=workdir or ".", python=sys.executable or "python3")


# ----------------------------------------------------------------------------------------------
# loading


def project_root(cwd: Path, config: Path | None = None, *, given: bool = False) -> Path:
    """The work tree holding the config, else the one holding cwd; outside git, the directory of a
    config found upwards, else cwd (a config named with --config only configures where you stand).

    The config's own tree wins so that a library caller (or `--config` from outside any repo) gets the
    project that file describes, whatever directory the process happens to stand in."""
    for where in ([config.resolve().parent] if config else []) + [cwd]:
        top = _work_tree(where)
        if top:
            return top
    return config.resolve().parent if config and not given else cwd


def _work_tree(where: Path) -> Path | None:
    """`git rev-parse --show-toplevel` of a directory, or None outside a work tree."""
    try:
        proc = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = proc.stdout.strip()
    return Path(top) if proc.returncode == 0 and top else None


def find_config(start: Path | None = None) -> Path | None:
    """thrust.yaml in the current directory or the nearest parent (like git finds .git)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


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
    config = parse_config_text(read_text(cfg_path), cfg_path) if cfg_path else _defaults(None)
    if explicit and cfg_path:
        given = str(cfg_path.resolve())
        hosts = {name: replace(h, config_path=given) for name, h in config.hosts.items()}
        config = replace(config, hosts=hosts, given=True)
    host = default_host or env.get(ENV_HOST) or None
    if host:
        reason = bad_name_reason(host, "host name")
        if reason:
            raise ConfigError(reason)
        config = replace(config, default_host=host, default_from_env=not default_host)
    return config


def read_text(path: Path) -> str:
    """A YAML file's text; not UTF-8 (a binary file, another encoding) is a config error at the line of
    the first bad byte, which is not shown: a file given by mistake (`--config .env`) may hold secrets."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (a YAML file is; is this the file you meant?)") from None


def _defaults(path: Path | None) -> Config:
    return Config(path=path, hosts={LOCAL: local_host()}, jobs=builtin_jobs())


class _Reader:
    """Validates a composed YAML node tree, raising ConfigError with file:line: field."""

    def __init__(self, path: Path | None) -> None:
        self.label = str(path) if path else "<config>"

    def fail(self, node: yaml.Node, field_name: str, message: str) -> ConfigError:
        line = node.start_mark.line + 1
        return ConfigError(f"{self.label}:{line}: {field_name}: {message}" if field_name else
                           f"{self.label}:{line}: {message}")

    def mapping(self, node: yaml.Node, field_name: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null":
            return []  # a section with nothing (or only comments) under it
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, field_name, f"expected a mapping, got {_kind(node)}")
        out = []
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.fail(key_node, field_name, "keys must be plain strings")
            key = key_node.value
            problem = text_problem(key)
            if problem:
                raise self.fail(key_node, field_name, f"a key that {problem}")
            if key in seen:
                raise self.fail(key_node, f"{field_name}.{key}" if field_name else key, "duplicate key")
            seen.add(key)
            out.append((key, key_node, value_node))
        return out

    def scalar(self, node: yaml.Node, field_name: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            raise self.fail(node, field_name, f"expected a single value, got {_kind(node)}")
        value = _construct(node)
        problem = text_problem(value) if isinstance(value, str) else None
        if problem:  # it would reach a command line, an environment or a file on the host, which cannot carry it
            raise self.fail(node, field_name, f"a value that {problem}")
        return value

    def string(self, node: yaml.Node, field_name: str, *, nullable: bool = False) -> str | None:
        value = self.scalar(node, field_name)
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise self.fail(node, field_name, f"expected a string, got {_pytype(value)}")
        return value

    def number(self, node: yaml.Node, field_name: str) -> float:
        value = self.scalar(node, field_name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(node, field_name, f"expected a number, got {_pytype(value)}")
        if not _finite(value):
            raise self.fail(node, field_name, f"expected a finite number, got {_pytype(value)}")
        return float(value)

    def seconds(self, node: yaml.Node, field_name: str, what: str, *, zero: bool = False) -> float:
        """A number of seconds: > 0 (`zero`: >= 0, 0 meaning off) and at most SECONDS_MAX (a timer's)."""
        value = self.scalar(node, field_name)
        number = isinstance(value, int | float) and not isinstance(value, bool) and _finite(value)
        if not number or value < 0 or (value == 0 and not zero) or value > SECONDS_MAX:
            span = f"from 0 to {SECONDS_MAX:,}; 0: off" if zero else f"above 0, up to {SECONDS_MAX:,}"
            raise self.fail(node, field_name, f"expected {what} (a number {span}), got {_pytype(value)}")
        return float(value)

    def boolean(self, node: yaml.Node, field_name: str) -> bool:
        value = self.scalar(node, field_name)
        if not isinstance(value, bool):
            raise self.fail(node, field_name, f"expected true or false, got {_pytype(value)}")
        return value

    def choice(self, node: yaml.Node, field_name: str, choices: tuple[str, ...]) -> str:
        value = self.string(node, field_name)
        if value not in choices:
            raise self.fail(node, field_name, f"expected one of {', '.join(choices)}, got {value!r}")
        return value  # type: ignore[return-value]

    def unknown(self, key_node: yaml.Node, field_name: str, allowed: tuple[str, ...]) -> ConfigError:
        return self.fail(key_node, field_name, f"unknown key (expected one of: {', '.join(allowed)})")

    def plain(self, node: yaml.Node, field_name: str) -> Any:
        """Any YAML value as Python data (for free-form args / search specs), its strings checked as scalar's."""
        for item in _scalars(node):
            self.scalar(item, field_name)
        return _construct(node)


SECONDS_MAX = 1_000_000  # ~11.6 days: a timer of Python's waits at most ~292 years, a socket's less
MAX_DEPTH = 64  # nesting: no thrust.yaml needs more (PyYAML's composer recurses, and overflows near 300)
MAX_VALUES = 100_000  # values once aliases are expanded: a few lines whose aliases multiply are refused


def text_problem(text: str) -> str | None:
    """What keeps `text` off a command line, an environment or a file (None: nothing): a NUL byte ends a
    C string there, and a lone surrogate (a YAML "\\ud800", undecodable bytes on a command line) is not
    text any encoding writes."""
    if "\0" in text:
        return "contains a NUL byte"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (not valid Unicode)"
    return None


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (10**400)
        return False


def _scalars(node: yaml.Node) -> Iterator[yaml.ScalarNode]:
    """Every scalar node under `node` (keys too); compose_yaml has bounded the tree."""
    if isinstance(node, yaml.ScalarNode):
        yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _scalars(key)
            yield from _scalars(value)


def compose_yaml(text: str, label: str) -> yaml.Node | None:
    """`text` as a YAML node tree whose values keep their lines, or a ConfigError at `label:LINE`: not
    YAML, a character YAML does not allow (a NUL), nested deeper than MAX_DEPTH, aliases that expand to
    more than MAX_VALUES values (a "billion laughs") or that hold themselves. thrust.yaml and `--params`
    files are both read through it."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, label) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: NUL, most C0 controls
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(f"{label}:{line}: not valid YAML: a character YAML does not allow "
                          f"(#x{exc.character:04x} at column {exc.position - text.rfind(chr(10), 0, exc.position)})"
                          ) from None
    except RecursionError:
        raise ConfigError(f"{label}:{_too_deep_line(text)}: nested more than {MAX_DEPTH} levels deep") from None
    if root is not None:
        _check_size(root, label)
    return root


def _yaml_error(exc: yaml.MarkedYAMLError, label: str) -> ConfigError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark else 0
    opened = exc.context_mark.line + 1 if exc.context_mark else line
    if exc.context and opened != line:
        # an unclosed `[`, `{` or quote is found lines later, where the parser gave up: the line to
        # fix is where it opened
        return ConfigError(f"{label}:{opened}: not valid YAML: {exc.context} that starts here; at line "
                           f"{line}: {exc.problem}")
    return ConfigError(f"{label}:{line}: not valid YAML: {exc.problem or exc}")


def _too_deep_line(text: str) -> int:
    """The line where nesting first goes past MAX_DEPTH (the parser's events: no recursion)."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                return event.start_mark.line + 1
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return 1


def _check_size(root: yaml.Node, label: str) -> None:
    """Refuse a tree deeper than MAX_DEPTH, or one that holds more than MAX_VALUES values once its
    aliases are expanded (each node counted once per place it appears, computed once per node)."""
    sizes: dict[int, int] = {}
    fail = _Reader(Path(label)).fail

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            if sizes[id(node)] < 0:
                raise fail(node, "", "an alias that refers to the value holding it (a loop)")
            return sizes[id(node)]
        if depth > MAX_DEPTH:
            raise fail(node, "", f"nested more than {MAX_DEPTH} levels deep")
        sizes[id(node)] = -1
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        total = 1 + sum(size(child, depth + 1) for child in children)
        if total > MAX_VALUES:
            raise fail(node, "", f"aliases here expand to more than {MAX_VALUES:,} values")
        sizes[id(node)] = total
        return total

    size(root, 0)


def _construct(node: yaml.Node) -> Any:
    """A composed node as safe_load would give it. Its tags are resolved already (an empty value is
    null); serializing it alone to load it again fails on an empty value (a document PyYAML cannot read)."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


# a Slurm login node's keys (core/scheduler.py)
_SLURM_KEYS = ("scheduler", "partition", "account", "time", "limit_warning", "sbatch")
_DATA_KEYS = ("files", "setup", "shared")  # a job's, or the top level's for every job
_TOP_KEYS = ("default_host", "hosts", "groups", "jobs", "search", "notify", *_DATA_KEYS)
_HOST_KEYS = (
    "address", "workdir", "python", "identity", "known_hosts", "host_key_policy", "gpus", "connect_timeout",
    "cpu_slots", "rdzv_address", "rdzv_port", "ifname", "keep", *_SLURM_KEYS,
)
_JOB_KEYS = (
    "kind", "script", "module", "command", "args", "requirements", "nproc", "artifacts", "metrics", "objective",
    "export", "env", "toolchain", "example", "crate", "artifact", "tch_version", "bypass_version_check", "notify",
    "idle_stop", "checkpoints", "resume", "sync_every", "retry", "flags", *_DATA_KEYS,
)
# Keys only some kinds take: another kind's job names them as an error (the cargo keys stay lenient).
_KIND_ONLY = {
    "script": ("python",),
    "module": ("python",),
    "command": ("command",),
    "args": ("trainer", "python", "cargo"),
    "requirements": ("trainer", "python"),
    "nproc": ("trainer", "python"),
    "flags": ("python", "command", "cargo"),  # the built-in trainer's flags are its own (trainer/args.py)
}
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:@-]{0,14}\Z")  # Linux: at most 15 bytes
_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")


def parse_config_text(text: str, path: Path | None = None) -> Config:
    reader = _Reader(path)
    root = compose_yaml(text, reader.label)
    config = _defaults(path)
    if root is None:
        return config
    if not isinstance(root, yaml.MappingNode):  # a file given by mistake (`--config .env`): never its text
        raise reader.fail(root, "", f"expected a mapping of settings ({', '.join(_TOP_KEYS)}), got "
                                    f"{_shape(root)}; is this the file you meant?")
    hosts = dict(config.hosts)
    jobs = dict(config.jobs)
    search: dict[str, dict[str, dict[str, Any]]] = {}
    search_lines: dict[str, int] = {}
    default_host = LOCAL
    default_host_node: yaml.Node | None = None
    groups: dict[str, tuple[str, ...]] = {}
    group_nodes: dict[str, yaml.Node] = {}
    notify = NotifyConfig()
    data: dict[str, tuple[str, ...]] = {}
    data_lines: dict[str, int] = {}
    for key, key_node, value in reader.mapping(root, ""):
        if key == "default_host":
            default_host = reader.string(value, key) or LOCAL
            default_host_node = value
        elif key == "hosts":
            for name, name_node, host_node in reader.mapping(value, "hosts"):
                _check_name(reader, name_node, f"hosts.{name}", name)
                hosts[name] = _parse_host(reader, name, host_node, name_node)
        elif key == "groups":
            for name, name_node, members in reader.mapping(value, "groups"):
                _check_name(reader, name_node, f"groups.{name}", name)
                groups[name] = tuple(_words(reader, f"groups.{name}", members, "a list of host names"))
                group_nodes[name] = members
        elif key == "jobs":
            for name, name_node, job_node in reader.mapping(value, "jobs"):
                _check_name(reader, name_node, f"jobs.{name}", name)
                jobs[name] = _parse_job(reader, name, job_node, jobs.get(name), name_node)
        elif key == "notify":
            notify = _parse_notify(reader, "notify", value)
        elif key in _DATA_KEYS:
            data[key] = _data_value(reader, key, key, value)
            data_lines[key] = _line(key_node)
        elif key == "search":
            for name, name_node, spec_node in reader.mapping(value, "search"):
                _check_name(reader, name_node, f"search.{name}", name)
                search[name] = _parse_search(reader, name, spec_node)
                search_lines.update({f"{name}.{param}": _line(p_node)
                                     for param, p_node, _spec in reader.mapping(spec_node, f"search.{name}")})
        else:
            raise reader.unknown(key_node, key, _TOP_KEYS)
    if default_host not in hosts:
        assert default_host_node is not None
        raise reader.fail(
            default_host_node, "default_host", f"{default_host!r} is not a host defined under hosts:"
        )
    _check_groups(reader, groups, group_nodes, hosts)
    _check_retry_hosts(reader, jobs, hosts, groups)
    return Config(path=path, default_host=default_host, hosts=hosts, jobs=jobs, search=search, groups=groups,
                  notify=notify, search_lines=search_lines, data_lines=data_lines, **data)


def parse_params(path: Path) -> dict[str, Any]:
    """A `--params` file: a mapping of parameter -> a single value, or optimize's best-params file (that
    mapping under `params:`). Read as thrust.yaml is (`compose_yaml`: file:line errors, nesting and alias
    bounds), and each value a single one as in a job's `args:` mapping: a list would become its text."""
    reader = _Reader(path)
    root = compose_yaml(read_text(path), reader.label)
    if not isinstance(root, yaml.MappingNode):
        where = f"{reader.label}:{_line(root)}" if root is not None else reader.label
        raise ConfigError(f"{where}: expected a mapping of parameter: value, got "
                          f"{'nothing' if root is None else _shape(root)}")
    entries, prefix = reader.mapping(root, ""), ""
    nested = next((v for k, _kn, v in entries if k == "params" and isinstance(v, yaml.MappingNode)), None)
    if nested is not None:
        entries, prefix = reader.mapping(nested, "params"), "params."
    out: dict[str, Any] = {}
    for key, key_node, value in entries:
        if not valid_id(key) or key.startswith("-"):
            raise reader.fail(key_node, f"{prefix}{key}", name_problem(key, "parameter"))
        out[key] = reader.scalar(value, f"{prefix}{key}")
    return out


def _check_groups(reader: _Reader, groups: Mapping[str, tuple[str, ...]], nodes: Mapping[str, yaml.Node],
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


def _check_retry_hosts(reader: _Reader, jobs: Mapping[str, JobConfig], hosts: Mapping[str, HostConfig],
                       groups: Mapping[str, tuple[str, ...]]) -> None:
    """A job's `retry: {hosts: [...]}` names hosts (or groups) this config defines."""
    for job in jobs.values():
        for name in (job.retry or {}).get("hosts", ()):
            if name not in hosts and name not in groups:
                line = job.retry.get("hosts_line") if job.retry else None
                raise ConfigError(f"{reader.label}:{line}: jobs.{job.name}.retry.hosts: {name!r} is not a host "
                                  "defined under hosts: (or a group)")


def _check_name(reader: _Reader, node: yaml.Node, field_name: str, name: str) -> None:
    if not valid_id(name):
        reason = bad_name_reason(name, "name") or f"name {name!r} is not allowed"
        raise reader.fail(node, field_name, f"{reason}; use letters, digits, '_', '-', '.'")


def _parse_host(reader: _Reader, name: str, node: yaml.Node, name_node: yaml.Node) -> HostConfig:
    base = local_host() if name == LOCAL else HostConfig(name=name)
    values: dict[str, Any] = {}
    slurm_values: dict[str, Any] = {}
    slurm_nodes: dict[str, yaml.Node] = {}
    for key, key_node, value in reader.mapping(node, f"hosts.{name}"):
        f = f"hosts.{name}.{key}"
        if key == "address":
            addr = reader.string(value, f)
            try:
                parse_address(addr or "")
            except ValueError as exc:
                raise reader.fail(value, f, f"{exc}; expected an ~/.ssh/config alias or user@host[:port]") from None
            values["address"] = addr
        elif key in ("workdir", "python", "known_hosts"):
            text = reader.string(value, f)
            if not text or text.startswith("-") or "\n" in text:
                raise reader.fail(value, f, "expected a non-empty path that does not start with '-'")
            values[key] = text
        elif key == "identity":
            values[key] = reader.string(value, f, nullable=True)
        elif key == "host_key_policy":
            values[key] = reader.choice(value, f, HOST_KEY_POLICIES)
        elif key == "gpus":
            if isinstance(value, yaml.ScalarNode) and reader.scalar(value, f) is None:
                values[key] = None
                continue
            if not isinstance(value, yaml.SequenceNode):
                raise reader.fail(value, f, f"expected a list of GPU indices like [0, 1], got {_kind(value)}")
            gpus = []
            for item in value.value:
                v = reader.scalar(item, f)
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise reader.fail(item, f, f"expected a GPU index (integer >= 0), got {v!r}")
                gpus.append(v)
            values[key] = tuple(gpus)
        elif key in ("rdzv_address", "ifname"):
            text = reader.string(value, f) or ""
            ok = valid_host(text) if key == "rdzv_address" else bool(_IFNAME_RE.match(text))
            if not ok:
                what = "an IP address or host name the other nodes reach" if key == "rdzv_address" else \
                    "a network interface name like eth0 (ip -o link lists them)"
                raise reader.fail(value, f, f"expected {what}, got {text!r}")
            values[key] = text
        elif key == "rdzv_port":
            port = reader.scalar(value, f)
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise reader.fail(value, f, f"expected a TCP port (1-65535), got {port!r}")
            values[key] = port
        elif key == "cpu_slots":
            slots = reader.scalar(value, f)
            if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
                raise reader.fail(value, f, f"expected how many runs at once (an integer >= 1), got {slots!r}")
            values[key] = slots
        elif key == "keep":
            values["keep_runs"] = _parse_keep(reader, f, value)
        elif key == "connect_timeout":
            values[key] = reader.seconds(value, f, "seconds")
        elif key in _SLURM_KEYS:
            slurm_values[key] = _slurm_value(reader, f, key, value)
            slurm_nodes[key] = key_node
        else:
            raise reader.unknown(key_node, f, _HOST_KEYS)
    if slurm_values:
        values["slurm"] = _slurm_host(reader, name, slurm_values, slurm_nodes)
    if name != LOCAL and not values.get("address"):
        raise reader.fail(
            name_node, f"hosts.{name}.address", "missing; expected an ~/.ssh/config alias or user@host[:port]"
        )
    if name == LOCAL and values.get("address"):
        raise reader.fail(name_node, "hosts.local.address", "the host 'local' is this machine and takes no address")
    return replace(base, **values)


def _slurm_value(reader: _Reader, f: str, key: str, value: yaml.Node) -> Any:
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
    if key in ("partition", "account"):
        text = reader.string(value, f) or ""
        if not NAME_RE.match(text):
            raise reader.fail(value, f, f"expected a Slurm {key} name (letters, digits, _ . + -), got {text!r}")
        return text
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


def _slurm_host(reader: _Reader, name: str, values: Mapping[str, Any], nodes: Mapping[str, yaml.Node]) -> SlurmConfig:
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
                       sbatch=values.get("sbatch", ()), limit_warning=values.get("limit_warning", LIMIT_WARNING_S))


def _parse_job(
    reader: _Reader, name: str, node: yaml.Node, base: JobConfig | None, name_node: yaml.Node
) -> JobConfig:
    keys = {key: (key_node, value) for key, key_node, value in reader.mapping(node, f"jobs.{name}")}
    for key, (key_node, _value) in keys.items():
        if key not in _JOB_KEYS:
            raise reader.unknown(key_node, f"jobs.{name}.{key}", _JOB_KEYS)
    kind = _job_kind(reader, name, keys, base)
    values: dict[str, Any] = {"kind": kind} if "kind" in keys else {}
    for key, (key_node, value) in keys.items():
        f = f"jobs.{name}.{key}"
        allowed = _KIND_ONLY.get(key, JOB_KINDS)
        if kind not in allowed:
            raise reader.fail(key_node, f, f"not for a {kind} job (only {', '.join(allowed)} jobs take it)")
        if key == "module" and "script" in keys:
            raise reader.fail(key_node, f, "give script: or module:, not both")
        if key != "kind":
            values.update(_job_value(reader, kind, key, f, value))
    if kind == "cargo" and not (values.get("example") or (base and base.example)):
        raise reader.fail(name_node, f"jobs.{name}.example", "a cargo job needs `example:` (the --example to build)")
    if kind == "command" and "command" not in keys:
        raise reader.fail(name_node, f"jobs.{name}.command",
                          "a command job needs `command:`, a list like [bash, devops/train.sh]")
    _check_resumable(reader, name, kind, keys, values, base)
    values["lines"] = {"job": _line(name_node), **{key: _line(kn) for key, (kn, _v) in keys.items()}}
    start = base if base is not None and base.kind == kind else JobConfig(name=name, kind=kind)
    return replace(start, **values)


def _check_resumable(reader: _Reader, name: str, kind: str, keys: Mapping[str, tuple[yaml.Node, yaml.Node]],
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


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _job_kind(reader: _Reader, name: str, keys: Mapping[str, tuple[yaml.Node, yaml.Node]],
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


def _job_value(reader: _Reader, kind: str, key: str, f: str, value: yaml.Node) -> dict[str, Any]:
    """One key of a job as JobConfig field(s)."""
    if key in ("export", "example", "artifact", "toolchain", "tch_version", "crate"):
        text = reader.string(value, f, nullable=key in ("export", "example", "artifact"))
        if text is not None and (not text or text.startswith("-")):
            raise reader.fail(value, f, "expected a non-empty value that does not start with '-'")
        return {key: text}
    if key == "bypass_version_check":
        return {key: reader.boolean(value, f)}
    if key == "env":
        return {key: _job_env(reader, f, value)}
    if key == "args":
        return {key: _job_args(reader, kind, f, value)}
    if key == "script":
        return {key: _repo_path(reader, f, value)}
    if key == "module":
        module = reader.string(value, f) or ""
        if not _MODULE_RE.match(module):
            raise reader.fail(value, f, f"expected a dotted module name like train.ppo, got {module!r}")
        return {key: module}
    if key == "command":
        return {key: _job_command(reader, f, value)}
    if key == "requirements":
        if isinstance(value, yaml.ScalarNode):
            return {"requirements_file": _repo_path(reader, f, value)}
        expected = "a requirements file or a list of pip specs like [gymnasium>=1.0]"
        return {key: tuple(_words(reader, f, value, expected, pip=True))}
    if key == "nproc":
        n = reader.scalar(value, f)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise reader.fail(value, f, f"expected a number of processes (an integer >= 1), got {_pytype(n)}")
        return {key: n}
    if key == "artifacts":
        return {key: tuple(_repo_path(reader, f, item) for item in _items(reader, f, value, "a list of globs"))}
    if key == "metrics":
        return {key: _job_metrics(reader, f, value)}
    if key == "flags":
        return {key: _job_flags(reader, f, value)}
    if key == "notify":
        return {key: _parse_notify(reader, f, value)}
    if key == "idle_stop":
        return {key: _parse_idle_stop(reader, f, value)}
    if key == "checkpoints":
        return {key: _repo_path(reader, f, value)}
    if key == "resume":
        return {key: _job_resume(reader, f, value)}
    if key == "sync_every":
        return {key: _sync_every(reader, f, value)}
    if key == "retry":
        return {key: _parse_retry(reader, f, value)}
    if key in _DATA_KEYS:
        return {key: _data_value(reader, key, f, value)}
    return {key: _job_objective(reader, f, value)}


def _data_value(reader: _Reader, key: str, f: str, node: yaml.Node) -> tuple[str, ...]:
    """`files:` and `shared:`: paths inside the project (a directory with or without its `/`);
    `setup:`: an argv like `command:` (run in the run's tree)."""
    if key == "setup":
        return _job_command(reader, f, node)
    what = "a list of paths in the project, like [data/input.txt, datasets/small/]" if key == "files" else \
        "a list of paths in the run's tree kept across runs, like [data/, .cache/]"
    paths = tuple(_repo_path(reader, f, item) for item in _items(reader, f, node, what))
    for item, path in zip(_items(reader, f, node, what), paths, strict=True):
        if any(c in path for c in "*?[") or path.strip("/") in ("", ".", ".git", ".thrust") \
                or path.startswith((".git/", ".thrust/")):
            raise reader.fail(item, f, f"expected a path (no glob, not .git or .thrust), got {path!r}")
    return paths


def _parse_keep(reader: _Reader, f: str, node: yaml.Node) -> int:
    for k, k_node, v in reader.mapping(node, f):
        if k != "runs":
            raise reader.unknown(k_node, f"{f}.{k}", ("runs",))
        n = reader.scalar(v, f"{f}.runs")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise reader.fail(v, f"{f}.runs", f"expected how many ended runs keep their trees (an integer >= 0), "
                                               f"got {_pytype(n)}")
        return n
    raise reader.fail(node, f, "expected {runs: N}")


def _job_env(reader: _Reader, f: str, node: yaml.Node) -> dict[str, str]:
    from thrust_remote.core.names import valid_env_key

    env = {}
    for k, k_node, v in reader.mapping(node, f):
        if not valid_env_key(k):
            raise reader.fail(k_node, f"{f}.{k}", "not a valid environment variable name")
        scalar = reader.scalar(v, f"{f}.{k}")
        if isinstance(scalar, dict | list):
            raise reader.fail(v, f"{f}.{k}", "expected a string")
        env[k] = "" if scalar is None else str(scalar)
    return env


def _job_args(reader: _Reader, kind: str, f: str, node: yaml.Node) -> Mapping[str, Any] | tuple[str, ...]:
    """cargo: a list; python: a list (passed as is) or a mapping (--key value); trainer: a mapping."""
    if isinstance(node, yaml.SequenceNode) and kind == "cargo":
        return tuple(str(reader.scalar(item, f)) for item in node.value)
    if isinstance(node, yaml.SequenceNode) and kind == "python":
        return tuple(_words(reader, f, node, "a list of arguments"))
    if kind == "cargo":
        raise reader.fail(node, f, f"a cargo job takes a list of arguments, got {_kind(node)}")
    if kind == "trainer" and isinstance(node, yaml.SequenceNode):
        raise reader.fail(node, f, "the built-in trainer takes a mapping of flags like {total-steps: 1000}; "
                                   "a list of arguments is for your own code: add script: or module:")
    if kind == "python" and not isinstance(node, yaml.MappingNode):
        raise reader.fail(node, f, f"expected a list of arguments like [--lr, '0.1'] or a mapping of flags like "
                                   f"{{lr: 0.1}}, got {_kind(node)}")
    args = {}
    for k, k_node, v in reader.mapping(node, f):
        if not valid_id(k) or k.startswith("-"):
            raise reader.fail(k_node, f"{f}.{k}", name_problem(k, "flag"))
        args[k] = reader.scalar(v, f"{f}.{k}")
    return args


def _job_command(reader: _Reader, f: str, node: yaml.Node) -> tuple[str, ...]:
    """A list only: a string would need a shell's rules (quotes, $VAR, &&, globs) that no split
    applies faithfully; the list is the argv that runs, as is (docs/architecture.md, "Config")."""
    if isinstance(node, yaml.ScalarNode) and isinstance(reader.scalar(node, f), str):
        import shlex

        try:
            example = yaml.safe_dump(shlex.split(node.value), default_flow_style=True, width=10**6).strip()
        except ValueError:
            example = "[bash, train.sh]"
        raise reader.fail(node, f, f"expected a list (the argv, run as is, no shell), got a string; write it "
                                   f"as {example}, or [bash, -c, '...'] for shell syntax")
    words = _words(reader, f, node, "a list like [bash, devops/train.sh]")
    if not words:
        raise reader.fail(node, f, "expected a non-empty list like [bash, devops/train.sh]")
    if words[0].startswith("-"):
        raise reader.fail(node, f, "the program (the first item) may not start with '-'")
    return tuple(words)


def _items(reader: _Reader, f: str, node: yaml.Node, expected: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise reader.fail(node, f, f"expected {expected}, got {_kind(node)}")
    return list(node.value)


def _words(reader: _Reader, f: str, node: yaml.Node, expected: str, *, pip: bool = False) -> list[str]:
    """A list of single values (strings or numbers) as strings; `pip`: each a requirement, no option."""
    out = []
    for item in _items(reader, f, node, expected):
        value = reader.scalar(item, f)
        if value is None or isinstance(value, bool):
            raise reader.fail(item, f, f"expected a string (quote it), got {_pytype(value)}")
        text = str(value)
        if pip and (not text.strip() or text.startswith("-") or "\n" in text):
            raise reader.fail(item, f, f"expected a pip requirement like numpy>=1.26, got {text!r}")
        out.append(text)
    return out


_IDLE_KEYS = {"below": (0.0, 100.0), "minutes": (0.0, None), "every": (0.0, None)}


def _parse_idle_stop(reader: _Reader, f: str, node: yaml.Node) -> dict[str, float]:
    """`{below: PERCENT, minutes: M}` (and `every: SECONDS`, the sampling interval, default 30)."""
    out: dict[str, float] = {}
    for key, key_node, value in reader.mapping(node, f):
        if key not in _IDLE_KEYS:
            raise reader.unknown(key_node, f"{f}.{key}", tuple(_IDLE_KEYS))
        number = reader.scalar(value, f"{f}.{key}")
        low, high = _IDLE_KEYS[key]
        high = SECONDS_MAX if high is None else high  # minutes too: a timer's bound, far past any use
        if isinstance(number, bool) or not isinstance(number, int | float) or not _finite(number) or \
                number <= low or number > high:
            bound = f"a number in (0, {high:,.0f}]"
            raise reader.fail(value, f"{f}.{key}", f"expected {bound}, got {_pytype(number)}")
        out[key] = float(number)
    for key in ("below", "minutes"):
        if key not in out:
            raise reader.fail(node, f"{f}.{key}", "missing: idle_stop takes {below: PERCENT, minutes: M}")
    return out


CHECKPOINT_FIELD = "{checkpoint}"  # in a job's `resume:` template: the checkpoint's path on the host
# what a followed run's retry answers (docs/architecture.md); timeout and preempted: a Slurm cluster's
RETRY_ON = ("host-lost", "lost", "failed", "timeout", "preempted")
RETRY_ON_DEFAULT = ("host-lost", "lost")  # a FAILED run is retried only when asked: a bug fails again


def _job_resume(reader: _Reader, f: str, node: yaml.Node) -> tuple[str, ...]:
    """The arguments that continue a run from a checkpoint, like [--resume-from, "{checkpoint}"]."""
    words = _words(reader, f, node, 'a list of arguments like [--resume-from, "{checkpoint}"]')
    if not any(CHECKPOINT_FIELD in w for w in words):
        raise reader.fail(node, f, f'expected the checkpoint\'s place in the arguments, "{CHECKPOINT_FIELD}", '
                                   'as in [--resume-from, "{checkpoint}"]')
    return tuple(words)


def _sync_every(reader: _Reader, f: str, node: yaml.Node) -> float:
    return reader.seconds(node, f, "seconds between pulls", zero=True)


def _parse_retry(reader: _Reader, f: str, node: yaml.Node) -> dict[str, Any]:
    """`{max: N, on: [host-lost, lost, failed], hosts: [a, b]}`; `max` is needed, the rest has defaults."""
    out: dict[str, Any] = {"on": RETRY_ON_DEFAULT, "hosts": ()}
    for key, key_node, value in reader.mapping(node, f):
        if key == "max":
            n = reader.scalar(value, f"{f}.max")
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise reader.fail(value, f"{f}.max",
                                  f"expected a number of retries (an integer >= 0), got {_pytype(n)}")
            out["max"] = n
        elif key == "on":
            events = _words(reader, f"{f}.on", value, f"a list of {', '.join(RETRY_ON)}")
            for event in events:
                if event not in RETRY_ON:
                    raise reader.fail(value, f"{f}.on", f"{event!r} is not one of {', '.join(RETRY_ON)}")
            out["on"] = tuple(events)
        elif key == "hosts":
            out["hosts"] = tuple(_words(reader, f"{f}.hosts", value, "a list of host names"))
            out["hosts_line"] = _line(value)
        elif key == "grace":
            out["grace"] = _sync_every(reader, f"{f}.grace", value)  # seconds >= 0, as sync_every's
        else:
            raise reader.unknown(key_node, f"{f}.{key}", ("max", "on", "hosts", "grace"))
    if "max" not in out:
        raise reader.fail(node, f"{f}.max", "missing: retry takes {max: N, on: [...], hosts: [...]}")
    return out


_NOTIFY_KEYS = ("command", "webhook", "desktop")
_ENV_REF = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)\Z")


def _parse_notify(reader: _Reader, f: str, node: yaml.Node) -> NotifyConfig:
    values: dict[str, Any] = {}
    for key, key_node, value in reader.mapping(node, f):
        if key == "command":
            values[key] = _job_command(reader, f"{f}.command", value)
        elif key == "webhook":
            url = (reader.string(value, f"{f}.webhook") or "").strip()
            if not (_ENV_REF.match(url) or re.match(r"^https?://", url, re.IGNORECASE)):
                # the URL itself is a secret: never repeated in the message
                raise reader.fail(value, f"{f}.webhook", "expected an http(s):// URL, or $NAME to read it from the "
                                                          "environment (keeps the secret out of this file)")
            problem = None if _ENV_REF.match(url) else webhook_problem(url)  # $NAME: checked when it is sent
            if problem:
                raise reader.fail(value, f"{f}.webhook", f"not a usable URL: {problem} (the URL is not repeated: "
                                                          "it is a secret)")
            values[key] = url
        elif key == "desktop":
            values[key] = reader.boolean(value, f"{f}.desktop")
        else:
            raise reader.unknown(key_node, f"{f}.{key}", _NOTIFY_KEYS)
    return NotifyConfig(**values)


def webhook_problem(url: str) -> str | None:
    """What makes `url` no webhook to POST to, said without repeating any of it (its path, query and
    user part are the secret); None when it is one. Checked when thrust.yaml is read (a literal URL) and
    when a `$NAME`'s value is sent (runs/notify.py), so a bad one is an error or a warning, never a crash."""
    from urllib.parse import urlsplit

    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        return "it contains a space or a control character"
    if not url.isascii():
        return "it contains characters that are not ASCII (percent-encode them; a host name in punycode)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # its text quotes the bad part: not repeated
        return "its [IPv6 address] is not valid" if "IPv6" in str(exc) else "its port is not a number from 1 to 65535"
    if parts.scheme.lower() not in ("http", "https"):
        return "expected an http(s):// URL"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "its port is not a number from 1 to 65535"
    return None


def _repo_path(reader: _Reader, f: str, node: yaml.Node) -> str:
    """A path (or a glob) relative to the checkout, staying inside it."""
    text = reader.string(node, f) or ""
    parts = text.replace("\\", "/").split("/")
    if not text.strip() or text.startswith(("-", "/", "~")) or ".." in parts or "\n" in text:
        raise reader.fail(node, f, f"expected a path inside the repository (relative, no '..'), got {text!r}")
    return text


def name_problem(key: str, what: str) -> str:
    """Why `key` is no flag or parameter name. A name written as its flag (`--learning_rate`) is refused
    rather than stripped: how a name is passed is the job's `flags:` alone, so the same name in `args:`,
    `search:` and `--set` always reaches the job the same way."""
    bare = key.lstrip("-")
    if key.startswith("-") and bare and valid_id(bare):
        return (f"write the {what} name alone ({bare}): how it reaches the job (--{bare} VALUE, --{bare}=VALUE, "
                f"{bare}=VALUE) is the job's `flags: {{style: ...}}`")
    return f"{what} names are plain words like learning_rate or total-steps"


def _job_metrics(reader: _Reader, f: str, node: yaml.Node) -> dict[str, str]:
    out = {}
    for k, k_node, v in reader.mapping(node, f):
        if k == "tensorboard":
            out[k] = _repo_path(reader, f"{f}.{k}", v)
        elif k == "pattern":
            out[k] = _metrics_pattern(reader, f"{f}.{k}", v)
        else:
            raise reader.unknown(k_node, f"{f}.{k}", ("tensorboard", "pattern"))
    return out


def _metrics_pattern(reader: _Reader, f: str, node: yaml.Node) -> str:
    """A regular expression searched in each line of the job's log; its named groups are the metrics
    (`step` the x of the series). Checked here, so a typo is a 78 at its line, not a run with no progress."""
    text = reader.string(node, f) or ""
    why = check_pattern(text)  # RE2's rules (core/patterns.py): what the follow will match it with
    if why is not None:
        raise reader.fail(node, f, why)
    return text


def _job_flags(reader: _Reader, f: str, node: yaml.Node) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, k_node, v in reader.mapping(node, f):
        if k == "style":
            out[k] = reader.choice(v, f"{f}.style", FLAG_STYLES)
        elif k == "names":
            out[k] = reader.choice(v, f"{f}.names", FLAG_NAMES)
        else:
            raise reader.unknown(k_node, f"{f}.{k}", ("style", "names"))
    return out


def _job_objective(reader: _Reader, f: str, node: yaml.Node) -> dict[str, str]:
    if not isinstance(node, yaml.MappingNode):
        raise reader.fail(node, f, f"expected {{metric: NAME, mode: max|min}}, got {_kind(node)}")
    out: dict[str, str] = {}
    for k, k_node, v in reader.mapping(node, f):
        if k == "metric":
            metric = reader.string(v, f"{f}.metric") or ""
            if not metric.strip() or "\n" in metric:
                raise reader.fail(v, f"{f}.metric", "expected a metric name like charts/episodic_return")
            out[k] = metric
        elif k == "mode":
            out[k] = reader.choice(v, f"{f}.mode", ("max", "min"))
        else:
            raise reader.unknown(k_node, f"{f}.{k}", ("metric", "mode"))
    for needed in ("metric", "mode"):
        if needed not in out:
            raise reader.fail(node, f"{f}.{needed}", "missing; expected {metric: NAME, mode: max|min}")
    return out


def _parse_search(reader: _Reader, job: str, node: yaml.Node) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for param, p_node, spec in reader.mapping(node, f"search.{job}"):
        f = f"search.{job}.{param}"
        if not valid_id(param) or param.startswith("-"):
            raise reader.fail(p_node, f, name_problem(param, "parameter"))
        keys = {k: (kn, v) for k, kn, v in reader.mapping(spec, f)}
        if "choices" in keys:
            extra = set(keys) - {"choices"}
            if extra:
                raise reader.fail(keys[sorted(extra)[0]][0], f"{f}.{sorted(extra)[0]}", "not allowed with choices")
            choices_node = keys["choices"][1]
            if not isinstance(choices_node, yaml.SequenceNode) or not choices_node.value:
                raise reader.fail(choices_node, f"{f}.choices", "expected a non-empty list")
            out[param] = {"choices": reader.plain(choices_node, f)}
            continue
        for k, (kn, _v) in keys.items():
            if k not in ("low", "high", "log", "step"):
                raise reader.unknown(kn, f"{f}.{k}", ("low", "high", "log", "step", "choices"))
        if "low" not in keys or "high" not in keys:
            raise reader.fail(spec, f, "expected {low: X, high: Y[, log: true]} or {choices: [...]}")
        low = reader.number(keys["low"][1], f"{f}.low")
        high = reader.number(keys["high"][1], f"{f}.high")
        if not low < high:
            raise reader.fail(keys["high"][1], f"{f}.high", f"must be greater than low ({low})")
        entry: dict[str, Any] = {"low": reader.plain(keys["low"][1], f), "high": reader.plain(keys["high"][1], f)}
        if "log" in keys:
            entry["log"] = reader.boolean(keys["log"][1], f"{f}.log")
            if entry["log"] and low <= 0:
                raise reader.fail(keys["low"][1], f"{f}.low", "a log scale needs low > 0")
        if "step" in keys:
            entry["step"] = reader.plain(keys["step"][1], f)
        out[param] = entry
    return out


def _shape(node: yaml.Node) -> str:
    """What a node is, without its text."""
    if isinstance(node, yaml.ScalarNode):
        return "a single value (plain text, not YAML settings)"
    return _kind(node)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value!r}"


def _pytype(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 60:  # 10**400 written out, a pasted blob: what it starts with is enough
        text = f"{text[:40]}... ({len(text)} characters)"
    return f"{type(value).__name__} {text}"
