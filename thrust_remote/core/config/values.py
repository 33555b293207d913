"""Values more than one section takes: lists of words, an argv, a path inside the project, a name.
`command:` (a job's, notify's) and `setup:` are the same argv; `files:`/`setup:`/`shared:` are a job's
or the top level's for every job."""

from __future__ import annotations

import shlex

import yaml

from thrust_remote.core.config.reader import Reader, kind, pytype
from thrust_remote.core.names import bad_name_reason, valid_id

DATA_KEYS = ("files", "setup", "shared")  # a job's, or the top level's for every job


def items(reader: Reader, f: str, node: yaml.Node, expected: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise reader.fail(node, f, f"expected {expected}, got {kind(node)}")
    return list(node.value)


def words(reader: Reader, f: str, node: yaml.Node, expected: str, *, pip: bool = False) -> list[str]:
    """A list of single values (strings or numbers) as strings; `pip`: each a requirement, no option."""
    out = []
    for item in items(reader, f, node, expected):
        value = reader.scalar(item, f)
        if value is None or isinstance(value, bool):
            raise reader.fail(item, f, f"expected a string (quote it), got {pytype(value)}")
        text = str(value)
        if pip and (not text.strip() or text.startswith("-") or "\n" in text):
            raise reader.fail(item, f, f"expected a pip requirement like numpy>=1.26, got {text!r}")
        out.append(text)
    return out


def argv(reader: Reader, f: str, node: yaml.Node) -> tuple[str, ...]:
    """A list only: a string would need a shell's rules (quotes, $VAR, &&, globs) that no split
    applies faithfully; the list is the argv that runs, as is (docs/architecture.md, "Config")."""
    if isinstance(node, yaml.ScalarNode) and isinstance(reader.scalar(node, f), str):
        try:
            example = yaml.safe_dump(shlex.split(node.value), default_flow_style=True, width=10**6).strip()
        except ValueError:
            example = "[bash, train.sh]"
        raise reader.fail(node, f, f"expected a list (the argv, run as is, no shell), got a string; write it "
                                   f"as {example}, or [bash, -c, '...'] for shell syntax")
    argv_words = words(reader, f, node, "a list like [bash, devops/train.sh]")
    if not argv_words:
        raise reader.fail(node, f, "expected a non-empty list like [bash, devops/train.sh]")
    if argv_words[0].startswith("-"):
        raise reader.fail(node, f, "the program (the first item) may not start with '-'")
    return tuple(argv_words)


def repo_path(reader: Reader, f: str, node: yaml.Node) -> str:
    """A path (or a glob) relative to the checkout, staying inside it."""
    text = reader.string(node, f) or ""
    parts = text.replace("\\", "/").split("/")
    if not text.strip() or text.startswith(("-", "/", "~")) or ".." in parts or "\n" in text:
        raise reader.fail(node, f, f"expected a path inside the repository (relative, no '..'), got {text!r}")
    return text


def data_value(reader: Reader, key: str, f: str, node: yaml.Node) -> tuple[str, ...]:
    """`files:` and `shared:`: paths inside the project (a directory with or without its `/`);
    `setup:`: an argv like `command:` (run in the run's tree)."""
    if key == "setup":
        return argv(reader, f, node)
    what = "a list of paths in the project, like [data/input.txt, datasets/small/]" if key == "files" else \
        "a list of paths in the run's tree kept across runs, like [data/, .cache/]"
    paths = tuple(repo_path(reader, f, item) for item in items(reader, f, node, what))
    for item, path in zip(items(reader, f, node, what), paths, strict=True):
        if any(c in path for c in "*?[") or path.strip("/") in ("", ".", ".git", ".thrust") \
                or path.startswith((".git/", ".thrust/")):
            raise reader.fail(item, f, f"expected a path (no glob, not .git or .thrust), got {path!r}")
    return paths


def check_name(reader: Reader, node: yaml.Node, field_name: str, name: str) -> None:
    """A host's, group's, job's or study's name under its section."""
    if not valid_id(name):
        reason = bad_name_reason(name, "name") or f"name {name!r} is not allowed"
        raise reader.fail(node, field_name, f"{reason}; use letters, digits, '_', '-', '.'")


def name_problem(key: str, what: str) -> str:
    """Why `key` is no flag or parameter name. A name written as its flag (`--learning_rate`) is refused
    rather than stripped: how a name is passed is the job's `flags:` alone, so the same name in `args:`,
    `search:` and `--set` always reaches the job the same way."""
    bare = key.lstrip("-")
    if key.startswith("-") and bare and valid_id(bare):
        return (f"write the {what} name alone ({bare}): how it reaches the job (--{bare} VALUE, --{bare}=VALUE, "
                f"{bare}=VALUE) is the job's `flags: {{style: ...}}`")
    return f"{what} names are plain words like learning_rate or total-steps"
