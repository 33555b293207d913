"""envcheck: the host side of `thrust-remote doctor`. Standard library only, Python 3.8+.

Runs on the GPU host with the host's python (`python -m envcheck --json`, or as the zipapp doctor
uploads) and prints one JSON report: {"host", "facts", "checks"} (DESIGN.md). The checks are
computed here so the report is complete on its own; the laptop side only renders it and applies
the safe fixes.
"""

from __future__ import annotations

from .checks import CHECK_IDS, evaluate
from .probe import collect

__version__ = "1"
__all__ = ["CHECK_IDS", "collect", "evaluate", "report"]


def report(workdir: str = ".", job: dict | None = None, host: str | None = None,
           gpus: list[int] | None = None, torch_timeout: float = 30.0) -> dict:
    """Collect the facts and run every check: the whole envcheck JSON document."""
    facts = collect(workdir=workdir, job=job, host=host, gpus=gpus, torch_timeout=torch_timeout)
    return {"host": facts["host"], "facts": facts, "checks": evaluate(facts, job)}
