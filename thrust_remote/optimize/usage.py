"""A trial that died of a usage error: argparse's exit 2 with `usage:` and `PROG: error: ...` (docs/optimize.md,
"A job of your own"). The job refused the arguments a trial was given, so every trial would fail the
same way: the study stops after it with a config error (78) naming the flag and where it came from
(the `search:` key, `--set`, or the job's `args:`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from thrust_remote.core.config import Config, JobConfig
from thrust_remote.core.config.job_values import word_key
from thrust_remote.core.errors import ConfigError
from thrust_remote.run import flags as flag_styles
from thrust_remote.run.jobs import config_label

USAGE_EXIT = 2  # argparse's (and most CLIs') exit status for a usage error
_ERROR = re.compile(r"^\S*: error: (?P<what>.+)$")
_ARGUMENT = re.compile(r"^argument (?P<flag>[^\s:/]+)")
_UNRECOGNIZED = "unrecognized arguments: "


@dataclass(frozen=True)
class UsageSources:
    """Where a trial's arguments came from: the searched keys, --set, the job's own args."""

    config: Config
    job: JobConfig
    fixed: Mapping[str, object]

    def key_of(self, flag: str) -> str | None:
        """`--lr`, `--lr=0.1` or (a command job's word) `lr=0.1` -> `lr`."""
        name = flag.lstrip("-").split("=", 1)[0]
        return name or None

    def word_of(self, flag: str, keys: Iterable[str]) -> str | None:
        """The key among `keys` that set one word of a flag of several words (`hyperparams.learning_rate`):
        a word of `flag` (`--hyperparams`, whose words the job refused), or, `flag` a bare word
        (`learning_rate:0.003`, one the job took for an argument of its own), that word. None: none did."""
        lists = {**(dict(self.job.args) if isinstance(self.job.args, Mapping) else {}), **self.fixed}
        name = self.key_of(flag) or ""
        word = None if flag.startswith("-") else re.split("[:=]", flag, maxsplit=1)[0]
        for key in keys:
            named = word_key(key, lists)
            if named is not None and (named[0] in (name, name.replace("-", "_")) or named[1] == word):
                return key
        return None

    def origin(self, flag: str) -> str:
        """`thrust.yaml:LINE: search.JOB.KEY`, `--set KEY`, or the job's args, for the flag."""
        label = config_label(self.config.path)
        key = self.key_of(flag)
        searched = self.config.search.get(self.job.name, {})
        if key is not None and key not in searched and key.replace("-", "_") in searched:
            key = key.replace("-", "_")  # `flags: {names: dashes}` wrote learning_rate as --learning-rate
        if key is not None and key not in searched:
            key = self.word_of(flag, searched) or key  # `hyperparams.learning_rate` set a word of --hyperparams
        if key is not None and key in searched:
            line = self.config.search_lines.get(f"{self.job.name}.{key}")
            return f"{label}:{line}: search.{self.job.name}.{key}" if line else f"{label}: search.{self.job.name}.{key}"
        if key is not None and key not in self.fixed:
            key = self.word_of(flag, self.fixed) or key
        if key is not None and key in self.fixed:
            return f"--set {key}"
        line = self.job.lines.get("args") or self.job.lines.get("job")
        return f"{label}:{line}: jobs.{self.job.name}" + (".args" if "args" in self.job.lines else "")


def usage_error(exit_code: object, log_tail: str, trial: int, sources: UsageSources, *,
                only_choices: bool = False) -> ConfigError | None:
    """The config error of a trial that exited 2 with argparse's `usage:` and `error:` lines, else None.
    `only_choices` (trials have run through already, so the flags themselves are fine): only a value of
    a searched `choices:` list that the job refuses (`invalid choice`), which later trials would draw
    again."""
    if exit_code != USAGE_EXIT:
        return None
    lines = [ln.strip() for ln in log_tail.splitlines()]
    errors = [m.group("what") for ln in lines if (m := _ERROR.match(ln))]
    if not errors or not any(ln.startswith("usage:") for ln in lines):
        return None
    what = errors[-1]
    if only_choices and not _refused_choice(what, sources):
        return None
    if what.startswith(_UNRECOGNIZED):
        flags = [w for w in what[len(_UNRECOGNIZED):].split() if w.startswith("-") or "=" in w]
        flag = flags[0] if flags else what[len(_UNRECOGNIZED):].split()[0]
        does = f"the job does not take {flag}"
        fix = "name a flag the job takes (its --help lists them), or add that flag to the job"
    elif m := _ARGUMENT.match(what):
        flag = m.group("flag")
        does = f"the job refused {flag}'s value"
        fix = "keep the searched values to what that flag takes (its type and choices)"
    else:
        return ConfigError(
            f"{config_label(sources.config.path)}: jobs.{sources.job.name}: trial {trial} exited {USAGE_EXIT} with a "
            f"usage error: {what}; stopping the study rather than running trials that fail the same way",
            "run the job's script with --help, and give it the arguments it needs (args:, search:)")
    style = flag_styles.refused_hint(sources.job, log_tail, gave_flags=True)
    return ConfigError(
        f"{sources.origin(flag)}: trial {trial} exited {USAGE_EXIT} with a usage error ({what}): {does}; "
        "stopping the study rather than running trials that fail the same way",
        f"{fix}; {style}" if style else fix)


def refused_early(exit_code: object, log_tail: str, trial: int, sources: UsageSources) -> ConfigError | None:
    """A first trial that died of its arguments some other way than argparse's (an AssertionError in a
    configurator like nanoGPT's, which takes only --key=value) before its first metrics: every trial
    gets its flags written the same way, so the study stops, naming the job's flag style."""
    style = flag_styles.refused_hint(sources.job, log_tail, gave_flags=True)
    if style is None:
        return None
    lines = [ln.strip() for ln in log_tail.splitlines() if ln.strip() and not ln.startswith("THRUST_")]
    last = f": {lines[-1][:200]}" if lines else ""
    return ConfigError(
        f"{config_label(sources.config.path)}: jobs.{sources.job.name}: trial {trial} died (exit code {exit_code}) "
        f"before its first metrics{last}; stopping the study rather than running trials that fail the same way",
        style)


def _refused_choice(what: str, sources: UsageSources) -> bool:
    """argparse's `argument --act: invalid choice: 'gelu'` for a key searched as `choices:`."""
    m = _ARGUMENT.match(what)
    if not m or "invalid choice" not in what:
        return False
    spec = sources.config.search.get(sources.job.name, {}).get(sources.key_of(m.group("flag")) or "")
    return isinstance(spec, Mapping) and "choices" in spec
