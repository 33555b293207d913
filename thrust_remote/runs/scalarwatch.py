"""A job's TensorBoard scalars, read on the host: optimize's objective, and the progress of a followed
run whose job says `metrics: {tensorboard: DIR}` (docs/architecture.md, "JSON shapes").

Reading happens on the host with the job's own python (`agent scalars`, TensorBoard's reader), so
neither the event files nor tensorboard have to reach the laptop. While a run is followed, a
ScalarWatch thread asks every TB_EVERY_S for the latest point of each tag and hands the view a
metrics object shaped like a THRUST_METRICS line ({"step": S, tag: value, ...}).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from thrust_remote.agent.protocol import RunRecord
from thrust_remote.core.errors import ConfigError, ThrustError
from thrust_remote.core.hints import config_file
from thrust_remote.host import payload
from thrust_remote.host.session import HostSession
from thrust_remote.runs import control

log = logging.getLogger(__name__)

TB_EVERY_S = 10.0  # a full reload of the event files each time: cheap for a run's scalars, not free
RUN_ID_VARS = ("${THRUST_RUN_ID}", "$THRUST_RUN_ID")


def events_path(cwd: str, events_dir: str | None, run_id: str) -> str:
    """The events directory on the host: DIR under the job's cwd, $THRUST_RUN_ID replaced."""
    path = events_dir or "."
    for var in RUN_ID_VARS:
        path = path.replace(var, run_id)
    return path if path.startswith("/") else f"{cwd}/{path}"


def read_scalars(session: HostSession, python: str, request: Sequence[tuple[str, str, int]], tag: str | None,
                 job: str, timeout: float = 120) -> dict[str, Any]:
    """`agent scalars` run by `python` (the job's venv: it imports tensorboard) for each (run_dir,
    events_dir, since_step): {run_dir: {"tags": [...], "points" or "latest": ...}} (agent/scalars.py)."""
    host = replace(session.host, python=python)
    args = ["scalars", "--runs", json.dumps(request), *(["--tag", tag] if tag else [])]
    result, _ = payload.run_pyz(session.runner, host, payload.agent(), args, timeout=timeout)
    lines = result.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    if answer.get("error") == "missing":
        raise ConfigError(
            f"job {job!r} reads TensorBoard scalars (metrics: {{tensorboard: ...}}), but its python on "
            f"{session.name} cannot import tensorboard ({answer.get('detail')})",
            f"add it to the job's requirements in {config_file(session.host)}: jobs.{job}.requirements: [tensorboard] "
            "(or a `tensorboard` line in its requirements file)")
    if not result.ok or "runs" not in answer:
        tail = (result.stderr or result.stdout).strip()[-300:]
        raise ThrustError(f"reading TensorBoard scalars on {session.name} failed: {tail}")
    return answer["runs"]


@dataclass(frozen=True)
class ScalarSource:
    """Where a run's scalars are and who can read them."""

    job: str
    python: str  # the job's python on the host (its venv's; THRUST_PYTHON in run.json)
    run_dir: str
    events_dir: str


def source_for(session: HostSession, run_id: str, job: str, events: str | None) -> ScalarSource | None:
    """The run's scalar source when its job (named `job`) reads TensorBoard (`events`: its `metrics:
    {tensorboard: DIR}`); None otherwise (or when run.json lacks what it takes: a run started by an
    older thrust-remote). Handed the one field it reads, not the job."""
    if not events:
        return None
    run_dir = session.paths.run(run_id)
    try:
        meta = control.read_run_json(session, run_dir) or RunRecord()
    except ThrustError:
        return None
    env = meta.get("env")
    python = env.get("THRUST_PYTHON") if isinstance(env, dict) else None
    cwd = meta.get("cwd")
    if not python or not cwd:
        return None
    return ScalarSource(job, python, run_dir, events_path(cwd, events, run_id))


def latest_metrics(session: HostSession, source: ScalarSource) -> dict[str, Any] | None:
    """{"step": the highest step, tag: its latest value, ...}; None before the first point."""
    got = read_scalars(session, source.python, [(source.run_dir, source.events_dir, -1)], None, source.job, 60)
    latest: Mapping[str, Sequence[float]] = (got.get(source.run_dir) or {}).get("latest") or {}
    if not latest:
        return None
    return {"step": max(int(p[0]) for p in latest.values()), **{tag: p[1] for tag, p in latest.items()}}


class ScalarWatch:
    """A thread that reads the latest scalars every `every` seconds while a run is followed, and once
    more when it stops (the run's last points); `on_metrics` gets each new object. tensorboard missing
    on the host is said once (`on_warn`) and ends the watch; any other failure waits for the next turn."""

    def __init__(self, session: HostSession, source: ScalarSource, on_metrics: Callable[[dict[str, Any]], None],
                 on_warn: Callable[[str], None], every: float = TB_EVERY_S) -> None:
        self.session, self.source, self.every = session, source, every
        self.on_metrics, self.on_warn = on_metrics, on_warn
        self.stopped = threading.Event()
        self.final = True  # read once more at the end: not after a Ctrl-C or a lost link
        self.last: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._loop, name="scalar-watch", daemon=True)

    def __enter__(self) -> ScalarWatch:
        self.thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.final = exc_type is None
        self.stopped.set()
        self.thread.join(timeout=90 if self.final else 1)

    def read(self) -> bool:
        """One read; False when watching is pointless (tensorboard missing)."""
        try:
            metrics = latest_metrics(self.session, self.source)
        except ConfigError as exc:
            self.on_warn(f"{exc} — the progress shows the log only")
            return False
        except (ThrustError, OSError, ValueError) as exc:
            log.debug("reading scalars failed: %s", exc)
            return True
        if metrics is not None and metrics != self.last:
            self.last = metrics
            self.on_metrics(metrics)
        return True

    def _loop(self) -> None:
        while not self.stopped.wait(self.every):
            if not self.read():
                return
        if self.final:
            self.read()  # the run ended: its last points
