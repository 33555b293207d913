"""What every command needs: the global options, the loaded config, and the fleet that reaches its hosts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import typer

from thrust_remote.core.config import ENV_DEBUG, Config, load_config
from thrust_remote.core.durations import parse_duration
from thrust_remote.core.errors import UsageError
from thrust_remote.host.fleet import Fleet


@dataclass
class AppState:
    config_path: Path | None = None
    debug: bool = False
    _config: Config | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        global _current
        _current = self  # one command runs per process (a test's in-process call too): its state

    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config


_current: AppState | None = None


def loaded_config() -> Config | None:
    """The config the running command has loaded, None before it did: for what renders a run deep in a
    call (the live line's objective: cli/outcome.py), where no typer.Context is handed down. Never loads."""
    return _current._config if _current is not None else None


HOST_OPT = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml (default: the run's host from the "
                        "local index, else default_host).")


def state(ctx: typer.Context) -> AppState:
    root = ctx.find_root()
    if not isinstance(root.obj, AppState):
        root.obj = AppState(debug=_env_flag(ENV_DEBUG))
    return root.obj


def get_config(ctx: typer.Context) -> Config:
    return state(ctx).config()


def get_fleet(ctx: typer.Context) -> Fleet:
    """The configured hosts, reached by name (host/fleet.py), with the --config the user gave for the
    hints that name a host."""
    return Fleet(get_config(ctx), config_path=state(ctx).config_path)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def plain_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns as plain text with every value whole: what a table is without a terminal (a pipe, CI),
    so `grep` and `awk` see whole values, never a cell cut to fit."""
    widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


MAX_DURATION_HELP = ("Stop the run at this age (8h, 90m, 3600: seconds), its TERM first so it can checkpoint; it "
                     "ends STOPPED [max-duration] (default: the job's max_duration:).")


def max_duration_of(text: str | None) -> float | None:
    """`--max-duration`'s seconds (None: not given); 64 for a value it cannot be, before anything connects."""
    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise UsageError(f"--max-duration {text}: expected {exc}") from None
