"""`search:` (optimize's spaces: a job's parameters, each a range or choices) and `--params` files
(a mapping of parameter: value, or optimize's best-params file)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.config.bounded import compose_yaml, read_text
from thrust_remote.core.config.job_values import several, word_key, word_positions
from thrust_remote.core.config.model import JobConfig
from thrust_remote.core.config.reader import Reader, line, shape
from thrust_remote.core.config.values import check_name, name_problem
from thrust_remote.core.errors import ConfigError
from thrust_remote.core.names import valid_id


def parse_searches(reader: Reader, node: yaml.Node, search: dict[str, dict[str, dict[str, Any]]],
                   lines: dict[str, int]) -> None:
    """`search:` into `search` (job -> parameter -> spec), and each parameter's line into `lines`."""
    for name, name_node, spec_node in reader.mapping(node, "search"):
        check_name(reader, name_node, f"search.{name}", name)
        search[name] = parse_search(reader, name, spec_node)
        lines.update({f"{name}.{param}": line(p_node)
                      for param, p_node, _spec in reader.mapping(spec_node, f"search.{name}")})


def check_search_words(label: str, search: Mapping[str, Mapping[str, Any]], lines: Mapping[str, int],
                       jobs: Mapping[str, JobConfig]) -> None:
    """A `search:` key naming one word of a flag of several words (`hyperparams.learning_rate` with
    `args: {hyperparams: [n_envs:4, learning_rate:0.001]}`) names a word the list has: a trial sets the
    value after that word's separator, so a word that is not there has no place to go (and appending
    one would guess its separator). Checked once every section is read: `search:` may come first."""
    for job_name, params in search.items():
        job = jobs.get(job_name)
        if job is None or not isinstance(job.args, Mapping):
            continue
        for param in params:
            named = word_key(param, job.args)
            if named is None or word_positions(job.args[named[0]], named[1]):
                continue
            flag, word = named
            sep = _separator(job.args[flag])
            raise ConfigError(f"{label}:{lines.get(f'{job_name}.{param}', 0)}: search.{job_name}.{param}: "
                              f"jobs.{job_name}.args.{flag} has no word {word}{sep}VALUE for a trial to set",
                              f"add it to jobs.{job_name}.args.{flag} ({label}:{job.lines.get('args', 0)}), "
                              f"like {flag}: "
                              f"[{', '.join((*job.args[flag], f'{word}{sep}VALUE'))}]")


def _separator(words: tuple[str, ...]) -> str:
    """The separator the list's words use (`n_envs:4`: `:`), for the word a hint asks to add."""
    for word in words:
        at = min((word.find(c) for c in ":=" if c in word), default=-1)
        if at > 0:
            return word[at]
    return ":"


def parse_search(reader: Reader, job: str, node: yaml.Node) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for param, p_node, spec in reader.mapping(node, f"search.{job}"):
        f = f"search.{job}.{param}"
        if not valid_id(param) or param.startswith("-"):
            raise reader.fail(p_node, f, name_problem(param, "parameter"))
        keys = {k: (kn, v) for k, kn, v in reader.mapping(spec, f)}
        out[param] = _choices(reader, f, keys) if "choices" in keys else _range(reader, f, spec, keys)
    return out


def _choices(reader: Reader, f: str, keys: dict[str, tuple[yaml.Node, yaml.Node]]) -> dict[str, Any]:
    extra = set(keys) - {"choices"}
    if extra:
        raise reader.fail(keys[sorted(extra)[0]][0], f"{f}.{sorted(extra)[0]}", "not allowed with choices")
    choices_node = keys["choices"][1]
    if not isinstance(choices_node, yaml.SequenceNode) or not choices_node.value:
        raise reader.fail(choices_node, f"{f}.choices", "expected a non-empty list")
    return {"choices": reader.plain(choices_node, f)}


def _range(reader: Reader, f: str, spec: yaml.Node, keys: dict[str, tuple[yaml.Node, yaml.Node]]) -> dict[str, Any]:
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
    return entry


def parse_params(path: Path) -> dict[str, Any]:
    """A `--params` file: a mapping of parameter -> value, or optimize's best-params file (that
    mapping under `params:`). Read as thrust.yaml is (`compose_yaml`: file:line errors, nesting and alias
    bounds), and each value as in a job's `args:` mapping: a single one, or a flat list of words for a flag
    that takes several."""
    reader = Reader(path)
    root = compose_yaml(read_text(path), reader.label)
    if not isinstance(root, yaml.MappingNode):
        where = f"{reader.label}:{line(root)}" if root is not None else reader.label
        raise ConfigError(f"{where}: expected a mapping of parameter: value, got "
                          f"{'nothing' if root is None else shape(root)}")
    entries, prefix = reader.mapping(root, ""), ""
    nested = next((v for k, _kn, v in entries if k == "params" and isinstance(v, yaml.MappingNode)), None)
    if nested is not None:
        entries, prefix = reader.mapping(nested, "params"), "params."
    out: dict[str, Any] = {}
    for key, key_node, value in entries:
        if not valid_id(key) or key.startswith("-"):
            raise reader.fail(key_node, f"{prefix}{key}", name_problem(key, "parameter"))
        if isinstance(value, yaml.SequenceNode):  # a flag of several words, as in `args:`
            out[key] = several(reader, f"{prefix}{key}", value)
        else:
            out[key] = reader.scalar(value, f"{prefix}{key}")
    return out
