"""A `HostSession`: one host as every capability sees it — its Runner, its config, its paths, and
the host agent's argv. It replaces the (runner, host, paths) triple that used to travel together.

    session = HostSession.open(runner, host, config)
    session.agent_json("status", "status", "--run-dir", session.paths.run(run_id))

Every remote action is an agent subcommand (docs/architecture.md, "The host agent") or a plain argv
(git, cargo, pip) through `session.runner`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import payload
from .config import Config, HostConfig
from .errors import ThrustError, UsageError
from .names import valid_id
from .runner import BytesCallback, Runner, RunResult, expand_home


def check_run_id(run_id: str) -> str:
    if not valid_id(run_id):
        raise UsageError(f"run id {run_id!r} is not valid (letters, digits, '_', '-', '.')")
    return run_id


@dataclass(frozen=True)
class HostPaths:
    """Where things live on one host, absolute (no `~`: quoting would stop its expansion)."""

    workdir: str

    @property
    def thrust(self) -> str:
        return f"{self.workdir}/.thrust"

    @property
    def runs(self) -> str:
        return f"{self.thrust}/runs"

    def run(self, run_id: str) -> str:
        check_run_id(run_id)
        return f"{self.runs}/{run_id}"

    def lock(self, job: str) -> str:
        return f"{self.thrust}/locks/{job}.lock"

    @property
    def venvs(self) -> str:
        """The jobs' virtualenvs, one per requirements/python/torch key (agent `venv ensure`)."""
        return f"{self.thrust}/venvs"

    @property
    def bin(self) -> str:
        return f"{self.thrust}/bin"


def host_paths(runner: Runner, host: HostConfig, config: Config | None = None) -> HostPaths:
    workdir = host.workdir
    if host.is_local and not os.path.isabs(os.path.expanduser(workdir)):
        # the local host's workdir is relative to the project (thrust.yaml's directory)
        base = config.root if config else Path.cwd()
        workdir = str((base / workdir).resolve())
    elif workdir.startswith("~"):
        workdir = expand_home(workdir, runner.home())
    elif not workdir.startswith("/"):
        # relative to the home directory, as ssh itself would take it; made absolute because the
        # trainer runs with the workdir as its cwd and would otherwise nest it twice
        workdir = f"{runner.home().rstrip('/')}/{workdir}"
    return HostPaths(workdir.rstrip("/") or "/")


# Agent subcommands that look at the host's installed packages (torch, numpy...). The others import
# only the standard library, so they run with `python -S`: no site-packages scan and no .pth files,
# ~35 ms less per call on a venv python (each sync, launch, status and poll is such a call).
NEEDS_SITE = frozenset({"preflight", "missing-modules"})


def _flags(args: tuple[str, ...]) -> tuple[str, ...]:
    return () if args and args[0] in NEEDS_SITE else ("-S",)


@dataclass
class HostSession:
    runner: Runner
    host: HostConfig
    paths: HostPaths

    @classmethod
    def open(cls, runner: Runner, host: HostConfig, config: Config | None = None) -> HostSession:
        return cls(runner, host, host_paths(runner, host, config))

    @property
    def name(self) -> str:
        return self.host.name

    def agent_argv(self, *args: str) -> list[str]:
        """The exact argv that runs an agent subcommand on this host."""
        home = self.runner.home()
        return [payload.python_of(self.runner, self.host), *_flags(args), expand_home(payload.agent().remote, home),
                *args]

    def agent(self, *args: str, timeout: float | None = 60, stdin: bytes | None = None,
              on_bytes: BytesCallback | None = None) -> RunResult:
        """Run an agent subcommand (uploading the agent first when this host lacks this version)."""
        result, _ = payload.run_pyz(self.runner, self.host, payload.agent(), args, timeout=timeout, stdin=stdin,
                                    on_bytes=on_bytes, flags=_flags(args))
        return result

    def agent_json(self, what: str, *args: str, timeout: float | None = 60, stdin: bytes | None = None) -> Any:
        """Run an agent subcommand that answers one JSON line; a failure is a ThrustError naming `what`."""
        return parse_json(self.agent(*args, timeout=timeout, stdin=stdin), what)


def parse_json(result: RunResult, what: str, *, check: bool = True) -> Any:
    if check and not result.ok:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ThrustError(f"{what} failed on the host (exit {result.exit_code}): {' / '.join(tail)}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ThrustError(f"{what}: unexpected answer from the host: {result.stdout[-200:]!r}") from None

