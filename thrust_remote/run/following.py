"""Following one node's log to the run's end (docs/architecture.md, "The flow of one train"): its
bytes and progress to the reporter, a job's TensorBoard scalars read meanwhile; Ctrl-C and a lost link
end with the exact command that reattaches from the byte offset reached.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import StatusAnswer
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ConnectionLostError, Detached, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.session import HostSession
from thrust_remote.run.vocab import Reporter
from thrust_remote.runs import control
from thrust_remote.runs.progress import LinePattern, LineSplitter, RunProgress
from thrust_remote.runs.scalarwatch import ScalarSource, ScalarWatch


def reattach_command(run_id: str, host: HostConfig, offset: int | None = None,
                     config_path: Path | str | None = None, node: int | None = None) -> str:
    """`logs RUN --follow`: the progress view again and, for a train run, the fetch at its end (`node`:
    a run over several hosts whose node `node`'s log was followed)."""
    args = [run_id, "--follow", *(["--node", str(node)] if node else []),
            *(["--offset", str(offset)] if offset else [])]
    return command_hint("logs", *args, host=host, config=config_path)


@dataclass
class Followed:
    """A followed run's end: its status, the log offset reached and what the log said."""

    status: StatusAnswer
    offset: int
    progress: RunProgress


def follow(session: HostSession, run_id: str, reporter: Reporter, *, offset: int = 0,
           config_path: Path | str | None = None, scalars: ScalarSource | None = None,
           node: int | None = None, pattern: LinePattern | None = None,
           progress: RunProgress | None = None, part: str = "") -> Followed:
    """Stream the log to the reporter until the run ends; with `scalars`, the job's TensorBoard
    scalars are read on the host meanwhile (every few seconds, and at the end) as its progress.

    Ctrl-C detaches (Detached, exit 75) and a lost link is ConnectionLostError (75); both carry the
    command that reattaches from the byte offset reached, so no byte is lost or repeated (and
    `config_path`, the --config the user gave, and `node`, the node of a run over several hosts, so the
    command is exactly the one to type). `pattern`: the job's `metrics: {pattern:}`, whose matches in
    its own lines are its progress (told to the reporter as metrics, like the scalars). `progress`: where
    the log's facts are kept (the caller's, read by its pulls meanwhile), else a new one. `part`: the
    followed node's part of the run dir (backends.Node.part: "" the run dir itself)."""
    host = session.host
    delivered = 0
    lines = LineSplitter()
    progress = progress if progress is not None else RunProgress(pattern)
    if progress.pattern is None:
        progress.pattern = pattern  # the job's pattern is read once per line, by the progress kept

    def on_bytes(chunk: bytes) -> None:
        nonlocal delivered
        delivered += len(chunk)  # counted first: a Ctrl-C while it is shown must not replay it
        reporter.log(chunk)
        block = lines.feed_block(chunk)
        if block:  # whole lines at once: a job printing a million lines a second is read at its pace
            progress.take_block(block, shown=False)  # the reporter shows the log: only its facts here
            if progress.matched:  # the pattern's numbers, merged over the block's lines
                reporter.metrics(progress.matched)

    def on_metrics(obj: dict[str, Any]) -> None:
        progress.take_metrics(obj)
        reporter.metrics(obj)

    logs = command_hint("logs", run_id, host=host, config=config_path)
    reporter.running(_age(session, run_id), logs)
    try:
        try:
            # inside the try: a Ctrl-C just after the line that says it detaches does detach (75, how to
            # reattach), never "interrupted" (130) with the run going on unsaid
            reporter.following(run_id, offset)
            with _watching(session, scalars, on_metrics, reporter.warn):
                position = control.follow_log(session, run_id, offset=offset, follow=True, on_bytes=on_bytes,
                                              part=part)
            status = control.status(session, run_id)
            # the run's time at its end, told before the last drawing: the figure its end line says,
            # never our clock's, which stops a poll or more after the run did
            reporter.running(_wall_s(status), logs)
        finally:
            reporter.followed()
    except KeyboardInterrupt:
        reached = offset + delivered  # nothing shown yet: the command has no --offset to explain
        where = "from where you left; without --offset for the whole log; " if reached else ""
        raise Detached(
            f"from run {run_id}; it goes on on {host.name}",
            f"reattach with: {reattach_command(run_id, host, reached, config_path, node)}   ({where}stop it with: "
            f"{command_hint('stop', run_id, host=host, config=config_path)})",
        ) from None
    except ConnectionLostError as exc:
        reached = exc.offset if exc.offset is not None else offset + delivered
        raise ConnectionLostError(
            f"connection to {host.name} lost while following run {run_id}; the run goes on",
            f"reattach with: {reattach_command(run_id, host, reached, config_path, node)}",
        ) from None
    progress.take_block(lines.close_block())
    return Followed(status, position, progress)


def _age(session: HostSession, run_id: str) -> float | None:
    """How long the run has gone (its status's wall time), None before it started or when unknown: a
    reattach's elapsed time goes on from the run's start, not from zero."""
    try:
        st = control.status(session, run_id)
    except ThrustError:
        return None
    return _wall_s(st)


def _wall_s(status: StatusAnswer) -> float | None:
    """A status's wall time in seconds (to its end, or to now while it runs); None before it started."""
    hours = status.get("wall_hours")
    return float(hours) * 3600 if isinstance(hours, int | float) and status.get("started_at") else None


def _watching(session: HostSession, source: ScalarSource | None, on_metrics: Callable[[dict[str, Any]], None],
              on_warn: Callable[[str], None]) -> AbstractContextManager[Any]:
    return ScalarWatch(session, source, on_metrics, on_warn) if source is not None else nullcontext()
