"""envcheck: the host side of `thrust-remote doctor`. Standard library only, Python 3.8+.

Runs on the GPU host with the host's python (`python -m envcheck --json`, or as the zipapp doctor
uploads) and prints one JSON report: {"host", "facts", "checks"} (docs/architecture.md, "JSON shapes"). The checks are
computed here so the report is complete on its own; the laptop side only renders it and applies
the safe fixes.

Imports here are lazy: `python -m envcheck` imports this package first, and the CLI wants the torch
child process running before the rest of envcheck is even loaded.
"""

from __future__ import annotations

__version__ = "1"
__all__ = ["CHECK_IDS", "collect", "evaluate", "report"]


def report(workdir: str = ".", job: dict | None = None, host: str | None = None,
           gpus: list[int] | None = None, torch_timeout: float = 30.0, torch_probe=None) -> dict:
    """Collect the facts and run every check: the whole envcheck JSON document."""
    from .checks import evaluate
    from .probe import collect

    facts = collect(workdir=workdir, job=job, host=host, gpus=gpus, torch_timeout=torch_timeout,
                    torch_probe=torch_probe)
    return {"host": facts["host"], "facts": facts, "checks": evaluate(facts, job)}


def __getattr__(name: str):
    if name in ("CHECK_IDS", "evaluate"):
        from . import checks

        return getattr(checks, name)
    if name == "collect":
        from .probe import collect

        return collect
    raise AttributeError(name)
