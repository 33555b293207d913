"""Detached runs on a host: launch, status, list, logs from a byte offset, stop.

Everything that must outlive the link happens on the host, in the agent's `runs` module
(thrust_remote/agent/runs.py). This module only builds its argv and reads its JSON answers, through
a HostSession (docs/architecture.md, "The run directory" and "JSON shapes").
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence

from .errors import ConnectionLostError, ExitCode, ThrustError
from .hints import command_hint
from .session import HostPaths, HostSession, check_run_id, host_paths, parse_json

STATES = ("RUNNING", "FINISHED", "FAILED", "LOST", "STOPPED")
__all__ = ["STATES", "HostPaths", "HostSession", "check_run_id", "follow_log", "host_paths", "launch",
           "list_runs", "new_run_id", "status", "stop"]


def new_run_id(job: str) -> str:
    return f"{job}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def launch(
    session: HostSession,
    *,
    run_id: str,
    job: str,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    meta: Mapping[str, object],
) -> dict:
    """Start argv detached under the supervisor; returns {"pid", "run_dir", "marker"}."""
    host, paths = session.host, session.paths
    marker = secrets.token_hex(8)
    args = [
        "launch",
        "--run-dir", paths.run(run_id),
        "--cwd", cwd,
        "--lock", paths.lock(job),
        "--marker", marker,
        "--stdin",
        "--", *argv,
    ]
    # meta and env go on stdin: a command line is world-readable (ps), env values may be secrets
    payload = json.dumps({"meta": {"job": job, "host": host.name, **meta}, "env": dict(env)}).encode()
    try:
        result = session.agent(*args, timeout=60, stdin=payload)
    except ConnectionLostError as exc:
        raise ConnectionLostError(
            f"connection to {host.name} lost while launching run {run_id}; it may have started",
            f"check with: {command_hint('status', run_id, host=host)}, then "
            f"{command_hint('logs', run_id, '--follow', host=host)}",
        ) from exc
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    except ValueError:
        answer = {}
    if answer.get("error") == "locked":
        other = answer.get("run_id")
        raise ThrustError(
            f"job {job!r} is already running on {host.name} as run {other}",
            f"wait for it ({command_hint('logs', str(other), '--follow', host=host)}) or stop it "
            f"({command_hint('stop', str(other), host=host)})",
            ExitCode.FAILED,
        )
    if not result.ok or "pid" not in answer:
        raise ThrustError(
            f"could not launch {argv[0]} on {host.name}: {answer.get('error') or result.stderr.strip()[-300:]}"
        )
    return answer


def status(session: HostSession, run_id: str) -> dict:
    run_dir = session.paths.run(run_id)
    if not session.runner.exists(run_dir):
        raise ThrustError(
            f"no run {run_id!r} on {session.name} (looked in {session.paths.runs})",
            f"list the runs with: {command_hint('runs', host=session.host)}",
        )
    return session.agent_json("status", "status", "--run-dir", run_dir)


def list_runs(session: HostSession) -> list[dict]:
    return session.agent_json("runs", "list", "--runs-dir", session.paths.runs)


def stop(session: HostSession, run_id: str, grace: float = 10.0) -> dict:
    status(session, run_id)  # a clear error for an unknown id
    result = session.agent("stop", "--run-dir", session.paths.run(run_id), "--grace", str(grace), timeout=grace + 60)
    return parse_json(result, "stop")


def follow_log(
    session: HostSession,
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
    position = offset

    def take(name: str, chunk: bytes) -> None:
        nonlocal position
        if name == "out":
            on_bytes(chunk)
            position += len(chunk)

    args = ["logs", "--run-dir", session.paths.run(run_id), "--offset", str(offset)]
    if follow:
        args.append("--follow")
    try:
        result = session.agent(*args, timeout=None, on_bytes=take)
    except ThrustError as exc:
        exc.offset = position  # type: ignore[attr-defined]
        raise
    if result.exit_code == 2:
        raise ThrustError(f"run {run_id} on {session.name} has no log yet ({session.paths.run(run_id)}/log)")
    if not result.ok:
        raise ThrustError(f"reading the log of {run_id} failed with exit code {result.exit_code}")
    return position
