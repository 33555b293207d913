"""The values of a job's keys that are more than a string or a path: its environment, arguments,
module, process count, metrics, flags, objective, idle stop and max duration (jobs.py maps each key to its parser)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from thrust_remote.core.config.model import FLAG_NAMES, FLAG_STYLES, JobConfig
from thrust_remote.core.config.reader import SECONDS_MAX, Reader, finite, kind, pytype
from thrust_remote.core.config.sections import FlagsConfig, IdleStop, MetricsConfig, ObjectiveConfig
from thrust_remote.core.config.values import items, name_problem, repo_path, words
from thrust_remote.core.durations import parse_duration
from thrust_remote.core.errors import ConfigError
from thrust_remote.core.names import valid_env_key, valid_id
from thrust_remote.core.patterns import check_pattern

_MODULE_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*\Z")
# the flag styles that write a flag and its value as separate words: a flag of several words needs one
SEPARATE_STYLES = tuple(s for s in FLAG_STYLES if "=" not in s)
_IDLE_KEYS = {"below": (0.0, 100.0), "minutes": (0.0, None), "every": (0.0, None)}


def env(reader: Reader, f: str, node: yaml.Node) -> dict[str, str]:
    out = {}
    for k, k_node, v in reader.mapping(node, f):
        if not valid_env_key(k):
            raise reader.fail(k_node, f"{f}.{k}", "not a valid environment variable name")
        scalar = reader.scalar(v, f"{f}.{k}")
        if isinstance(scalar, dict | list):
            raise reader.fail(v, f"{f}.{k}", "expected a string")
        out[k] = "" if scalar is None else str(scalar)
    return out


def args(reader: Reader, job_kind: str, f: str, node: yaml.Node) -> Mapping[str, Any] | tuple[str, ...]:
    """cargo: a list; python: a list (passed as is) or a mapping (--key value); trainer: a mapping."""
    if isinstance(node, yaml.SequenceNode) and job_kind == "cargo":
        return tuple(str(reader.scalar(item, f)) for item in node.value)
    if isinstance(node, yaml.SequenceNode) and job_kind == "python":
        return tuple(words(reader, f, node, "a list of arguments"))
    if job_kind == "cargo":
        raise reader.fail(node, f, f"a cargo job takes a list of arguments, got {kind(node)}")
    if job_kind == "trainer" and isinstance(node, yaml.SequenceNode):
        raise reader.fail(node, f, "the built-in trainer takes a mapping of flags like {total-steps: 1000}; "
                                   "a list of arguments is for your own code: add script: or module:")
    if job_kind == "python" and not isinstance(node, yaml.MappingNode):
        raise reader.fail(node, f, f"expected a list of arguments like [--lr, '0.1'] or a mapping of flags like "
                                   f"{{lr: 0.1}}, got {kind(node)}")
    out: dict[str, Any] = {}
    for k, k_node, v in reader.mapping(node, f):
        if not valid_id(k) or k.startswith("-"):
            raise reader.fail(k_node, f"{f}.{k}", name_problem(k, "flag"))
        if isinstance(v, yaml.SequenceNode) and job_kind == "trainer":
            raise reader.fail(v, f"{f}.{k}", "the built-in trainer's flags take one value each, got a list")
        if isinstance(v, yaml.SequenceNode):
            out[k] = several(reader, f"{f}.{k}", v)
        else:
            out[k] = reader.scalar(v, f"{f}.{k}")
    return out


def several(reader: Reader, f: str, node: yaml.SequenceNode) -> tuple[str, ...]:
    """A flag that takes several words (argparse's nargs='+'): `{hyperparams: [n_envs:4, lr:0.001]}` is
    `--hyperparams n_envs:4 lr:0.001`, each item one word as written ([]: the flag alone); flat."""
    for item in node.value:
        if not isinstance(item, yaml.ScalarNode):
            raise reader.fail(item, f, f"expected one word per item, like [n_envs:4, learning_rate:0.001], got "
                                       f"{kind(item)} (a word 'key: value' with a space is a mapping: write "
                                       "key:value, or quote it)")
        reader.scalar(item, f)  # a NUL or a lone surrogate: no command line carries it
    return tuple(item.value for item in node.value)  # each word as written: 1.0e-3 stays 1.0e-3


def word_positions(words_: tuple[str, ...] | list[str], name: str) -> list[int]:
    """Where `name` is in a flag's several words: each word `name:VALUE` or `name=VALUE`."""
    return [i for i, w in enumerate(words_) if w.startswith(name) and w[len(name):len(name) + 1] in (":", "=")]


def with_word(words_: tuple[str, ...] | list[str], name: str, value: str) -> tuple[str, ...]:
    """The words with `name`'s value (after its own separator, `:` or `=` as written) replaced."""
    out = list(words_)
    for i in word_positions(words_, name):
        out[i] = f"{name}{out[i][len(name)]}{value}"
    return tuple(out)


def word_key(key: str, values: Mapping[str, Any]) -> tuple[str, str] | None:
    """(flag, word) when `key` names one word of a flag of several words in `values` (`hyperparams.lr`
    with `hyperparams` a list); None: `key` is a flag's own name (a dotted one like `config.lr` too)."""
    for at, char in enumerate(key):
        if char == "." and isinstance(values.get(key[:at]), tuple | list) and key[at + 1:]:
            return key[:at], key[at + 1:]
    return None


def check_several_words(label: str, jobs: Mapping[str, JobConfig]) -> None:
    """A flag of several words (a list in an `args:` mapping) needs a style where a flag and its value are
    separate words: `--key=value` or `key=value` would hand the job the first word only (argparse takes
    `--hyperparams=a b` as --hyperparams a, then a stray b). Checked once every job's keys are read."""
    for job in jobs.values():
        style = job.flags.style or FLAG_STYLES[0]  # args: is a python's or the trainer's: "--key value"
        if style in SEPARATE_STYLES or not isinstance(job.args, Mapping):
            continue
        several = next((k for k, v in job.args.items() if isinstance(v, tuple)), None)
        if several is not None:
            raise ConfigError(f"{label}:{job.lines.get('args', job.lines.get('job', 0))}: jobs.{job.name}.args."
                              f"{several}: a list is several words after one flag, but this job's flags are "
                              f"written {style!r} (one word each)",
                              f"give it one value (a string), or set jobs.{job.name}.flags: "
                              f"{{style: {SEPARATE_STYLES[0]!r}}} if its code takes --{several} a b")


def module(reader: Reader, f: str, node: yaml.Node) -> str:
    name = reader.string(node, f) or ""
    if not _MODULE_RE.match(name):
        raise reader.fail(node, f, f"expected a dotted module name like train.ppo, got {name!r}")
    return name


def nproc(reader: Reader, f: str, node: yaml.Node) -> int:
    n = reader.scalar(node, f)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise reader.fail(node, f, f"expected a number of processes (an integer >= 1), got {pytype(n)}")
    return n


def artifacts(reader: Reader, f: str, node: yaml.Node) -> tuple[str, ...]:
    return tuple(repo_path(reader, f, item) for item in items(reader, f, node, "a list of globs"))


def metrics(reader: Reader, f: str, node: yaml.Node) -> MetricsConfig:
    out: dict[str, str] = {}
    for k, k_node, v in reader.mapping(node, f):
        if k == "tensorboard":
            out[k] = repo_path(reader, f"{f}.{k}", v)
        elif k == "pattern":
            out[k] = _metrics_pattern(reader, f"{f}.{k}", v)
        else:
            raise reader.unknown(k_node, f"{f}.{k}", ("tensorboard", "pattern"))
    return MetricsConfig(**out)


def _metrics_pattern(reader: Reader, f: str, node: yaml.Node) -> str:
    """A regular expression searched in each line of the job's log; its named groups are the metrics
    (`step` the x of the series). Checked here, so a typo is a 78 at its line, not a run with no progress."""
    text = reader.string(node, f) or ""
    why = check_pattern(text)  # RE2's rules (core/patterns.py): what the follow will match it with
    if why is not None:
        raise reader.fail(node, f, why)
    return text


def flags(reader: Reader, f: str, node: yaml.Node) -> FlagsConfig:
    out: dict[str, str] = {}
    for k, k_node, v in reader.mapping(node, f):
        if k == "style":
            out[k] = reader.choice(v, f"{f}.style", FLAG_STYLES)
        elif k == "names":
            out[k] = reader.choice(v, f"{f}.names", FLAG_NAMES)
        else:
            raise reader.unknown(k_node, f"{f}.{k}", ("style", "names"))
    return FlagsConfig(**out)


def objective(reader: Reader, f: str, node: yaml.Node) -> ObjectiveConfig:
    if not isinstance(node, yaml.MappingNode):
        raise reader.fail(node, f, f"expected {{metric: NAME, mode: max|min}}, got {kind(node)}")
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
    return ObjectiveConfig(**out)


def idle_stop_section(reader: Reader, f: str, node: yaml.Node) -> IdleStop:
    """`idle_stop:` as its type (JobConfig.idle_stop)."""
    return IdleStop(**idle_stop(reader, f, node))


def idle_stop(reader: Reader, f: str, node: yaml.Node) -> dict[str, float]:
    """`{below: PERCENT, minutes: M}` (and `every: SECONDS`, the sampling interval, default 30)."""
    out: dict[str, float] = {}
    for key, key_node, value in reader.mapping(node, f):
        if key not in _IDLE_KEYS:
            raise reader.unknown(key_node, f"{f}.{key}", tuple(_IDLE_KEYS))
        number = reader.scalar(value, f"{f}.{key}")
        low, high = _IDLE_KEYS[key]
        high = SECONDS_MAX if high is None else high  # minutes too: a timer's bound, far past any use
        if isinstance(number, bool) or not isinstance(number, int | float) or not finite(number) or \
                number <= low or number > high:
            bound = f"a number in (0, {high:,.0f}]"
            raise reader.fail(value, f"{f}.{key}", f"expected {bound}, got {pytype(number)}")
        out[key] = float(number)
    for key in ("below", "minutes"):
        if key not in out:
            raise reader.fail(node, f"{f}.{key}", "missing: idle_stop takes {below: PERCENT, minutes: M}")
    return out


def max_duration(reader: Reader, f: str, node: yaml.Node) -> float | None:
    """`max_duration: 8h` (or seconds): the age at which a run of the job is stopped, its TERM first;
    null: no bound, as when the key is left out."""
    value = reader.scalar(node, f)
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise reader.fail(node, f, f"expected {exc}, got {pytype(value)}") from None
