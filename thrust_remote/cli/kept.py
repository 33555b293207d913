"""How `train` and `fetch` report a fetched model: where it is kept, whether it was placed, and when
not, why and the exact command that places it anyway (docs/architecture.md, "Kept models")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from thrust_remote.cli.common import state
from thrust_remote.core.console import err_console, host_text
from thrust_remote.core.hints import command_hint
from thrust_remote.fetch.models import WORSE_MARGIN, FetchResult, relative


def command(ctx: typer.Context, *argv: str, host: str) -> str:
    """`thrust-remote [--config C] ARGV --host H`: a hint that acts on the host and config the user gave."""
    return command_hint(argv[0], *argv[1:], host=host, config=state(ctx).config().given_path)


def score_text(score: Any, kind: Any) -> str:
    if not isinstance(score, int | float):
        return "no score"
    return f"{score:.2f} {kind or 'score'}"


def say_line(text: str) -> None:
    """One line on stderr, never wrapped: a command in it stays copyable. It names what a host said (a
    state, a score's kind, a run id): shown escaped."""
    err_console.print(host_text(text, lines=True), highlight=False, soft_wrap=True)


def _warn(text: str) -> None:
    err_console.print(f"[yellow]warning:[/] {host_text(text, lines=True)}", highlight=False, soft_wrap=True)


def render_fetched(ctx: typer.Context, result: FetchResult, host: str, root: Path) -> None:
    """What happened to the model, on stderr; a model kept but not placed is a warning with the fix."""
    info, prev = result.info, result.previous
    run_id = info["run_id"]
    kept = f"{relative(result.kept, root)}/"
    target = relative(result.target, root)
    new_score = score_text(info.get("score"), info.get("score_kind"))
    prev_score = score_text(prev.get("score"), prev.get("score_kind")) if prev else ""
    prev_name = f"run {prev['run_id']}" if prev and prev.get("run_id") else "the model there before"
    if not result.placed:
        if result.why_not == "state":
            why = f"run {run_id} ended {info.get('state')}: only a FINISHED run's model is placed"
        else:
            why = (f"run {run_id} scores {new_score}, clearly worse than the placed {target} "
                   f"({prev_score}, {prev_name})")
        _warn(f"{why}. Its model is kept in {kept} but NOT placed in {target}, which is unchanged.")
        say_line(f"place it anyway: {command(ctx, 'fetch', run_id, '--force', host=host)}"
             + ("   (train --force places a new run's model without asking)" if result.why_not == "worse" else ""))
        return
    say_line(f"model: {relative(result.model, root)} ({result.bytes:,} bytes, sha256 {result.sha256[:12]}…, "
         f"{new_score}), checked with onnx + onnxruntime; kept in {kept}")
    if prev is None or prev.get("sha256") == result.sha256:
        return
    where = relative(result.backup, root) + "/" if result.backup else (
        relative(prev["kept"], root) + "/" if prev.get("kept") else None)
    line = f"{target} was {prev_name} ({prev_score}); now run {run_id} ({new_score})"
    if where:
        line += f"; the previous model is kept in {where}"
    lower = isinstance(info.get("score"), int | float) and isinstance(prev.get("score"), int | float) \
        and info["score"] < prev["score"]
    if result.forced:
        _warn(f"{line} (placed because of --force)")
    elif lower:
        _warn(f"{line} (placed: lower, but within {WORSE_MARGIN:.0%} of it, what two runs of the same settings "
              "differ by)")
    else:
        say_line(line)
