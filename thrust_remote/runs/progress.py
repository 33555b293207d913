"""A run's progress, read from its log: the trainer's `TAG {json}` lines (docs/architecture.md,
"JSON shapes": THRUST_METRICS / THRUST_INFO / THRUST_DONE) split out of raw log bytes, and a job's own
lines read with its `metrics: {pattern:}` (named groups; `step` the x of the series).

Library code: it parses and keeps state, it never prints. The pipeline keeps one to report the last
metrics of a followed run (`train --json`); the CLI's follow view keeps one to draw its progress line.
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

TAIL_LINES = 40
TAGS = ("THRUST_METRICS", "THRUST_INFO", "THRUST_DONE")
# what the built-in trainer's progress line shows by name; a job of your own has its own names
TRAINER_SHOWN = frozenset({"step", "total_steps", "sps", "return_mean", "score_mean", "gpu_util"})


def own_metrics(m: dict[str, Any], limit: int = 3) -> list[tuple[str, float]]:
    """A job of your own's THRUST_METRICS object (no return_mean / score_mean): its first `limit`
    numeric metrics in the order it wrote them, for the progress line (docs/architecture.md,
    "JSON shapes": THRUST_METRICS). The trainer's object gives none: its line is laid out by name."""
    if m.get("return_mean") is not None or m.get("score_mean") is not None:
        return []
    out = [(k, float(v)) for k, v in m.items()
           if k not in TRAINER_SHOWN and isinstance(v, int | float) and not isinstance(v, bool)]
    return out[:limit]


def parse_tagged(text: str) -> tuple[str | None, dict[str, Any] | None]:
    """(tag, object) for a `TAG {json}` line; (tag, None) when its JSON is junk; (None, None) otherwise."""
    tag, sep, rest = text.partition(" ")
    if not sep or tag not in TAGS:
        return None, None
    try:
        obj = json.loads(rest)
    except ValueError:
        return tag, None
    return tag, obj if isinstance(obj, dict) else None


class LinePattern:
    """A job's `metrics: {pattern:}`: each named group that matched a number is a metric (`step` an int)."""

    def __init__(self, pattern: str) -> None:
        self.regex = re.compile(pattern)

    def read(self, text: str) -> dict[str, Any] | None:
        """The numbers of a line the pattern matches (searched anywhere in it), else None."""
        m = self.regex.search(text)
        if m is None:
            return None
        out: dict[str, Any] = {}
        for name, value in m.groupdict().items():
            number = _number(value)
            if number is not None:
                out[name] = int(number) if name == "step" else number
        return out or None


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def pattern_of(metrics: Mapping[str, str] | None) -> LinePattern | None:
    """The job's `metrics:` pattern, if it has one (a job's `metrics` mapping, or None)."""
    text = metrics.get("pattern") if metrics else None
    return LinePattern(text) if text else None


def last_metrics(text: str, pattern: LinePattern | None = None) -> dict[str, Any]:
    """The metrics a log's text ends with (its THRUST_METRICS lines and pattern matches, merged in order)."""
    progress = RunProgress(pattern)
    for line in text.splitlines():
        progress.take(line)
    return progress.metrics


class LineSplitter:
    """Raw log bytes in, whole decoded lines out; a line split across chunks (or a UTF-8 character
    split across them) is joined before it is decoded."""

    def __init__(self) -> None:
        self.pending = b""

    def feed(self, chunk: bytes) -> list[str]:
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        return [line.decode("utf-8", "replace").rstrip("\r") for line in lines]

    def close(self) -> list[str]:
        """The last line when the log does not end with a newline."""
        rest, self.pending = self.pending, b""
        return [rest.decode("utf-8", "replace").rstrip("\r")] if rest else []


class RunProgress:
    """The latest THRUST_METRICS object, the run's THRUST_INFO facts and its THRUST_DONE summary."""

    def __init__(self, pattern: LinePattern | None = None) -> None:
        self.pattern = pattern
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # the log's last lines: why a job died, at its end
        self.metrics: dict[str, Any] = {}
        self.info: dict[str, Any] = {}
        self.done: dict[str, Any] = {}
        self.updates = 0  # metrics lines taken: a view redraws when this moves

    def take(self, text: str) -> bool:
        """Take one log line; True when it was one of the trainer's tagged lines (shown or not). A line
        the job's pattern matches is taken as metrics and still shown (it is the job's own text)."""
        tag, obj = parse_tagged(text)
        if tag is None:
            self.tail.append(text)
            found = self.pattern.read(text) if self.pattern is not None else None
            if found:  # merged: a job may print its train and its eval numbers on different lines
                self.take_metrics(found)
            return False
        if obj is None:
            return True  # a tagged line with broken JSON: never shown raw, never fatal
        if tag == "THRUST_METRICS":
            self.metrics = obj
            self.updates += 1
        elif tag == "THRUST_INFO":
            self.info.update(obj)
        else:
            self.done = obj
        return True

    def take_metrics(self, obj: dict[str, Any]) -> None:
        """A metrics object from elsewhere than the log (TensorBoard scalars read on the host): merged
        over the last one, so a job that also prints THRUST_METRICS lines keeps both."""
        self.metrics = {**self.metrics, **obj}
        self.updates += 1

    def summary(self) -> dict[str, Any]:
        """What `train --json` reports of the run's training: steps, score, returns, solved."""
        m, d = self.metrics, self.done
        score = m.get("score_mean")
        ret = d.get("return_mean", m.get("return_mean"))
        return {
            "steps": d.get("step", m.get("step")),
            "total_steps": d.get("total_steps", m.get("total_steps")),
            # snake's score is apples; an env without a score of its own is scored by its return
            "score": score if score is not None else ret,
            "return_mean": ret,
            "eval_return": d.get("eval_return"),
            "solved": d.get("solved"),
            "train_wall_s": d.get("wall_s"),
            # the last metrics as the job named them (a job of your own: its THRUST_METRICS keys or its
            # TensorBoard tags, e.g. charts/episodic_return, which no field above stands for)
            "metrics": dict(m),
        }
