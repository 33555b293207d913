"""How a job takes its flags (`flags: {style, names}`, docs/architecture.md "Job kinds"): `--set`, an
`args:` mapping and optimize's parameters written in the job's own style, and the hint that names the
style when a job dies of its arguments right after it started.

    --key value   --lr 0.1, a true switch as a bare --lr, false left out (argparse; a python job's default)
    --key=value   --lr=0.1, booleans as True/False (what a literal_eval configurator like nanoGPT's takes)
    key=value     lr=0.1, booleans as true/false (Hydra; a command job's default)
    -k value      -lr 0.1, switches as for --key value (single-dash programs)

A list value is a flag of several words (`--hyperparams n_envs:4 lr:0.001`): the styles that write a flag
and its value as separate words only.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thrust_remote.core.config import COMMAND_STYLE, CONFIG_NAME, FLAG_STYLES, FlagsConfig, JobConfig
from thrust_remote.core.config.job_values import SEPARATE_STYLES
from thrust_remote.core.errors import UsageError

DASHES = "dashes"
# the log lines of a job that refused how its flags were spelled, not their values: argparse's and
# Hydra's, click's and absl's wording (argparse's "invalid int value", Hydra's "could not be converted",
# absl's "could not convert" are a value's type: the spelling was right)
_REFUSED = re.compile(r": error: (unrecognized arguments|argument \S+: expected (one|at least one) argument|"
                      r"ambiguous option)|^Error: (No such option|Got unexpected)|"
                      r"FATAL Flags parsing error: Unknown command line flag|"
                      r"Error parsing override|LexerNoViableAltException|mismatched input")
# a parser's line that names the flags it did not take (argparse's, click's, absl's), one group: the rest
_UNKNOWN_FLAGS = re.compile(r": error: unrecognized arguments: (?P<words>.*)|^Error: No such option: (?P<click>\S+)|"
                            r"Unknown command line flag '(?P<absl>[^']+)'")
# the words a job's own check uses when it refuses a name (nanoGPT's "Unknown config key: max_iter",
# Hydra's "Key 'x' is not in struct", a KeyError, a NameError), not a value
_REFUSES_A_NAME = re.compile(r"unknown|unrecogni[sz]ed|unexpected|no such|not in struct|could not override|"
                             r"KeyError|not defined|invalid (option|key|flag|argument name)", re.IGNORECASE)
# an option in argparse's usage text, with its metavar when it takes a value: `[-n N_TIMESTEPS]`, `--lr LR`
_USAGE_OPTION = re.compile(r"(?<![\w-])(?P<flag>--?[A-Za-z][\w-]*)(?: (?P<metavar>[A-Z][A-Z0-9_]*)\b)?")
# a top-level name a script sets: `max_iters = 600000`, `lr: float = 0.1` (not `==`, not indented)
_ASSIGNED = re.compile(r"^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=(?!=)", re.MULTILINE)
LAST_LINES = 4  # how far up from the log's end a refusal is looked for: a traceback's last line, Hydra's hint
# an assertion that looks at how an argument is written (nanoGPT's configurator: `assert
# arg.startswith('--')`): its source line tests a quoted dash or `=`; `assert type(attempt) == ...` does not
_ON_SPELLING = re.compile(r"""['"](--?|=)['"]""")


@dataclass(frozen=True)
class Spelling:
    """What writing a job's flags reads of it: its kind and its `flags:` (what a caller holding the
    job hands `render`, rather than the job; a JobConfig has the same fields)."""

    kind: str
    flags: FlagsConfig


def style_of(job: JobConfig | Spelling) -> str:
    """The job's style: its `flags: {style:}`, else its kind's default."""
    default = COMMAND_STYLE if job.kind == "command" else FLAG_STYLES[0]
    return job.flags.style or default


def render(job: JobConfig | Spelling, values: Mapping[str, Any]) -> list[str]:
    """`values` (name -> value; a bool a switch, None left out) as the job's argv words, in order."""
    style, dashes = style_of(job), job.flags.names == DASHES
    spelled = job.kind == "trainer"  # its switches take a value: a false overrides its env's preset
    out: list[str] = []
    for key, value in values.items():
        name = key.replace("_", "-") if dashes else key
        out += _words(style, name, value, spelled=spelled)
    return out


def _words(style: str, name: str, value: Any, *, spelled: bool) -> list[str]:
    if value is None:
        return []
    if isinstance(value, tuple | list):  # a flag of several words: argparse's nargs='+' (or '*': none)
        if style not in SEPARATE_STYLES:
            raise UsageError(f"--{name}: {len(value)} words for one flag, but the job's flags are written "
                             f"{style!r} (one word each)", f"give it one value, or set the job's flags: "
                             f"{{style: {SEPARATE_STYLES[0]!r}}} if its code takes --{name} a b")
        flag = f"-{name}" if style == "-k value" else f"--{name}"
        return [flag, *(_text(word, python=False) for word in value)]
    if style == "key=value":
        return [f"{name}={_text(value, python=False)}"]
    if style == "--key=value":
        return [f"--{name}={_text(value, python=True)}"]
    flag = f"-{name}" if style == "-k value" else f"--{name}"
    if isinstance(value, bool) and not spelled:
        return [flag] if value else []
    return [flag, _text(value, python=False)]


def _text(value: Any, *, python: bool) -> str:
    if isinstance(value, bool):
        return str(value) if python else str(value).lower()
    return str(value)


def example(job: JobConfig, name: str = "learning_rate") -> str:
    """How one flag reaches the job now: `--learning_rate 0.1`."""
    return " ".join(render(job, {name: "0.1"}))


def refused_hint(job: JobConfig, log_tail: str, *, gave_flags: bool, config_file: str = CONFIG_NAME) -> str | None:
    """When a job of your own died of its arguments (a usage error, an AssertionError) before it reported
    progress: a hint, else None. A parser that named a flag it does not take gets that flag named first,
    and the spelling that reaches it (`names: dashes`, the option its usage shows); the flag style only
    when what it refused was the form (`lr=0.1` to argparse, an assertion on `--`, Hydra's parse error)."""
    if job.kind == "trainer" or not gave_flags:
        return None
    refusal = refused_name(job, log_tail, ())
    if refusal is not None and refusal.parser:
        return name_hint(job, refusal, config_file)
    if not _refused(log_tail.splitlines(), style_of(job)):
        return None
    others = [s for s in FLAG_STYLES if s != style_of(job)]
    return (f"its flags were written {example(job)} (jobs.{job.name}.flags: style {style_of(job)!r}"
            f"{', names as-is' if job.flags.names != DASHES else ', names with dashes'}); if it takes "
            f"them otherwise, say so under jobs.{job.name}: flags: {{style: {others[0]!r}}} (or "
            f"{', '.join(repr(s) for s in others[1:])}; names: dashes for learning-rate)")


@dataclass(frozen=True)
class Refusal:
    """A name the job refused before its first metrics (issue 53): the key as the run was given it
    (--set, --params), the job's line that said so, and what it takes instead where that is evident."""

    key: str
    said: str
    flag: str  # the word the job got: --n_timesteps, or the key itself for a configurator's check
    parser: bool  # a parser's unknown-flag line (argparse, click, absl), not the job's own check
    instead: str | None = None  # the key as --set gives the name the job takes: n-timesteps
    shown: str | None = None  # how its usage shows that option: `-n N_TIMESTEPS`
    source: str = "its usage"  # where `shown` was read: the parser's usage, or the job's script
    dashed: bool = False  # the key has `_` where the job's flags have `-`


def refused_name(job: JobConfig, log_tail: str, given: Mapping[str, object] | tuple[()]) -> Refusal | None:
    """Which name the job refused, read from its log's last lines: a parser's unknown flag among the words
    it was given, or a line of its own that names one of `given` (key -> value) in words that refuse a name
    (nanoGPT's `ValueError: Unknown config key: max_iter`) and not its value. With `given` empty, any
    unknown flag a parser names. None for the trainer (its keys are checked on the laptop)."""
    if job.kind == "trainer":
        return None
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip() and not ln.startswith("THRUST_")]
    for line in reversed(lines[-LAST_LINES:]):
        found = _parser_refused(job, line, given)
        if found is not None:
            return _with_instead(Refusal(found[0], line, found[1], parser=True), _usage_options(lines))
        if _UNKNOWN_FLAGS.search(line) or not _REFUSES_A_NAME.search(line):
            continue
        for key, value in (given.items() if given else ()):
            if _names(line, _spelled(job, key)) and not (isinstance(value, str) and value and _names(line, value)):
                return Refusal(key, line, _spelled(job, key), parser=False)
    return None


def name_hint(job: JobConfig, refusal: Refusal, config_file: str = CONFIG_NAME) -> str:
    """What reaches the name the job refused, without a command (the caller has the host): the job's
    spelling first (`names: dashes`), else the option its usage shows, else where its names are listed."""
    flag = refusal.flag if refusal.parser else refusal.key
    if refusal.dashed:
        dashed = refusal.instead or refusal.key.replace("_", "-")
        return (f"the job does not take {flag}: its flags are written with dashes ({refusal.shown or 'its usage'}); "
                f"give it as --set {dashed}=..., or write every name that way "
                f"with jobs.{job.name}.flags: {{names: {DASHES}}} in {config_file}")
    if refusal.instead:
        return f"the job does not take {flag}; did you mean {refusal.instead} ({refusal.source} has {refusal.shown})?"
    if refusal.parser:
        return f"the job does not take {flag}; its --help lists the flags it takes"
    return f"{refusal.key} is not a name the job knows: check its spelling against the job's own config"


def with_script_names(refusal: Refusal, script: str, text: str) -> Refusal:
    """A refused key its job's own check named (a configurator like nanoGPT's, which lists no names) with
    the closest top-level name the job's script sets (`max_iters = 600000` for `max_iter`), if one is
    close enough to be a typo; else as it was."""
    if refusal.parser or refusal.instead:
        return refusal
    names = {m.group(1) for m in _ASSIGNED.finditer(text)} - {refusal.key}
    close = difflib.get_close_matches(refusal.key, sorted(names), n=1, cutoff=0.8)
    if not close:
        return refusal
    return Refusal(refusal.key, refusal.said, refusal.flag, refusal.parser, close[0], close[0], source=script)


def _parser_refused(job: JobConfig, line: str, given: Mapping[str, object] | tuple[()]) -> tuple[str, str] | None:
    """(key, flag word) of the first flag a parser's line says it does not take that the run was given."""
    m = _UNKNOWN_FLAGS.search(line)
    if not m:
        return None
    words = (m.group("words") or "").split() + [w for w in (m.group("click"), m.group("absl")) if w]
    for word in words:
        name = word.split("=", 1)[0]
        if not name.startswith("-") and not m.group("absl"):
            continue  # `lr=0.1` to argparse: the form was refused, not the name (the flag style says so)
        for key in given or [name.lstrip("-")]:
            if _spelled(job, key) == name.lstrip("-"):
                return key, name if name.startswith("-") else f"--{name}"
    return None


def _spelled(job: JobConfig, key: str) -> str:
    """The name `key` reaches the job under (its `names:`), without dashes in front: n-timesteps."""
    return key.replace("_", "-") if job.flags.names == DASHES else key


def _names(line: str, word: str) -> bool:
    """Whether `line` has `word` as a word of its own (not part of a longer name)."""
    return re.search(rf"(?<![\w.-]){re.escape(word)}(?![\w-])", line) is not None


def _usage_options(lines: list[str]) -> list[tuple[str, str | None]]:
    """argparse's usage text before its error line: each option with its metavar (`-n`, `N_TIMESTEPS`)."""
    starts = [at for at, ln in enumerate(lines) if ln.startswith("usage:")]
    if not starts:
        return []
    text = " ".join(ln for ln in lines[starts[-1]:] if ": error:" not in ln)
    return [(m.group("flag"), m.group("metavar")) for m in _USAGE_OPTION.finditer(text) if m.group("flag") != "-h"]


def _with_instead(refusal: Refusal, options: list[tuple[str, str | None]]) -> Refusal:
    """`refusal` with the option its usage shows for that name: the same name with `-` for `_`, the option
    whose metavar is the name (argparse's dest: `-n N_TIMESTEPS` of `--n-timesteps`), else a close one."""
    name = refusal.flag.lstrip("-")
    norm = name.replace("-", "_").lower()
    instead = shown = None
    for flag, metavar in options:
        if flag.lstrip("-").replace("-", "_").lower() == norm and flag.lstrip("-") != name:
            instead, shown = flag.lstrip("-"), flag
        elif metavar and metavar.lower() == norm and shown is None:
            shown = f"{flag} {metavar}"
            instead = flag.lstrip("-") if flag.startswith("--") else name.replace("_", "-") if "_" in name else None
    longs = [flag.lstrip("-") for flag, _ in options if flag.startswith("--")]
    if shown is None:
        close = difflib.get_close_matches(name, longs, n=1, cutoff=0.75)
        instead, shown = (close[0], f"--{close[0]}") if close else (None, None)
    dashed = "_" in name and (bool(instead and "-" in instead and instead.replace("-", "_") == norm)
                              or (any("-" in f for f in longs) and not any("_" in f for f in longs)))
    if dashed and shown is None:
        shown = ", ".join(f"--{f}" for f in longs if "-" in f)[:80]
    return Refusal(refusal.key, refusal.said, refusal.flag, refusal.parser, instead, shown, dashed=dashed)


def _refused(lines: list[str], style: str) -> bool:
    """Whether the log's tail says the job refused the way its flags were spelled: a parser's wording, or
    an AssertionError on an argument's spelling. One whose source line the traceback does not show (code
    run by exec(), as nanoGPT runs its configurator) counts unless the flags were written --key=value, the
    spelling such a configurator takes: then it asserted on a value (its type), not on how it was written."""
    for at, line in enumerate(lines):
        text = line.strip()
        if _REFUSED.search(text):
            return True
        if text.startswith("AssertionError"):
            source = [ln.strip() for ln in lines[:at] if ln.strip() and set(ln.strip()) - set("^~ ")]
            shown = source[-1] if source and not source[-1].startswith(("File ", "Traceback")) else None
            if _ON_SPELLING.search(shown) if shown else style != "--key=value":
                return True
    return False
