"""Detached runs on a host: launch, status, list, logs from a byte offset, stop.

Everything that must outlive the link happens on the host, in supervise.py (uploaded once per
version). This module only builds argv for it and reads its JSON answers, through any Runner.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import supervise
from .config import Config, HostConfig
from .errors import ConnectionLostError, ExitCode, ThrustError, UsageError
from .names import valid_id
from .runner import Runner, expand_home

STATES = ("RUNNING", "FINISHED", "FAILED", "LOST", "STOPPED")


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


def check_run_id(run_id: str) -> str:
    if not valid_id(run_id):
        raise UsageError(f"run id {run_id!r} is not valid (letters, digits, '_', '-', '.')")
    return run_id


def new_run_id(job: str) -> str:
    return f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def _supervisor_source() -> bytes:
    return Path(supervise.__file__).read_bytes()


def ensure_supervisor(runner: Runner, paths: HostPaths, python: str) -> list[str]:
    """Upload supervise.py under a name carrying its hash (so versions never mix); argv to run it.
    Checked once per runner: a study polls and launches many times over one connection."""
    source = _supervisor_source()
    digest = hashlib.sha256(source).hexdigest()[:16]
    remote = f"{paths.bin}/supervise-{digest}.py"
    checked: set[str] = runner.__dict__.setdefault("_thrust_supervisor_checked", set())
    if remote not in checked:
        if not runner.exists(remote):
            runner.put(Path(supervise.__file__), remote)
        checked.add(remote)
    return [python, remote]


def _json(result, what: str):
    if not result.ok:
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise ThrustError(f"{what} failed on the host (exit {result.exit_code}): {' / '.join(tail)}")
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise ThrustError(f"{what}: unexpected answer from the host: {result.stdout[-200:]!r}") from None


def launch(
    runner: Runner,
    host: HostConfig,
    paths: HostPaths,
    *,
    run_id: str,
    job: str,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    meta: Mapping[str, object],
) -> dict:
    """Start argv detached under the supervisor; returns {"pid", "run_dir", "marker"}."""
    sup = ensure_supervisor(runner, paths, host.python)
    marker = secrets.token_hex(8)
    command = [
        *sup, "launch",
        "--run-dir", paths.run(run_id),
        "--cwd", cwd,
        "--lock", paths.lock(job),
        "--marker", marker,
        "--stdin",
        "--", *argv,
    ]
    payload = json.dumps({"meta": {"job": job, "host": host.name, **meta}, "env": dict(env)}).encode()
    try:
        result = runner.run(command, timeout=60, stdin=payload)
    except ConnectionLostError as exc:
        raise ConnectionLostError(
            f"connection to {host.name} lost while launching run {run_id}; it may have started",
            f"check with: thrust-remote status {run_id} --host {host.name}, then "
            f"thrust-remote logs {run_id} --follow --host {host.name}",
        ) from exc
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    except ValueError:
        answer = {}
    if answer.get("error") == "locked":
        other = answer.get("run_id")
        raise ThrustError(
            f"job {job!r} is already running on {host.name} as run {other}",
            f"wait for it (thrust-remote logs {other} -f --host {host.name}) or stop it "
            f"(thrust-remote stop {other} --host {host.name})",
            ExitCode.FAILED,
        )
    if not result.ok or "pid" not in answer:
        raise ThrustError(
            f"could not launch {argv[0]} on {host.name}: {answer.get('error') or result.stderr.strip()[-300:]}"
        )
    return answer


def status(runner: Runner, host: HostConfig, paths: HostPaths, run_id: str) -> dict:
    sup = ensure_supervisor(runner, paths, host.python)
    if not runner.exists(paths.run(run_id)):
        raise ThrustError(
            f"no run {run_id!r} on {host.name} (looked in {paths.runs})",
            f"list the runs with: thrust-remote runs --host {host.name}",
        )
    return _json(runner.run([*sup, "status", "--run-dir", paths.run(run_id)], timeout=60), "status")


def list_runs(runner: Runner, host: HostConfig, paths: HostPaths) -> list[dict]:
    sup = ensure_supervisor(runner, paths, host.python)
    return _json(runner.run([*sup, "list", "--runs-dir", paths.runs], timeout=60), "runs")


def stop(runner: Runner, host: HostConfig, paths: HostPaths, run_id: str, grace: float = 10.0) -> dict:
    sup = ensure_supervisor(runner, paths, host.python)
    status(runner, host, paths, run_id)  # a clear error for an unknown id
    result = runner.run([*sup, "stop", "--run-dir", paths.run(run_id), "--grace", str(grace)], timeout=grace + 60)
    return _json(result, "stop")


def follow_log(
    runner: Runner,
    host: HostConfig,
    paths: HostPaths,
    run_id: str,
    *,
    offset: int = 0,
    follow: bool = True,
    on_bytes: Callable[[bytes], None],
) -> int:
    """Copy the run's log from `offset` to `on_bytes`; returns the new offset.

    The offset is counted from the bytes actually delivered, so after a lost link (ConnectionLostError,
    carrying `.offset`) a reattach from that offset repeats and loses nothing.
    """
    sup = ensure_supervisor(runner, paths, host.python)
    position = offset

    def take(name: str, chunk: bytes) -> None:
        nonlocal position
        if name == "out":
            on_bytes(chunk)
            position += len(chunk)

    argv = [*sup, "logs", "--run-dir", paths.run(run_id), "--offset", str(offset)]
    if follow:
        argv.append("--follow")
    try:
        result = runner.run(argv, on_bytes=take)
    except ThrustError as exc:
        exc.offset = position  # type: ignore[attr-defined]
        raise
    if result.exit_code == 2:
        raise ThrustError(f"run {run_id} on {host.name} has no log yet ({paths.run(run_id)}/log)")
    if not result.ok:
        raise ThrustError(f"reading the log of {run_id} failed with exit code {result.exit_code}")
    return position
