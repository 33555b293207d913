"""The rich consoles: only the CLI edge prints; library code returns data or raises ThrustError."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
