"""Following a run's log at the CLI edge: one progress line, laid out for the width it has.

Three ways to show a followed log (the log's own text lines always pass through; the trainer's
`THRUST_*` JSON lines never reach the screen):
- `live` (a terminal): a progress line redrawn in place (bar, %, steps, score, eta, sps...), fields
  dropped least important first so it fits the terminal's width and the bar stays;
- `lines` (a pipe, a file, CI): the same facts as one plain line every `interval` seconds and at the end;
- `raw` (`logs -f --raw`): the log's bytes exactly, for a transcript equal to the host's log.

The following itself (Ctrl-C detaches, a lost link ends with exit 75, both with the command that
reattaches from the byte offset reached) is following.follow; this module only renders what it reports.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.control import strip_control_codes
from rich.live import Live
from rich.segment import Segment
from rich.text import Text

from thrust_remote.core.console import console, err_console, host_text
from thrust_remote.run import vocab
from thrust_remote.run.following import reattach_command
from thrust_remote.run.vocab import exit_code_for
from thrust_remote.runs.progress import LineSplitter, RunProgress, own_metrics
from thrust_remote.runs.pull import Pulled

__all__ = ["LogReporter", "LogView", "duration", "exit_code_for", "progress_line", "reattach_command", "say"]

MIN_BAR, COMFY_BAR, MAX_BAR = 10, 20, 40
FILLED, EMPTY = "━", "─"


# ------------------------------------------------------------------------------------------ layout

def _si(n: float) -> str:
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def run_time(seconds: float) -> str:
    """47.2 s: a run's time at its end, as its end line (`done in 47.2 s`) and its final drawing say it,
    one figure rounded one way, so the two never disagree."""
    return f"{seconds:.1f} s"


def duration(seconds: float) -> str:
    """12s, 3m05s, 2h01m: how long, as the progress line and `wait` say it."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


OTHERS_PIPED, OTHERS_LIVE = 3, 8  # a job's own metrics beside its objective: a plain line's few; what fits


# the metrics the line lays out by a name of its own (the built-in trainer's): an objective among them
# keeps its own place and name (`return 2.50`), never shown twice
LAID_OUT = ("step", "total_steps", "return_mean", "score_mean", "sps", "gpu_util")


def _objective(m: Mapping[str, Any], objective: str | None) -> list[list[str]]:
    """The job's objective (`objective: {metric:}`) as the line's first field, its whole name in both
    forms (`val/acc` and `train/acc` are told apart by it); none while the metrics lack it."""
    value = m.get(objective) if objective and objective not in LAID_OUT else None
    if not isinstance(value, int | float) or isinstance(value, bool):
        return []
    return [[f"{objective} {value:.4g}", f"{objective} {value:.3g}"]]


def _fields(m: Mapping[str, Any], elapsed: float | None, pulled: float | None = None,
            eta: float | None = None, objective: str | None = None,
            others: int = OTHERS_PIPED, final: bool = False) -> tuple[str, list[list[str]]]:
    """(the % field, the optional fields most important first, each as its variants widest first); `eta`:
    seconds left as the view measured the steps' pace, for metrics without their own `sps`; `objective`:
    the metric that leads (the job's `objective: {metric:}`), then steps and the rest, `others` of a job's
    own metrics at most."""
    step, total = m.get("step") or 0, m.get("total_steps")
    pct = f"{min(100.0, 100.0 * step / total):3.0f}%" if total else ""
    alone = f"{step:,} step{'' if step == 1 else 's'}"
    steps = [f"{step:,}/{total:,} steps", f"{_si(step)}/{_si(total)}"] if total else [alone, _si(step)]
    optional = [*_objective(m, objective), steps]
    ret = [f"return {m['return_mean']:.2f}", f"ret {m['return_mean']:.1f}"] if m.get("return_mean") is not None else []
    if m.get("score_mean") is not None:  # an env's own score (snake: apples) before its return
        optional.append([f"score {m['score_mean']:.2f}"])
    elif ret:
        optional.append(ret)
    sps = m.get("sps")
    if sps and total and total > step and not final:  # an ended run's time is spent: no eta on its last line
        optional.append([f"eta {duration((total - step) / sps)}"])
    elif eta is not None and total and total > step:
        optional.append([f"eta {duration(eta)}"])
    if sps is not None:
        optional.append([f"{sps:,.0f} sps", f"{_si(sps)} sps"])
    if ret and m.get("score_mean") is not None:
        optional.append(ret)
    shown = {k: v for k, v in m.items() if k != objective}
    for name, value in own_metrics(shown, others):  # a job of your own: its first numeric metrics, by name
        optional.append([f"{name} {value:.4g}", f"{name.rsplit('/', 1)[-1]} {value:.3g}"])
    if m.get("gpu_util") is not None:
        optional.append([f"GPU {m['gpu_util']:.0f}%"])
    if elapsed is not None:
        optional.append([f"elapsed {duration(elapsed)}"])
    if pulled is not None:  # the last pull of its checkpoint (runs/pull.py): how old the copy here is
        optional.append([f"pulled {duration(pulled)} ago", f"pulled {duration(pulled)}"])
    return pct, optional


WAITING = "running, no metrics yet"
IDLE_EVERY_S = 30.0  # piped, a run without metrics: how often a line says it still goes
# A run whose log has not grown and whose metrics have not moved for this long is said to be maybe stuck.
# Ten minutes: a job's slow stretches that print nothing (the first CUDA compile, a dataset download, a
# long eval or checkpoint save) take minutes, and a warning then would teach people to ignore it; a job
# hung on a rendezvous (its own workers, under torchrun on one port) says nothing ever again, and ten
# minutes is well before a person gives up and looks.
STUCK_AFTER_S = 600.0


def stuck_line(quiet: float, logs: str, width: int | None = None) -> str:
    """The live line of a run quiet for `quiet` s: what it may be and the command that shows its log."""
    forms = [f"no log or metrics for {duration(quiet)} — the job may be stuck; {logs}",
             f"no log or metrics for {duration(quiet)}: stuck? {logs}",
             f"no log/metrics for {duration(quiet)}: stuck?"]
    return forms[0] if width is None else next((f for f in forms if len(f) <= width), forms[-1][:width])


def _layout(m: Mapping[str, Any], width: int | None, elapsed: float | None, bar: bool,
            waiting: str = WAITING, pulled: float | None = None, eta: float | None = None,
            objective: str | None = None, final: bool = False) -> tuple[str, int]:
    """(the line, how many of its first characters are the bar's filled part); `waiting` while no metrics;
    `pulled`: seconds since the last pull of the run's checkpoint; `eta`, `objective`: as _fields takes
    them. The objective is kept at every width: narrower than a bar beside it, the line is % and it.
    `final`: the drawing after the run ended, whose time (`elapsed`, the run's own at its end) ends it at
    every width, as its end line says it: other fields are dropped before it."""
    if not m:
        text = waiting
        return (text if width is None else text[:width]), 0
    pinned = final and elapsed is not None
    pct, optional = _fields(m, None if pinned else elapsed, pulled, eta, objective,
                            OTHERS_PIPED if width is None else OTHERS_LIVE, final)
    tail = [f"elapsed {run_time(elapsed)}", run_time(elapsed)] if pinned and elapsed is not None else []
    if tail and width is not None:  # the time first, the rest in what is left of the width
        room = width - len(tail[0]) - 2
        line, filled = _layout(m, room, None, bar, waiting, pulled, None, objective, True) if room > 0 else ("", 0)
        if line:
            return f"{line}  {tail[0]}", filled
        return (tail[0] if len(tail[0]) <= width else tail[1][:width]), 0
    lead = optional[0] if _objective(m, objective) else None
    step, total = m.get("step") or 0, m.get("total_steps")
    if not total and width is not None:
        # no total, no progress to draw: the bar would be all empty, taking the metrics' room
        return _fitted([v[0] for v in optional], [v[-1] for v in optional], width), 0
    if not bar or width is None:
        return "  ".join(([pct.strip()] if pct else []) + [v[0] for v in optional] + tail[:1]), 0
    # first every field in its wide form beside a comfortable bar, dropping the least important; when
    # not even steps and the score fit so, the narrow forms beside a shorter bar (docs/architecture.md)
    for variant, min_bar, min_keep in ((0, COMFY_BAR, min(2, len(optional))), (1, MIN_BAR, int(lead is not None))):
        for keep in range(len(optional), min_keep - 1, -1):
            parts = ([pct] if pct else []) + [f[min(variant, len(f) - 1)] for f in optional[:keep]]
            text = "  ".join(parts)
            room = width - len(text) - 1
            if room >= min_bar:
                n = min(room, MAX_BAR)
                filled = int(n * min(1.0, step / total)) if total else 0
                return f"{FILLED * filled}{EMPTY * (n - filled)} {text}", filled
    if lead is not None:  # no room for a bar beside the objective: the objective, not the bar
        forms = [f"{pct.strip()} {lead[0]}", f"{pct.strip()} {lead[-1]}", lead[0], lead[-1]]
        return next((f for f in forms if len(f) <= width), forms[-1][:width]), 0
    n = max(0, width - len(pct) - 1)  # narrower than a bar and its %: what fits of them
    filled = int(n * min(1.0, step / total)) if total else 0
    return f"{FILLED * filled}{EMPTY * (n - filled)} {pct}"[:width], min(filled, width)


def _fitted(wide: list[str], narrow: list[str], width: int) -> str:
    """The most fields that fit in `width`, wide forms first, then narrow ones; from the end dropped."""
    for forms in (wide, narrow):
        for keep in range(len(forms), 0, -1):
            text = "  ".join(forms[:keep])
            if len(text) <= width:
                return text
    return (narrow[0] if narrow else "")[:width]


def progress_line(m: Mapping[str, Any], width: int | None = None, *, elapsed: float | None = None,
                  bar: bool = True, objective: str | None = None) -> str:
    """One progress line from a THRUST_METRICS object, at most `width` characters: a bar (kept, 10-40
    wide), %, the job's `objective` metric, steps, score (else return), eta, sps, return, a job's own
    metrics, GPU, elapsed. What does not fit is dropped from the end, wide forms first, then narrow forms
    beside a shorter bar. `width=None` or `bar=False`: every field, no bar (the plain `lines` mode)."""
    return _layout(m, width, elapsed, bar, objective=objective)[0]


# ------------------------------------------------------------------------------------------ the view

class _LiveLine:
    """The redrawn line: laid out at render time, so it follows the terminal's width."""

    def __init__(self, view: LogView) -> None:
        self.view = view

    def __rich_console__(self, _console: Console, options: ConsoleOptions) -> RenderResult:
        view = self.view
        if view.closed and not view.progress.metrics:
            unmatched = view.unmatched()  # a pattern that read nothing: said to the end, the rest not left
            if unmatched:
                yield Text(unmatched, style="yellow", no_wrap=True, overflow="crop")
            return
        quiet = None if view.closed else view.stuck_for()
        if quiet is not None:
            yield Text(stuck_line(quiet, view.logs_hint, options.max_width), style="yellow", no_wrap=True,
                       overflow="crop")
            return
        line, filled = _layout(view.progress.shown(view.objective), options.max_width, view.elapsed(), True,
                               view.waiting_line(), view.pulled_ago(), view.eta(), view.objective, view.closed)
        text = Text(line, no_wrap=True, overflow="crop")
        text.stylize("cyan", 0, filled)
        yield text


class _Shown:
    """Text written as it is: one segment, no markup, highlighting, wrapping or cropping to lay out."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __rich_console__(self, _console: Console, _options: ConsoleOptions) -> RenderResult:
        yield Segment(self.text)


class _Writer:
    """The view's log text and progress lines, written in order by a thread of its own: a terminal takes
    a few tens of MB/s at most, and while it writes, the next chunk is read and parsed. A write that
    fails (a pipe whose reader left) is raised in the follow's thread at its next put, or at close."""

    def __init__(self) -> None:
        self.queue: queue.Queue[Callable[[], object] | None] = queue.Queue(maxsize=4)  # ~4 MiB of log at most
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self.thread.start()

    def put(self, write: Callable[[], object]) -> None:
        self._raise()
        self.queue.put(write)

    def close(self) -> None:
        """Every write done (a Ctrl-C meanwhile still waits for them: the terminal shows what was read)."""
        if self.thread.is_alive():
            self.queue.put(None)
            self.thread.join()
        self._raise()

    def _raise(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error

    def _run(self) -> None:
        while (write := self.queue.get()) is not None:
            if self.error is None:  # after a failed write, the rest is dropped: nobody reads it
                try:
                    write()
                except BaseException as exc:  # noqa: BLE001 - handed to the follow's thread
                    self.error = exc


class LogView:
    """Consumes log bytes and shows them in one of the three modes (see the module's docstring)."""

    def __init__(self, run_id: str, mode: str = "lines", *, out: Console | None = None,
                 clock: Callable[[], float] = time.monotonic, interval: float = 5.0, queued: str | None = None,
                 stuck_after: float | None = None, logs_hint: str | None = None, objective: str | None = None,
                 pattern: bool = False) -> None:
        if mode not in ("live", "lines", "raw"):
            raise ValueError(f"mode {mode!r}")
        self.run_id, self.mode, self.out = run_id, mode, out or console
        self.clock, self.interval = clock, interval
        self.started = clock()
        self.lines, self.progress = LineSplitter(), RunProgress()
        self.offset = 0  # bytes consumed: where a reattach continues
        self.live: Live | None = None
        self.printed_at: float | None = None  # when the last plain progress line was printed
        self.printed_updates = 0
        self.closed = False  # the run ended: the live line's last drawing stays on screen
        self.wall: tuple[float, float] | None = None  # (the run's own wall_s, our clock when it came)
        self.lock = threading.Lock()  # log bytes and scalars (ScalarWatch's thread) both update it
        # what the live line says before any metrics: where the run waits while it is queued, until its
        # log's first bytes say it started (and its elapsed time starts then)
        self.waiting = queued or WAITING
        self.pulled_at: float | None = None  # when the run's checkpoint was last pulled (runs/pull.py)
        self.grew_at: float | None = None  # when the log last grew: a run without metrics is not hung
        self.ticking = threading.Event()  # set: the piped view's idle line stops
        self.writer: _Writer | None = None  # the log text's writer, from __enter__ to __exit__
        self.stuck_after = STUCK_AFTER_S if stuck_after is None else stuck_after
        self.logs_hint = logs_hint or f"thrust-remote logs {run_id}"  # what a quiet run's line says to type
        self.moved_at = self.started  # when the log last grew or the metrics last moved
        self.stuck_said: float | None = None  # piped: when the quiet run's line was last printed
        self.pace: tuple[int, float] | None = None  # (the first step seen, our clock then): the steps' pace
        self.objective = objective  # the job's `objective: {metric:}`: the line's first metric
        self.pattern = pattern  # the job reads its metrics with a `metrics: {pattern:}`
        self.lines_seen = 0  # the log's lines so far: what a pattern that matched none of them was tried on
        self.ended_at: float | None = None  # our clock when the run ended: its last line's elapsed
        # the run's own time at its end (its status's wall time, as the end line says it), when told:
        # our clock stops a poll or more after the run did
        self.ran: float | None = None

    def stuck_for(self) -> float | None:
        """How long the run has been quiet (no log, no metrics), once past `stuck_after`; else None. A
        queued run is not quiet: it waits, and its line says where."""
        quiet = self.clock() - self.moved_at
        return quiet if quiet >= self.stuck_after and self.waiting == WAITING else None

    def eta(self) -> float | None:
        """Seconds left at the pace the steps went since the first seen, for metrics that have a total
        but no `sps` of their own (a job's `metrics: {pattern:}` with a `total` group)."""
        m = self.progress.metrics
        step, total = m.get("step"), m.get("total_steps")
        if self.pace is None or self.closed or m.get("sps") or not isinstance(step, int) or not total:
            return None
        first, at = self.pace
        spent = self.clock() - at
        return (total - step) * spent / (step - first) if step > first and spent > 0 else None

    def _moved(self) -> None:
        """The run showed a sign of life: new log bytes or metrics; the steps' pace starts at the first."""
        self.moved_at = self.clock()
        step = self.progress.metrics.get("step")
        if self.pace is None and isinstance(step, int):
            self.pace = (step, self.clock())

    def waiting_line(self) -> str:
        """What the line says before any metrics: where a queued run waits; else that the run goes, how
        long it has, and how long ago its log last grew (so a job without metrics does not look hung); a
        pattern that matched none of the job's lines says so first (what a narrow terminal keeps)."""
        if self.waiting != WAITING:
            return self.waiting
        grew = "no log yet" if self.grew_at is None else f"log grew {duration(self.clock() - self.grew_at)} ago"
        return f"{self.unmatched() or WAITING}  elapsed {duration(self.elapsed())}  {grew}"

    def unmatched(self) -> str | None:
        """The job's metrics pattern has read nothing of the lines it printed: said on the line, so a
        progress bar that prints nothing in a pipe (Rich's) or a pattern that misses is seen at once."""
        if not self.pattern or self.progress.metrics or not self.lines_seen:
            return None
        return f"metrics pattern matched none of {self.lines_seen:,} line{'' if self.lines_seen == 1 else 's'}"

    def tick(self) -> None:
        """Piped, a run without metrics: its idle line, at most every IDLE_EVERY_S; a quiet run (stuck_for)
        its line, once each `stuck_after`."""
        with self.lock:
            stuck = self.stuck_for() if self.mode == "lines" else None
            if stuck is not None and (self.stuck_said is None or self.clock() - self.stuck_said >= self.stuck_after):
                self.stuck_said = self.clock()
                self.out.print(f"{self.run_id}: {stuck_line(stuck, self.logs_hint)}", markup=False, highlight=False,
                               emoji=False, soft_wrap=True)
                return
            quiet = self.printed_at is None or self.clock() - self.printed_at >= IDLE_EVERY_S
            if self.mode == "lines" and not self.progress.metrics and quiet and self.waiting == WAITING:
                self.printed_at = self.clock()
                self.out.print(f"{self.run_id}: {self.waiting_line()}", markup=False, highlight=False, emoji=False,
                               soft_wrap=True)

    def _ticker(self) -> None:
        while not self.ticking.wait(IDLE_EVERY_S):
            self.tick()

    @property
    def last(self) -> dict[str, Any]:
        return self.progress.metrics

    def pulled_ago(self) -> float | None:
        return None if self.pulled_at is None else self.clock() - self.pulled_at

    def take_pull(self, pulled: Pulled) -> None:
        """A pull of the run's checkpoint (another thread): its age on the live line; in the plain mode a
        line of its own when something came; nothing in the log's raw bytes."""
        with self.lock:
            self.pulled_at = self.clock()
            if self.mode == "lines" and pulled.files:
                self.out.print(f"{self.run_id}: {pulled.text()}", markup=False, highlight=False, emoji=False,
                               soft_wrap=True)

    def elapsed(self) -> float:
        """The run's time: its own `wall_s` (the trainer's, since its start) carried on by our clock, so a
        reattach shows how long the run has gone, not how long we have watched; else since we began. Once
        the run ended, its time at the end: the last line stays as it was then."""
        if self.ended_at is not None and self.ran is not None:
            return self.ran
        now = self.clock() if self.ended_at is None else self.ended_at
        if self.wall is not None:
            return self.wall[0] + now - self.wall[1]
        return now - self.started

    def __enter__(self) -> LogView:
        self.writer = _Writer() if self.mode != "raw" else None
        if self.mode == "live":
            self.live = Live(_LiveLine(self), console=self.out, refresh_per_second=4, transient=False)
            self.live.start()
        elif self.mode == "lines":
            threading.Thread(target=self._ticker, name="idle-line", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.ticking.set()
        self._block(self.lines.close_block())
        writer, self.writer = self.writer, None
        try:
            if writer is not None:
                writer.close()
        finally:
            self._end()

    def _end(self) -> None:
        with self.lock:  # a last read of the scalars may still be handed over: the line drawn after it
            self.closed, self.ended_at = True, self.clock()
        if self.live is not None:
            self.live.refresh()  # the run's last metrics, no eta, no quiet-run warning: final
            self.live.stop()
            self.live = None
        if self.mode == "lines" and self.progress.updates > self.printed_updates:
            self._print_progress()  # the end: the last metrics, whatever the interval
        elif self.mode == "lines" and self.unmatched():
            self.out.print(f"{self.run_id}: {self.unmatched()}", markup=False, highlight=False, emoji=False,
                           soft_wrap=True)

    def feed(self, chunk: bytes) -> None:
        with self.lock:
            self._feed(chunk)

    def take_metrics(self, obj: dict[str, Any]) -> None:
        """Metrics from elsewhere than the log (a job's TensorBoard scalars): shown like its lines'."""
        with self.lock:
            self.progress.take_metrics(obj)
            self._moved()
            if self.mode == "lines" and self._due():  # a pattern's lines may come many a second
                self._print_progress()

    def _feed(self, chunk: bytes) -> None:
        if chunk and self.waiting != WAITING:  # the queued run started: its log has begun
            self.waiting, self.started = WAITING, self.clock()
        if chunk:
            self.grew_at = self.clock()
        self.offset += len(chunk)
        if self.mode == "raw":
            sys.stdout.buffer.write(chunk)  # byte for byte: a transcript equals the host's log
            sys.stdout.buffer.flush()
        self._block(self.lines.feed_block(chunk))
        if chunk:
            self._moved()
        if self.mode == "lines" and self.progress.updates > self.printed_updates and self._due():
            self._print_progress()

    def _due(self) -> bool:
        return self.printed_at is None or self.clock() - self.printed_at >= self.interval

    def _block(self, data: bytes) -> None:
        """Whole lines of the log: the trainer's tagged ones taken, the others shown as one write."""
        if not data:
            return
        updates = self.progress.updates
        self.lines_seen += data.count(b"\n")  # whole lines, each ending in one
        text = self.progress.take_block(data)
        if self.progress.updates != updates:
            wall = self.progress.metrics.get("wall_s")
            if isinstance(wall, int | float) and not isinstance(wall, bool):
                self.wall = (float(wall), self.clock())
        if self.mode != "raw" and text:
            # as the text a print would show (control codes dropped as rich drops them), without rich's
            # per-character layout: a job may print a million lines a second
            shown = _Shown(strip_control_codes(text))
            self._write(lambda: self.out.print(shown, end="", crop=False, soft_wrap=True))

    def _write(self, write: Callable[[], object]) -> None:
        """Through the writer while there is one (in the log's order), else now."""
        if self.writer is not None:
            self.writer.put(write)
        else:
            write()

    def _print_progress(self) -> None:
        self.printed_at, self.printed_updates = self.clock(), self.progress.updates
        shown = self.progress.shown(self.objective)
        line = f"{self.run_id}: " + _layout(shown, None, self.elapsed(), False, eta=self.eta(),
                                            objective=self.objective)[0]
        self._write(lambda: self.out.print(line, markup=False, highlight=False, emoji=False, soft_wrap=True))


class LogReporter(vocab.NullReporter):
    """A run's Reporter (run/vocab.py) that renders a followed log through a LogView: `live` on a terminal,
    `lines` otherwise, `raw` when asked; on `out` (stdout by default; stderr for --json)."""

    def __init__(self, fancy: bool | None = None, *, out: Console | None = None, raw: bool = False) -> None:
        self.out = out or console
        self.fancy = self.out.is_terminal if fancy is None else fancy
        self.mode = "raw" if raw else "live" if self.fancy else "lines"
        self.view: LogView | None = None
        self.waits: str | None = None  # where the followed run is queued, if it is
        self.age: float | None = None  # how long the followed run had gone when its follow began
        self.logs: str | None = None  # the command that shows its log
        self.objective: str | None = None  # the followed job's objective metric: the line's first
        self.pattern = False  # the followed job reads its metrics with a pattern

    def queued(self, host: str, position: int | None) -> None:
        where = f" (position {position})" if position else ""
        self.waits = f"queued on {host}{where}: starts when what it asks frees"

    def pulled(self, pulled: Pulled) -> None:
        view = self.view
        if view is not None:
            view.take_pull(pulled)

    def running(self, age_s: float | None, logs: str) -> None:
        """Before the follow: how long the run has gone; once its log ended (run/following.py says it
        again then), its time at its end: what the final drawing says, the end line's figure."""
        if self.view is not None:
            self.view.ran = age_s
            return
        self.age, self.logs = age_s, logs

    def following(self, run_id: str, offset: int) -> None:
        view = LogView(run_id, self.mode, out=self.out, queued=self.waits, logs_hint=self.logs,
                       objective=self.objective, pattern=self.pattern)
        if self.age is not None and self.waits is None:  # a reattach: the run's time, not ours
            view.started = view.clock() - self.age
        self.view = view.__enter__()

    def log(self, chunk: bytes) -> None:
        if self.view is not None:
            self.view.feed(chunk)

    def metrics(self, obj: dict[str, Any]) -> None:
        view = self.view
        if view is not None:
            view.take_metrics(obj)

    def followed(self) -> None:
        if self.view is not None:
            self.view.__exit__(None, None, None)
            self.view = None


def say(message: str) -> None:
    """A line on stderr, never wrapped: the commands it names must paste back whole."""
    err_console.print(host_text(message, lines=True, markup=False), highlight=False, markup=False, soft_wrap=True)
