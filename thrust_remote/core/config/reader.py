"""The node reader: typed values out of a composed YAML tree, each refusal a ConfigError that names the
file, the line and the field (`thrust.yaml:7: hosts.gpu.port: expected ...`), exit 78. Every section
parser reads through one Reader; the messages' wording for a value's kind (`_kind`, `pytype`) is here."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.config.bounded import construct
from thrust_remote.core.errors import ConfigError

SECONDS_MAX = 1_000_000  # ~11.6 days: a timer of Python's waits at most ~292 years, a socket's less


class Reader:
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
            raise self.fail(node, field_name, f"expected a mapping, got {kind(node)}")
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
            raise self.fail(node, field_name, f"expected a single value, got {kind(node)}")
        value = construct(node)
        problem = text_problem(value) if isinstance(value, str) else None
        if problem:  # it would reach a command line, an environment or a file on the host, which cannot carry it
            raise self.fail(node, field_name, f"a value that {problem}")
        return value

    def string(self, node: yaml.Node, field_name: str, *, nullable: bool = False) -> str | None:
        value = self.scalar(node, field_name)
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise self.fail(node, field_name, f"expected a string, got {pytype(value)}")
        return value

    def number(self, node: yaml.Node, field_name: str) -> float:
        value = self.scalar(node, field_name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(node, field_name, f"expected a number, got {pytype(value)}")
        if not finite(value):
            raise self.fail(node, field_name, f"expected a finite number, got {pytype(value)}")
        return float(value)

    def seconds(self, node: yaml.Node, field_name: str, what: str, *, zero: bool = False) -> float:
        """A number of seconds: > 0 (`zero`: >= 0, 0 meaning off) and at most SECONDS_MAX (a timer's)."""
        value = self.scalar(node, field_name)
        number = isinstance(value, int | float) and not isinstance(value, bool) and finite(value)
        if not number or value < 0 or (value == 0 and not zero) or value > SECONDS_MAX:
            span = f"from 0 to {SECONDS_MAX:,}; 0: off" if zero else f"above 0, up to {SECONDS_MAX:,}"
            raise self.fail(node, field_name, f"expected {what} (a number {span}), got {pytype(value)}")
        return float(value)

    def boolean(self, node: yaml.Node, field_name: str) -> bool:
        value = self.scalar(node, field_name)
        if not isinstance(value, bool):
            raise self.fail(node, field_name, f"expected true or false, got {pytype(value)}")
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
        return construct(node)


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


def finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float (10**400)
        return False


def line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


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


def shape(node: yaml.Node) -> str:
    """What a node is, without its text."""
    if isinstance(node, yaml.ScalarNode):
        return "a single value (plain text, not YAML settings)"
    return kind(node)


def kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"{node.value!r}"


def pytype(value: Any) -> str:
    if value is None:
        return "nothing (null)"
    text = repr(value)
    if len(text) > 60:  # 10**400 written out, a pasted blob: what it starts with is enough
        text = f"{text[:40]}... ({len(text)} characters)"
    return f"{type(value).__name__} {text}"
