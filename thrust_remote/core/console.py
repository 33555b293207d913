"""The rich consoles: only the CLI edge prints; library code returns data or raises ThrustError."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)

# Without a terminal (a pipe, CI, a log file) rich would fold every line at 80 columns, mid-path and
# mid-command; there a line stays whole, as the program said it (tables keep their own layout).
for _console in (console, err_console):
    _console.soft_wrap = not _console.is_terminal
