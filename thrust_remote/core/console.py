"""The rich consoles: only the CLI edge prints; library code returns data or raises ThrustError."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)

# Without a terminal (a pipe, CI, a log file) rich would fold every line at 80 columns, mid-path and
# mid-command; there a line stays whole, as the program said it (tables keep their own layout).
for _console in (console, err_console):
    _console.soft_wrap = not _console.is_terminal


# Bidirectional overrides and isolates reorder what a terminal shows (a name can read as another)
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _shown_char(ch: str, lines: bool) -> str:
    if lines and ch in "\n\t":
        return ch
    code = ord(ch)
    if code < 0x20 or 0x7F <= code <= 0x9F or ch in _BIDI:
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"
    if 0xD800 <= code <= 0xDFFF:  # a byte that was not UTF-8 (surrogateescape): the terminal cannot show it
        return f"\\x{code - 0xDC00:02x}" if code >= 0xDC80 else f"\\u{code:04x}"
    return ch


def host_text(value: object, *, lines: bool = False, markup: bool = True) -> str:
    """Text that came from a host (a cwd, an error, a job or host name, a path, a reason), as it may reach the
    terminal: every control character escaped (`\\x1b`, never a raw ESC that clears the screen or sets the
    title; `\\x9b`, bidi overrides), and rich markup escaped too unless `markup=False` (the caller prints
    without markup): `[bold]` prints as itself. `lines=True` keeps newlines and tabs (a multi-line message).
    A job's own log (`logs`, the follow view) is its output and never goes through here
    (docs/architecture.md, "Security")."""
    text = str(value)
    if not text.isprintable():
        text = "".join(_shown_char(ch, lines) for ch in text)
    return escape(text) if markup else text
