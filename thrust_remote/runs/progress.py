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
from typing import TYPE_CHECKING, Any

from thrust_remote.core.errors import ConfigError
from thrust_remote.core.patterns import ENGINE_HINT, check_pattern, compile_pattern

if TYPE_CHECKING:
    from thrust_remote.core.config import MetricsConfig

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


# Of one log line: what is kept, shown and matched. A job may print a megabyte without a newline (a
# progress bar redrawn with \r, a dumped array): its head and its length are enough to show, and what
# a pattern reads is bounded with it.
LINE_MAX = 1 << 16
_TAGGED = re.compile(rb"^THRUST_(?:METRICS|INFO|DONE) ", re.MULTILINE)  # fixed, linear: no user input
class LinePattern:
    """A job's `metrics: {pattern:}`: each named group that matched a number is a metric (`step` an int).
    Matched by RE2 on a line's first LINE_MAX characters: linear time, whatever the pattern and the line.
    A pattern RE2 cannot take is a ConfigError (core/config/job_values.py refuses it at its line first)."""

    def __init__(self, pattern: str) -> None:
        why = check_pattern(pattern)
        if why is not None:
            raise ConfigError(f"metrics.pattern {pattern!r}: {why}", ENGINE_HINT)
        self.regex = compile_pattern(pattern)
        self.block = compile_pattern(pattern.encode(), block=True)
        # in the pattern's order (RE2 gives its groups by name): the numbers read as the job wrote them
        self.names = tuple(sorted(self.regex.groupindex, key=self.regex.groupindex.__getitem__))
        self.keys = tuple(dict.fromkeys(metric_name(n) for n in self.names))  # as the metrics object names them
        # \A and \z mean the text's ends: within a block of lines they would be the block's, so such a
        # pattern is searched line by line
        self.per_line = "\\A" in pattern or "\\z" in pattern

    def read(self, text: str) -> dict[str, Any] | None:
        """The numbers of a line the pattern matches (searched anywhere in its head), else None."""
        m = self.regex.search(text[:LINE_MAX])
        return self._numbers(m.groupdict()) if m is not None else None

    def read_block(self, data: bytes, limit: int = 256) -> dict[str, Any] | None:
        """What reading each whole line of `data` (UTF-8, each line ending in a newline and at most
        LINE_MAX long: LineSplitter's blocks) and merging the numbers in order gives: each name's number
        from the last line that gave one. Found from the end, at most `limit` matching lines read (a
        name missing from all of them is a name the job no longer prints), each line's first match."""
        if self.per_line:
            found = [self.read(line) for line in data.decode("utf-8", "replace").splitlines()]
            merged: dict[str, Any] = {}
            for one in found:
                merged.update(one or {})
            return merged or None
        out: dict[str, Any] = {}
        end, taken = len(data), 0
        while end > 0 and taken < limit and len(out) < len(self.keys):
            start = data.rfind(b"\n", 0, max(0, end - 8192)) + 1  # a segment of whole lines, the last first
            if self.block.search(data, start, end) is not None:
                for found in reversed(self._firsts(data, start, end)):
                    for name, value in found.items():
                        out.setdefault(name, value)
                    taken += 1
            end = start
        return {key: out[key] for key in self.keys if key in out} or None

    def _firsts(self, data: bytes, start: int, end: int) -> list[dict[str, Any]]:
        """The numbers of each line's first match between `start` and `end` (line starts), in order."""
        out, line_end = [], -1
        for m in self.block.finditer(data, start, end):
            if m.start() <= line_end:
                continue  # a second match on one line: a search of the line stops at its first
            line_end = data.find(b"\n", m.start())
            numbers = self._numbers(m.groupdict())
            if numbers:
                out.append(numbers)
        return out

    def _numbers(self, groups: Mapping[Any, Any]) -> dict[str, Any] | None:
        """Each named group's number, in the pattern's order (a block's groups are named by bytes)."""
        if groups and isinstance(next(iter(groups)), bytes):
            groups = {key.decode(): value for key, value in groups.items()}
        out: dict[str, Any] = {}
        for name in self.names:
            number = _number(groups.get(name))
            if number is not None:
                key = metric_name(name)
                out[key] = int(number) if key in COUNTS else number
        return out or None


# A pattern's group for the run's length: `total` (or `total_steps`, the trainer's name) is the total the
# progress line draws its bar, % and ETA against, e.g. `(?P<step>\d+)/(?P<total>\d+)` for "1200/50000".
TOTAL_GROUPS = ("total", "total_steps")
COUNTS = ("step", "total_steps")  # read as ints: "step 1,200/50,000", never "1.2e+03"


def metric_name(group: str) -> str:
    """The metrics object's key for a pattern's named group: a total is `total_steps`, as THRUST_METRICS
    says it (docs/architecture.md, "JSON shapes"), the others their own names."""
    return "total_steps" if group in TOTAL_GROUPS else group


def _number(text: str | bytes | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def pattern_of(metrics: MetricsConfig | None) -> LinePattern | None:
    """The job's `metrics:` pattern, if it has one (a job's `metrics` section, or None: no job)."""
    text = metrics.pattern if metrics is not None else None
    return LinePattern(text) if text else None


def last_metrics(text: str, pattern: LinePattern | None = None) -> dict[str, Any]:
    """The metrics a log's text ends with (its THRUST_METRICS lines and pattern matches, merged in order)."""
    progress = RunProgress(pattern)
    lines = LineSplitter()
    progress.take_block(lines.feed_block(text.encode("utf-8", "surrogateescape")))
    progress.take_block(lines.close_block())
    return progress.metrics


def _cut(line: bytes, length: int) -> bytes:
    """An over-long line's head and what it was (LINE_MAX; the rest is in the host's log)."""
    return line[:LINE_MAX] + f" [… a line of {length:,} bytes: its first {LINE_MAX:,} shown]".encode()


class LineSplitter:
    """Raw log bytes in, whole lines out; a line split across chunks (or a UTF-8 character split across
    them) is joined before it is decoded. A line longer than LINE_MAX is kept to its head and its length:
    one enormous line (a gigabyte without a newline) costs no more than a short one."""

    def __init__(self) -> None:
        self.pending = b""  # the line in progress: its first LINE_MAX bytes at most
        self.length = 0  # and how long it is so far

    def feed_block(self, chunk: bytes) -> bytes:
        """The whole lines completed by `chunk`, each ending in a newline, over-long ones cut."""
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self._grow(chunk)
            return b""
        first = chunk.find(b"\n")
        head = self._grown(chunk[:first])  # the line in progress, now whole
        rest, tail = chunk[first + 1:cut + 1], chunk[cut + 1:]
        self.pending, self.length = b"", 0
        self._grow(tail)
        return head + b"\n" + (_cut_long(rest) if len(rest) > LINE_MAX else rest)

    def close_block(self) -> bytes:
        """The last line when the log does not end with a newline (with one added)."""
        if not self.length:
            return b""
        line = self._grown(b"")
        self.pending, self.length = b"", 0
        return line + b"\n"

    def feed(self, chunk: bytes) -> list[str]:
        return _decoded(self.feed_block(chunk))

    def close(self) -> list[str]:
        """The last line when the log does not end with a newline."""
        return _decoded(self.close_block())

    def _grow(self, data: bytes) -> None:
        if len(self.pending) < LINE_MAX:
            self.pending += data[:LINE_MAX - len(self.pending)]
        self.length += len(data)

    def _grown(self, data: bytes) -> bytes:
        self._grow(data)
        return self.pending if self.length <= LINE_MAX else _cut(self.pending, self.length)


def _cut_long(block: bytes) -> bytes:
    """`block` (whole lines) with every line longer than LINE_MAX cut: a window of LINE_MAX + 1 bytes holds
    a newline unless its first line is too long, so this looks at one window per LINE_MAX bytes."""
    out: list[bytes] = []
    pos = kept = 0  # `kept`: where the block is still to be copied from (no copy at all without a cut)
    while pos < len(block):
        nl = block.rfind(b"\n", pos, pos + LINE_MAX + 1)
        if nl >= 0:
            pos = nl + 1
            continue
        nl = block.find(b"\n", pos)
        out += [block[kept:pos], _cut(block[pos:nl], nl - pos) + b"\n"]
        pos = kept = nl + 1
    return b"".join([*out, block[kept:]]) if out else block


def _decoded(block: bytes) -> list[str]:
    return [line.rstrip("\r") for line in block.decode("utf-8", "replace").split("\n")[:-1]]


# Lightning's TensorBoardLogger logs `hp_metric` = -1 at every step when the job logs no hparams metric
# of its own (its default_hp_metric): a placeholder, no number of the run, yet sorted among the first of
# its tags it took a place on every line. Only that exact name at exactly -1, while it has been -1 at
# every step seen, is left out: not a filter of metrics in general, and a job that sets it is shown.
PLACEHOLDER = ("hp_metric", -1)


def placeholder(m: Mapping[str, Any], objective: str | None = None) -> bool:
    """Whether `m` holds Lightning's placeholder `hp_metric` at -1 (and it is not the job's objective)."""
    name, value = PLACEHOLDER
    return objective != name and name in m and m[name] == value and not isinstance(m[name], bool)


def without_placeholder(m: Mapping[str, Any], objective: str | None = None) -> dict[str, Any]:
    """`m` less Lightning's placeholder `hp_metric` at -1 (see PLACEHOLDER): what a line shows of it."""
    return {k: v for k, v in m.items() if k != PLACEHOLDER[0]} if placeholder(m, objective) else dict(m)


class RunProgress:
    """The latest THRUST_METRICS object, the run's THRUST_INFO facts and its THRUST_DONE summary."""

    def __init__(self, pattern: LinePattern | None = None) -> None:
        self.pattern = pattern
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # the log's last lines: why a job died, at its end
        self.metrics: dict[str, Any] = {}
        self.info: dict[str, Any] = {}
        self.done: dict[str, Any] = {}
        self.updates = 0  # metrics lines taken: a view redraws when this moves
        self.matched: dict[str, Any] | None = None  # what the pattern read of the last block (take_block)
        self.placeholder_moved = False  # Lightning's hp_metric was seen other than -1 (PLACEHOLDER)

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
            self._seen(obj)
        elif tag == "THRUST_INFO":
            self.info.update(obj)
        else:
            self.done = obj
        return True

    def take_block(self, data: bytes, *, shown: bool = True) -> str:
        """Take a block of whole lines (LineSplitter.feed_block); the text of those to show (`shown`: else
        "", for a reader that keeps only the facts). The same as `take` line by line, in C-speed steps: a
        job that prints a million lines a second is followed at its pace. Only the trainer's tagged lines
        are read one by one (a few a second)."""
        self.matched = None
        if b"THRUST_" not in data:
            return self._plain(data, shown)
        parts, pos = [], 0
        for m in _TAGGED.finditer(data):
            parts.append(self._plain(data[pos:m.start()], shown))
            pos = data.find(b"\n", m.start()) + 1
            self.take(data[m.start():pos - 1].decode("utf-8", "replace").rstrip("\r"))
        parts.append(self._plain(data[pos:], shown))
        return "".join(parts)

    def _plain(self, data: bytes, shown: bool) -> str:
        """Whole lines none of which is a tagged one: the pattern's numbers taken, the tail kept."""
        if not data:
            return ""
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")  # a line's own `\r` before its newline, as `take` drops it
        found = self.pattern.read_block(data) if self.pattern is not None else None
        if found:
            self.take_metrics(found)
            self.matched = {**(self.matched or {}), **found}
        last = data.rsplit(b"\n", TAIL_LINES + 1)[-(TAIL_LINES + 1):-1]
        self.tail.extend(line.decode("utf-8", "replace") for line in last)
        return data.decode("utf-8", "replace") if shown else ""

    def take_metrics(self, obj: dict[str, Any]) -> None:
        """A metrics object from elsewhere than the log (TensorBoard scalars read on the host): merged
        over the last one, so a job that also prints THRUST_METRICS lines keeps both."""
        self.metrics = {**self.metrics, **obj}
        self.updates += 1
        self._seen(obj)

    def _seen(self, obj: Mapping[str, Any]) -> None:
        if PLACEHOLDER[0] in obj and not placeholder(obj):
            self.placeholder_moved = True

    def shown(self, objective: str | None = None) -> dict[str, Any]:
        """The last metrics as a line shows them: Lightning's placeholder `hp_metric` left out while it
        has been -1 at every step seen (PLACEHOLDER)."""
        return dict(self.metrics) if self.placeholder_moved else without_placeholder(self.metrics, objective)

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
