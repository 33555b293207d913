"""A `HostSession`: one host as every capability sees it — its Runner, its config, its paths, and
the host agent's argv. It replaces the (runner, host, paths) triple that used to travel together.

    session = HostSession.open(runner, host, config)
    session.agent_json("status", "status", "--run-dir", session.paths.run(run_id))

Every remote action is an agent subcommand (docs/architecture.md, "The host agent") or a plain argv
(git, cargo, pip) through `session.runner`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from thrust_remote.agent.protocol import IDEMPOTENT_COMMANDS, SITE_COMMANDS
from thrust_remote.core.config import Config, HostConfig
from thrust_remote.core.errors import ThrustError, UnreachableError, UsageError
from thrust_remote.core.names import valid_id
from thrust_remote.host import payload
from thrust_remote.host.agentlink import AgentLink
from thrust_remote.host.pipe import PipeHost
from thrust_remote.host.runner import BytesCallback, LinkUnavailable, Runner, RunResult, StalledError, expand_home
from thrust_remote.host.transports import transport_of


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

    @property
    def venvs(self) -> str:
        """The jobs' virtualenvs, one per requirements/python/torch key (agent `venv ensure`)."""
        return f"{self.thrust}/venvs"

    @property
    def bin(self) -> str:
        return f"{self.thrust}/bin"

    @property
    def trees(self) -> str:
        """The runs' own trees, one per run (agent `tree-add`; docs/architecture.md, "Trees")."""
        return f"{self.thrust}/trees"

    def tree(self, name: str) -> str:
        check_run_id(name)
        return f"{self.trees}/{name}"

    @property
    def modules(self) -> str:
        """The submodules' object stores, one repository per submodule path."""
        return f"{self.thrust}/modules"

    @property
    def patches(self) -> str:
        """Uncommitted patches, by their sha256: each tree applies its own."""
        return f"{self.thrust}/patches"


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


def resolve_python(runner: Runner, host: HostConfig, config: Config | None = None) -> str:
    """`python:` as an argv[0] that means the same from any cwd (docs/architecture.md, "Config (thrust.yaml)").

    `~` and `~/x` are the home of the account the runner acts as (over SSH the remote $HOME, asked
    once per connection); a relative path with a '/' is relative to that home, as ssh itself would
    take it (the local host: relative to the project); a bare name stays a PATH lookup."""
    python = host.python
    if python == "~" or python.startswith("~/"):
        return expand_home(python, runner.home())
    if "/" not in python or python.startswith("/"):
        return python
    if host.is_local:
        return str(((config.root if config else Path.cwd()) / python).absolute())
    return f"{runner.home().rstrip('/')}/{python}"


def resolve_host(runner: Runner, host: HostConfig, config: Config | None = None) -> HostConfig:
    """The host with its `python:` resolved (resolve_python), for everything that builds an argv from it."""
    python = resolve_python(runner, host, config)
    return host if python == host.python else replace(host, python=python)


# The agent and envcheck need this much Python (the trainer needs 3.10, which doctor checks).
MIN_PYTHON = (3, 8)
NOT_EXECUTABLE_EXIT = 126
_PY_VERSION = re.compile(r"\bPython (\d+)\.(\d+)(?:\.(\d+))?")


def python_problem(runner: Runner, host: HostConfig) -> str | None:
    """Why the host's `python:` cannot run thrust-remote's payloads (missing, not executable, not a
    Python, too old), or None. One `python --version`: asked only after a payload call went wrong."""
    python = payload.python_of(runner, host)
    result = runner.run([python, "--version"], timeout=30)
    if result.exit_code == payload.NO_PYTHON_EXIT:
        where = "is not on the PATH" if "/" not in python else "does not exist"
        return f"python {python!r} {where} there"
    if result.exit_code == NOT_EXECUTABLE_EXIT:
        return f"python {python!r} is not executable (exit 126: {result.stderr.strip()[-200:]})"
    said = (result.stdout + result.stderr).strip()
    match = _PY_VERSION.search(said)
    if not result.ok or not match:
        first = said.splitlines()[0][:120] if said else "nothing"
        return f"{python!r} is not a Python interpreter (`{python} --version` printed {first!r})"
    version = tuple(int(g) for g in match.groups() if g is not None)
    if version[:2] < MIN_PYTHON:
        return f"{python!r} is Python {'.'.join(map(str, version))}; thrust-remote needs Python 3.8+ there"
    return None


def bad_python(runner: Runner, host: HostConfig, reason: str) -> UnreachableError:
    """The one error for a `python:` that cannot run the agent: exit 69 with doctor's hint."""
    return UnreachableError(f"{runner.name}: hosts.{host.name}.python: {reason}", payload.python_hint(runner, host))


# THRUST_AGENT_LINK=0: every agent subcommand as a command of its own (a host where `agent serve`
# misbehaves; the benchmarks' "before")
LINK_SWITCH = "THRUST_AGENT_LINK"

def _flags(args: tuple[str, ...]) -> tuple[str, ...]:
    """`-S` but for the subcommands that read installed packages: ~35 ms less per call on a venv python."""
    return () if args and args[0] in SITE_COMMANDS else ("-S",)


@dataclass
class HostSession:
    runner: Runner
    host: HostConfig
    paths: HostPaths
    _python_checked: bool = field(default=False, repr=False)
    # the agent link (one `agent serve` per session, where the host's transport has one: transports.py);
    # off for the session once it could not start (every request then runs as a command of its own)
    _link: AgentLink | None = field(default=None, repr=False)
    _link_off: bool = field(default=False, repr=False)
    _link_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = field(default=False, repr=False)
    _starting: threading.Thread | None = field(default=None, repr=False)  # the link's start from `open`

    @classmethod
    def open(cls, runner: Runner, host: HostConfig, config: Config | None = None) -> HostSession:
        """A session on the host; its agent link starts now, in the background (a login shell and a
        python on the host: 0.06-0.3 s), beside whatever the caller does before its first request."""
        host = resolve_host(runner, host, config)
        session = cls(runner, host, host_paths(runner, host, config))
        session._start_link()
        return session

    def _link_wanted(self) -> bool:
        """The host's transport talks to the agent over a link, and THRUST_AGENT_LINK does not turn it off."""
        return transport_of(self.host).agent_link and os.environ.get(LINK_SWITCH) != "0"

    def _pipes(self) -> PipeHost:
        """The runner as what opens the link's pipe: a transport with `agent_link` makes a PipeHost."""
        return cast(PipeHost, self.runner)

    def _start_link(self) -> None:
        if not self._link_wanted():
            return
        # the connection itself here, in the caller: a host that is down fails now, once (not in the
        # background and then again in the first request), and what starts beside it finds it open
        self._pipes().carrier()

        def start() -> None:
            with contextlib.suppress(Exception):  # the first request meets (and reports) the same failure
                if not self._closed:
                    self._agent_link()
            if self._closed:  # closed meanwhile: what this start opened again (a connection) goes too
                self.close()

        self._starting = threading.Thread(target=start, name=f"agent-link-start-{self.host.name}", daemon=True)
        self._starting.start()

    @property
    def name(self) -> str:
        return self.host.name

    def close(self) -> None:
        self._closed = True  # a link start still under way closes what it opened (_start_link)
        if self._link is not None:
            self._link.close()
        self.runner.close()

    def __enter__(self) -> HostSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def agent_argv(self, *args: str) -> list[str]:
        """The exact argv that runs an agent subcommand on this host."""
        home = self.runner.home()
        return [payload.python_of(self.runner, self.host), *_flags(args), expand_home(payload.agent().remote, home),
                *args]

    def agent(self, *args: str, timeout: float | None = 60, stdin: bytes | None = None,
              on_bytes: BytesCallback | None = None) -> RunResult:
        """Run an agent subcommand (uploading the agent first when this host lacks this version): a
        request over the session's agent link when it has one and the subcommand answers whole, else a
        command of its own (a streamed answer: logs --follow, venv's pip output)."""
        link = self._agent_link() if on_bytes is None and args else None
        if link is not None:
            result = self._over_link(link, args, stdin, timeout)
        else:
            result, _ = payload.run_pyz(self.runner, self.host, payload.agent(), args, timeout=timeout, stdin=stdin,
                                        on_bytes=on_bytes, flags=_flags(args))
        # every non-streaming subcommand answers a JSON line: a failure or silence may be a `python:`
        # that is no Python at all, which the user must hear about as such (69), not as "exit 2"
        if not result.ok or (on_bytes is None and not result.stdout.strip()):
            self.check_python()
        return result

    def _over_link(self, link: AgentLink, args: tuple[str, ...], stdin: bytes | None,
                   timeout: float | None) -> RunResult:
        """A request over the link; one that only reads is asked once more of a fresh server when this one
        stopped answering (StalledError: the connection is fine, that process is stopped or frozen)."""
        try:
            return link.call(args, stdin=stdin, timeout=timeout)
        except StalledError:
            fresh = self._agent_link() if args[0] in IDEMPOTENT_COMMANDS else None
            if fresh is None or fresh is link:
                raise
        return fresh.call(args, stdin=stdin, timeout=timeout)

    def _agent_link(self) -> AgentLink | None:
        """The session's `agent serve` (started on first use, again once after it died), or None where
        the host's transport has no link or it cannot start here (no agent yet: uploaded, then tried again)."""
        if self._link_off or not self._link_wanted():
            return None
        with self._link_lock:
            # a start that waited on this lock while the session closed (Python's locks are not fair: the
            # background start can wait out a whole session of requests) must not open a new connection
            if self._closed:
                return None
            if self._link is not None and not self._link.dead:
                return self._link
            remote = expand_home(payload.agent().remote, self.runner.home())
            for attempt in (1, 2):
                try:
                    self._link = AgentLink.open(self._pipes(), self.agent_argv("serve"))
                    return self._link
                except LinkUnavailable as exc:
                    if attempt == 1 and "can't open file" in exc.text and remote in exc.text:
                        payload.upload(self.runner, payload.agent())
                        continue
                    self._link, self._link_off = None, True
            return None

    def check_python(self) -> None:
        """Raise bad_python (69) when the host's python cannot run the agent; asked once per session."""
        if self._python_checked:
            return
        reason = python_problem(self.runner, self.host)
        if reason:
            raise bad_python(self.runner, self.host, reason)
        self._python_checked = True

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

