"""Following a run's log at the CLI edge: a rich progress bar on a terminal, the raw bytes otherwise.

The following itself (Ctrl-C detaches, a lost link ends with exit 75, both with the command that
reattaches from the byte offset reached) is pipeline.follow; this module only renders what it
reports (LogReporter).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from .. import pipeline
from ..console import console, err_console
from ..pipeline import exit_code_for, reattach_command
from ..session import HostSession

__all__ = ["LogReporter", "LogView", "exit_code_for", "follow", "reattach_command", "say"]


class LogView:
    """Consumes log bytes: keeps the offset, parses THRUST_METRICS lines, renders or copies."""

    def __init__(self, run_id: str, fancy: bool) -> None:
        self.run_id = run_id
        self.fancy = fancy
        self.pending = b""
        self.offset = 0  # bytes consumed: where a reattach continues
        self.progress: Progress | None = None
        self.task = None
        self.last: dict[str, Any] = {}

    def __enter__(self) -> LogView:
        if self.fancy:
            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[steps]}"),
                TextColumn("{task.fields[stats]}"),
                TimeElapsedColumn(),
                console=console,
                transient=False,
            )
            self.progress.start()
            self.task = self.progress.add_task(self.run_id, total=None, steps="starting", stats="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pending:
            self._line(self.pending)
            self.pending = b""
        if self.progress is not None:
            self.progress.stop()

    def feed(self, chunk: bytes) -> None:
        self.offset += len(chunk)
        if not self.fancy:
            sys.stdout.buffer.write(chunk)  # byte for byte: a transcript equals the host's log
            sys.stdout.buffer.flush()
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        if text.startswith("THRUST_METRICS "):
            try:
                self.last = json.loads(text.split(" ", 1)[1])
            except ValueError:
                return
            self._update()
            return
        if self.fancy and self.progress is not None:
            if text.startswith(("THRUST_INFO ", "THRUST_DONE ")):
                return
            self.progress.console.print(text, markup=False, highlight=False)

    def _update(self) -> None:
        if self.progress is None or self.task is None:
            return
        m = self.last
        stats = []
        if m.get("sps") is not None:
            stats.append(f"{m['sps']:,.0f} SPS")
        if m.get("return_mean") is not None:
            stats.append(f"return {m['return_mean']:.2f}")
        if m.get("score_mean") is not None:
            stats.append(f"score {m['score_mean']:.2f}")
        if m.get("gpu_util") is not None:
            stats.append(f"GPU {m['gpu_util']:.0f}%")
        step, total = m.get("step") or 0, m.get("total_steps")
        steps = f"{step:,}/{total:,} steps" if total else f"{step:,} steps"
        self.progress.update(self.task, completed=step, total=total, steps=steps, stats="  ".join(stats))


class LogReporter(pipeline.NullReporter):
    """A pipeline Reporter that renders a followed log through a LogView."""

    def __init__(self, fancy: bool | None = None) -> None:
        self.fancy = console.is_terminal if fancy is None else fancy
        self.view: LogView | None = None

    def following(self, run_id: str, offset: int) -> None:
        self.view = LogView(run_id, self.fancy).__enter__()

    def log(self, chunk: bytes) -> None:
        if self.view is not None:
            self.view.feed(chunk)

    def followed(self) -> None:
        if self.view is not None:
            self.view.__exit__(None, None, None)
            self.view = None


def follow(session: HostSession, run_id: str, *, offset: int = 0, fancy: bool | None = None) -> tuple[dict, int]:
    """Stream until the run ends; returns (status, offset). Raises ThrustError 75 on detach/lost link."""
    return pipeline.follow(session, run_id, LogReporter(fancy), offset=offset)


def say(message: str) -> None:
    err_console.print(message, highlight=False)
