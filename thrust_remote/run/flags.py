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

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from thrust_remote.core.config import COMMAND_STYLE, FLAG_STYLES, FlagsConfig, JobConfig
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


def refused_hint(job: JobConfig, log_tail: str, *, gave_flags: bool) -> str | None:
    """When a job of your own died of its arguments (a usage error, an AssertionError) before it reported
    progress, the likely cause is how its flags were written: a hint naming the style, else None."""
    if job.kind == "trainer" or not gave_flags:
        return None
    if not _refused(log_tail.splitlines(), style_of(job)):
        return None
    others = [s for s in FLAG_STYLES if s != style_of(job)]
    return (f"its flags were written {example(job)} (jobs.{job.name}.flags: style {style_of(job)!r}"
            f"{', names as-is' if job.flags.names != DASHES else ', names with dashes'}); if it takes "
            f"them otherwise, say so under jobs.{job.name}: flags: {{style: {others[0]!r}}} (or "
            f"{', '.join(repr(s) for s in others[1:])}; names: dashes for learning-rate)")


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
