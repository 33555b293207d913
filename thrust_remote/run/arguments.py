"""A job's arguments, assembled and checked on the laptop before anything connects: its config's
`args:`, then `--params`, then `--set` (docs/architecture.md, "Config"); the built-in trainer's flags
checked against its own table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.config import JobConfig, parse_params, text_problem
from thrust_remote.core.config.bounded import compose_yaml
from thrust_remote.core.config.job_values import SEPARATE_STYLES, with_word, word_key, word_positions
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.core.hints import config_file
from thrust_remote.core.names import valid_id
from thrust_remote.run import flags
from thrust_remote.run.vocab import TrainRequest
from trainer.args import EXPLOIT_ALONE, exploit_alone, parse_flag


@dataclass(frozen=True)
class Arguments:
    """A train request's arguments, resolved once before anything connects: the words the job gets
    (`words`), and its parameters as given (`params`: the index keeps them, so `resume` gives them again)."""

    words: tuple[str, ...]
    params: dict[str, Any]


def resolve(request: TrainRequest) -> Arguments:
    """The request's parameters (given as data, a resumed run's, under `--params`' file, read once),
    then `--set`, checked against the built-in trainer's table, then written in the job's style."""
    params = dict(request.params or {})
    if request.params_file:
        params.update(load_params(request.params_file))
    sets = parse_sets(request.sets, request.job)
    check_trainer_args(request.job, sets, params)
    return Arguments(tuple(job_arguments(request.job, sets, params)), params)


def parse_sets(sets: Sequence[str], job: JobConfig | None = None) -> dict[str, str | bool]:
    """`--set KEY=VALUE` as thrust.yaml's `args:` mapping takes it: `KEY` alone or `KEY=true` is a bare
    flag (`--KEY`, as `{KEY: true}`), `KEY=false` leaves the flag out; any other value is a string (a
    list `[a, b]` for a job that takes a flag of several words: `set_value`, once the job is known).

    A word that starts with `-` and has no `=` (`--set=-m`, `--set --multirun`) is a bare word: kept under
    its own text (no KEY starts with `-`) and passed to a job of your own as it is, before its other
    arguments, whatever its flags' style (`bare_words`): how Hydra's `-m` reaches a `key=value` job, whose
    KEY alone would be `m=true`. `job`: the job the refusal's example is written for (None: the trainer's)."""
    out: dict[str, str | bool] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep and item.startswith("-") and valid_id(item.lstrip("-")):
            out[item] = True
            continue
        key = key.strip().removeprefix("--")
        if not valid_id(key) or key.startswith("-"):
            raise set_refusal(item, job)
        problem = text_problem(value)  # a NUL, or undecodable bytes on the command line: no host can take it
        if problem:
            raise UsageError(f"--set {key}: a value that {problem}")
        out[key] = True if not sep else {"true": True, "false": False}.get(value.strip().lower(), value)
    return out


def set_refusal(item: str, job: JobConfig | None) -> UsageError:
    """A `--set` that is no KEY=VALUE, KEY or bare word, with an example written as the job takes it."""
    if job is None or job.kind == "trainer":
        return UsageError(f"--set {item!r}: expected KEY=VALUE (or KEY alone, a bare --KEY) with KEY like "
                          "total-steps")
    switch = " ".join(flags.render(job, {"verbose": True}))
    return UsageError(f"--set {item!r}: expected KEY=VALUE (--set learning_rate=0.1: the job gets "
                      f"{flags.example(job)}), KEY alone for a switch (--set verbose: {switch}), or a word that "
                      "starts with - to pass as it is (--set=-m: -m)",
                      f"jobs.{job.name} writes its flags {flags.style_of(job)!r} (jobs.{job.name}.flags: {{style:}} in "
                      "thrust.yaml)")


def bare_words(values: Mapping[str, Any]) -> list[str]:
    """The bare words among parsed `--set`s (parse_sets: the keys that start with `-`), in order."""
    return [key for key in values if key.startswith("-")]


def load_params(path: Path) -> dict[str, Any]:
    """A params file: a YAML mapping of flag -> value (what `optimize` writes), read as thrust.yaml is
    (core/config/search.py: parse_params; a config error at its line)."""
    return parse_params(path)


def job_arguments(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The job's own args, then the params file, then --set; a key given twice keeps the last value.

    An `args:` mapping is merged with them and written whole in the job's flag style (run/flags.py:
    `--key value` for the trainer and a python job, `KEY=VALUE` words for a command job, or the job's
    `flags:`); after an `args:` list (passed as is) params and --set are appended in that style
    (docs/architecture.md "Config"). A list is a flag of several words, and a key `FLAG.WORD` sets that
    word of it (`with_words`): how `--hyperparams n_envs:4 learning_rate:0.001` is given and searched.
    A `--set` bare word (parse_sets: `-m`) comes first, as it is, for a job of your own."""
    spelling = flags.Spelling(job.kind, job.flags)  # what render reads of the job
    several = job.kind != "trainer" and flags.style_of(spelling) in SEPARATE_STYLES
    bare = bare_words(sets) if job.kind != "trainer" else []  # the trainer's `--set --x`: its switch x
    sets = {_trainer_key(key): value for key, value in sets.items() if key not in bare}
    given = {**params, **{key: set_value(key, value) if several else value for key, value in sets.items()}}
    if isinstance(job.args, Mapping):
        return [*bare, *flags.render(spelling, with_words(job, {**dict(job.args), **given}))]
    return [*bare, *job.args, *flags.render(spelling, with_words(job, given))]


def _trainer_key(key: str) -> str:
    """A `--set` key as the trainer's table names it: a bare word `--tensorboard` is its switch."""
    return key.lstrip("-")


def set_value(key: str, value: Any) -> Any:
    """A `--set` value for a job that takes a flag of several words: `[a, b]` is that list as in thrust.yaml
    (a YAML flow list, one word per item as written); `'[a]'` (YAML-quoted) the text `[a]`; else as given."""
    text = value.strip() if isinstance(value, str) else ""
    if not (text.startswith("[") or (text[:1] in ("'", '"') and text[1:2] == "[")):
        return value
    quote = f"for the text itself, quote it: --set \"{key}='{text.strip(chr(39) + chr(34))}'\""
    try:
        node = compose_yaml(text, f"--set {key}")
    except ConfigError as exc:
        why = exc.message.replace(f"--set {key}:1:", f"--set {key}:", 1)  # one line: no line number
        raise UsageError(f"{why} (a value that starts with [ is a list, as in thrust.yaml)",
                         f"write it like --set '{key}=[n_envs:4, learning_rate:0.001]', or {quote}") from None
    if isinstance(node, yaml.ScalarNode):
        return node.value
    if not isinstance(node, yaml.SequenceNode) or not all(isinstance(i, yaml.ScalarNode) for i in node.value):
        raise UsageError(f"--set {key}: expected a list of words like [n_envs:4, learning_rate:0.001] (a word "
                         "'key: value' with a space is a mapping: write key:value)", quote)
    return tuple(item.value for item in node.value)


def with_words(job: JobConfig, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with each key that names one word of a flag of several words (`hyperparams.lr`, its flag
    a list in the values as finally given) set in that word, after the word's own `:` or `=`; the other
    keys as they are (a dotted flag name like `config.lr` included)."""
    out = {key: value for key, value in values.items() if word_key(key, values) is None}
    for key, value in values.items():
        named = word_key(key, values)
        if named is None:
            continue
        flag, word = named
        if not word_positions(out[flag], word):
            raise UsageError(f"{key}: jobs.{job.name}.args.{flag} has no word {word}:VALUE or {word}=VALUE to set",
                             f"add it to that list in {config_file(job)}, or give the whole list: --set "
                             f"'{flag}=[{', '.join((*out[flag], f'{word}:VALUE'))}]'")
        out[flag] = with_word(out[flag], word, word_text(value))
    return out


def word_text(value: Any) -> str:
    """A value in a word (`learning_rate:0.003`): what the job's own parser of such words reads, Python's
    spelling (rl-zoo's --hyperparams evaluates each value)."""
    return str(value)


def check_trainer_args(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    """The built-in trainer's flags, checked here against its own table (trainer/args.py) before
    anything is synced: an unknown name, a bad type, a value outside its choices or range is a usage
    error (64) naming where it came from, not an argparse dump from the host and a FAILED run."""
    if job.kind != "trainer":
        return  # your own code's flags are its own business: it sees them as given
    sources = [(dict(job.args), f"jobs.{job.name}.args"), (params, "--params"), (sets, "--set")]  # type: ignore[arg-type]
    for values, where in sources:
        for key, value in values.items():
            if value is None or value is False:
                continue
            try:
                parse_flag(_trainer_key(str(key)), "true" if value is True else str(value))
            except ValueError as exc:
                raise UsageError(f"{where}: {exc}",
                                 "python -m trainer.train --help lists every flag with its range") from None
    given = {_trainer_key(str(k)): v for values, _ in sources for k, v in values.items() if v is not None}
    if exploit_alone(given):  # the trainer would refuse it on the host (exit 64), after the sync and set-up
        raise UsageError(f"exploit-at={given['exploit-at']} with candidates={given.get('candidates', 1)}: "
                         f"{EXPLOIT_ALONE}",
                         "give it candidates of its own (--set candidates=auto: 2 to 3 side by side, or a "
                         "number), or leave exploit-at out")
