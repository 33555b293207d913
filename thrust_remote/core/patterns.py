"""A job's `metrics: {pattern:}`: the one engine that reads it (RE2), and what that engine refuses.

Here, in core/, so that thrust.yaml's reader refuses a pattern at its line and the follow (runs/progress.py)
compiles it with the same rules.
"""

from __future__ import annotations

import re
from typing import Any

# RE2 (google-re2) matches in time linear in the line: a job's pattern cannot backtrack for hours on one
# line. It takes Python's syntax but for what needs backtracking; RE2's own words for each are kept.
_UNSUPPORTED = (
    ("(?=", "lookahead (?=...)"), ("(?!", "negative lookahead (?!...)"), ("(?<=", "lookbehind (?<=...)"),
    ("(?<!", "negative lookbehind (?<!...)"), ("(?P=", "backreference (?P=name)"), ("(?>", "atomic group (?>...)"),
    ("(?(", "conditional group (?(...)...)"), ("(?x", "verbose flag (?x)"), ("\\Z", r"\Z (write \z or $)"),
)
_BACKREF = re.compile(r"invalid escape sequence: \\[1-9]")
_POSSESSIVE = re.compile(r"bad repetition operator: [*+?}]\+")
ENGINE = "RE2 (linear time, no backtracking)"
ENGINE_HINT = ("a metrics pattern is matched by RE2, which never backtracks: lookarounds, backreferences, "
               "atomic groups and possessive quantifiers are not taken; read the numbers with plain groups, "
               r"e.g. 'iter (?P<step>\d+): loss (?P<loss>[\d.]+)'")


def _re2() -> Any:
    import re2  # a job without a pattern never pays its import (~10 ms)

    return re2


def compile_pattern(text: str | bytes, *, block: bool = False) -> Any:
    re2 = _re2()
    options = re2.Options()
    options.log_errors = False  # its reason is our error's, not a line on stderr
    # a block of lines searched at once: `^`/`$` at each line, and no match across a newline, so the first
    # match of each line is the one a search of that line alone finds
    options.never_nl = block
    return re2.compile(text, options=options)


def check_pattern(text: str) -> str | None:
    """Why `text` cannot be a job's `metrics: {pattern:}`, else None: RE2 must take it (docs/architecture.md,
    "Job kinds") and it must name a group other than `step` for the numbers it reads. For
    core/config/job_values.py's check at the pattern's line, and runs/progress.py's LinePattern."""
    re2 = _re2()
    try:
        names = set(compile_pattern(text).groupindex)
    except re2.error as exc:
        said = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        # RE2 names some of them by its own words ("invalid perl operator: (?P"): the pattern's text tells
        what = next((name for token, name in _UNSUPPORTED if token in said or token in text), None)
        if what is None and _BACKREF.search(said):
            what = r"backreference (\1)"
        if what is None and _POSSESSIVE.search(said):
            what = "possessive quantifier (*+, ++, ?+)"
        if what is not None:
            return f"{what} is not supported by {ENGINE}"
        return f"not a regular expression ({said})"
    if not names - {"step"}:
        return ("expected named groups for the numbers to read, e.g. "
                r"'iter (?P<step>\d+): loss (?P<loss>[\d.]+)' (step alone is only the x axis)")
    return None
