"""Reading a YAML file without trusting it: its bytes as UTF-8 text, composed into nodes that keep their
lines, and bounded (nesting, aliases that multiply) before anything walks the tree. thrust.yaml and
`--params` files are both read through here; every refusal is a ConfigError at `label:LINE`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.errors import ConfigError

MAX_DEPTH = 64  # nesting: no thrust.yaml needs more (PyYAML's composer recurses, and overflows near 300)
MAX_VALUES = 100_000  # values once aliases are expanded: a few lines whose aliases multiply are refused


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


def construct(node: yaml.Node) -> Any:
    """A composed node as safe_load would give it. Its tags are resolved already (an empty value is
    null); serializing it alone to load it again fails on an empty value (a document PyYAML cannot read)."""
    return yaml.constructor.SafeConstructor().construct_object(node, deep=True)


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
    where = str(Path(label))  # as the node reader labels a file (reader.py), so both say the same name

    def fail(node: yaml.Node, message: str) -> ConfigError:
        return ConfigError(f"{where}:{node.start_mark.line + 1}: {message}")

    def size(node: yaml.Node, depth: int) -> int:
        if id(node) in sizes:
            if sizes[id(node)] < 0:
                raise fail(node, "an alias that refers to the value holding it (a loop)")
            return sizes[id(node)]
        if depth > MAX_DEPTH:
            raise fail(node, f"nested more than {MAX_DEPTH} levels deep")
        sizes[id(node)] = -1
        children = [c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        total = 1 + sum(size(child, depth + 1) for child in children)
        if total > MAX_VALUES:
            raise fail(node, f"aliases here expand to more than {MAX_VALUES:,} values")
        sizes[id(node)] = total
        return total

    size(root, 0)
