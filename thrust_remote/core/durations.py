"""A span of time as a user writes it (`max_duration: 8h`, `train --max-duration 90m`): a number of
seconds, or whole numbers with units, largest first (`2d`, `1h30m`, `45s`). One reader for the config
and the command line, so both take the same words and refuse them in the same words."""

from __future__ import annotations

import re

# Up to a year: a run's own stop, waited for by one Event.wait on the host (threading.TIMEOUT_MAX is
# centuries), not a socket's timeout, so SECONDS_MAX (~11.6 days) would refuse real runs.
DURATION_MAX = 366 * 86400
UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_SPAN = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?\Z")
EXPECTED = ("a duration like 8h, 1h30m, 90m (whole numbers with d, h, m, s) or 3600 (seconds), above 0 "
            "and up to 366d")


def parse_duration(value: object) -> float:
    """Seconds of `value` (a number, or text like `1h30m`); ValueError saying what was expected."""
    if isinstance(value, bool):
        raise ValueError(EXPECTED)
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _from_text(value.strip().lower())
    else:
        raise ValueError(EXPECTED)
    if not 0 < seconds <= DURATION_MAX:  # NaN fails this too
        raise ValueError(EXPECTED)
    return seconds


def _from_text(text: str) -> float:
    try:
        return float(text)  # "3600", "0.5"
    except ValueError:
        pass
    match = _SPAN.match(text) if text else None
    if match is None or not any(match.groups()):
        raise ValueError(EXPECTED)
    return float(sum(int(n) * unit for n, unit in zip(match.groups(), UNITS.values(), strict=True) if n))
