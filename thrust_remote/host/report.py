"""What envcheck says about a host: run it there in one remote command, and its report as data.

envcheck travels as one zipapp (`envcheck-<sha>.pyz` in ~/.cache/thrust-remote on the host, built
and run by thrust_remote.host.payload like the host agent), uploaded only when that exact version is not
already there. The common case is therefore a single remote command: `[python, pyz, *args]`.

Both `doctor` (doctor/checklist.py: the checklist's fixes; the CLI renders) and a run's preflight
(run/preflight.py) ask it, so it lives here, below both. This module returns data (Report) and raises
ThrustError; rendering is the CLI's.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from envcheck.checks import CHECK_IDS
from thrust_remote.core import hints
from thrust_remote.core.config import HostConfig, JobConfig
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host import payload
from thrust_remote.host.jobspec import job_spec
from thrust_remote.host.runner import Runner, expand_home
from thrust_remote.host.session import bad_python, python_problem

CACHE_DIR = payload.CACHE_DIR
STATUSES = ("ok", "warn", "fail", "skip")
Job = JobConfig | Mapping[str, Any] | None  # a JobConfig or the plain spec (jobspec.job_spec)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    status: str
    detail: str
    fix: str | None = None


@dataclass
class Report:
    """envcheck's JSON as objects, plus how long the round trip took."""

    host: str
    facts: dict
    checks: list[Check]
    wall_s: float = 0.0
    uploaded: bool = False

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        """0 when nothing fails, 1 when a check fails (docs/architecture.md, "Exit codes")."""
        return int(ExitCode.FAILED) if self.failed else int(ExitCode.OK)

    def check(self, cid: str) -> Check:
        for c in self.checks:
            if c.id == cid:
                return c
        raise KeyError(cid)

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    def to_json(self) -> dict:
        """docs/architecture.md's shape: {"host", "facts", "checks": [{id, title, status, detail, fix}]}."""
        return {
            "host": self.host,
            "facts": self.facts,
            "checks": [
                {"id": c.id, "title": c.title, "status": c.status, "detail": c.detail, "fix": c.fix}
                for c in self.checks
            ],
        }

    @classmethod
    def from_json(cls, doc: dict, wall_s: float = 0.0, uploaded: bool = False) -> Report:
        checks = [Check(c["id"], c["title"], c["status"], c["detail"], c.get("fix")) for c in doc["checks"]]
        return cls(doc["host"], doc["facts"], checks, wall_s, uploaded)


# ----------------------------------------------------------------------------------------------
# the envcheck payload


def payload_path() -> str:
    """Where the payload lives on a host (its `~` is the host's home)."""
    return payload.envcheck().remote


def envcheck_args(host: HostConfig, job: Job, workdir: str | None = None, torch_timeout: float = 30.0, *,
                  cache_dir: str | None = None, fresh: bool = False) -> list[str]:
    """envcheck's argv; the job goes on stdin (`--job-json -`, `envcheck_stdin`): its env may hold secrets.
    cache_dir: where the host keeps a passing torch probe to reuse (fresh: probe again all the same)."""
    args = ["--json", "--workdir", workdir or host.workdir, "--host", host.name,
            "--torch-timeout", f"{torch_timeout:g}"]
    if cache_dir:
        args += ["--cache-dir", cache_dir] + (["--fresh"] if fresh else [])
    if job is not None:
        args += ["--job-json", "-"]
    if host.gpus:
        args += ["--gpus", ",".join(str(g) for g in host.gpus)]
    return args


def run_envcheck(runner: Runner, host: HostConfig, job: Job = None, *,
                 workdir: str | None = None, torch_timeout: float = 30.0, fresh: bool = False) -> Report:
    """One remote command (two plus an upload the first time a host sees this envcheck version).
    A host without the configured python is UnreachableError (69), from payload.run_pyz."""
    started = time.monotonic()
    args = envcheck_args(host, job, workdir, torch_timeout, cache_dir=expand_home(CACHE_DIR, runner.home()),
                         fresh=fresh)
    stdin = json.dumps(job_spec(job), sort_keys=True).encode() if job is not None else None
    timeout = torch_timeout + 30.0
    result, uploaded = payload.run_pyz(runner, host, payload.envcheck(), args, timeout=timeout, stdin=stdin)
    if result.timed_out:
        raise ThrustError(f"envcheck on {runner.name} did not finish in {timeout:g} s",
                          "run it by hand to see where it hangs: "
                          f"{host.python} {payload_path()} --json", ExitCode.UNAVAILABLE)
    doc = _report_doc(result.stdout)
    if doc is None:
        # not executable, not a Python, too old: say which, with doctor's own hint (exit 69)
        reason = python_problem(runner, host)
        if reason or not result.ok:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])[:300]
            raise bad_python(runner, host, f"could not run envcheck (exit {result.exit_code}): {reason or tail}")
        raise ThrustError(f"envcheck on {runner.name} answered something that is not its report: "
                          f"{result.stdout.strip()[:200]!r}",
                          "does a start-up file of that account (~/.bashrc, ~/.profile) print to stdout for "
                          f"commands? Make it print only in interactive shells; see what it prints with: "
                          f"ssh {host.address or 'HOST'} true",
                          ExitCode.UNAVAILABLE)
    report = Report.from_json(doc, time.monotonic() - started, uploaded)
    return with_config(with_local_extra(report, runner, host), host.config_path)


def _report_doc(stdout: str) -> dict[str, Any] | None:
    """envcheck's report: its one JSON line, the last of stdout (a line an account's start-up file
    prints before the command's own output comes first, and is not the report)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "checks" in doc else None


def with_local_extra(report: Report, runner: Runner, host: HostConfig) -> Report:
    """The host `local` on thrust-remote's own python without torch is a plain install: torch alone would
    not do, the trainer also wants the `local` extra's onnxscript and gymnasium (run/preflight.py)."""
    python = payload.python_of(runner, host)
    if not host.is_local or python != sys.executable:
        return report
    report.checks = [
        replace(c, fix=f"{c.fix}, then {python} -m {hints.LOCAL_EXTRA_INSTALL}")
        if c.id == "torch-import" and c.status == "fail" and " -m pip install torch " in (c.fix or "") else c
        for c in report.checks
    ]
    return report


def with_config(report: Report, config_path: str | None) -> Report:
    """envcheck runs on the host and cannot know the config file the user named: its fixes that are
    thrust-remote commands get `--config PATH` here, like every other hint (thrust_remote/core/hints.py),
    and a fix that says what to set "in thrust.yaml" names that file instead."""
    if not config_path:
        return report
    report.checks = [replace(c, fix=_named_config(c.fix, config_path)) if c.fix else c for c in report.checks]
    return report


def _named_config(fix: str, config_path: str) -> str:
    prefix = f"{hints.PROG} "
    if fix.startswith(prefix):
        fix = fix.replace(prefix, command_hint("", config=config_path) + " ", 1)
    return hints.in_config_file(fix, config_path)


def run_doctor(runner: Runner, host: HostConfig, job: Job = None, *,
               workdir: str | None = None, torch_timeout: float = 30.0, fresh: bool = False) -> Report:
    """The whole checklist for `host` (and `job`, when given): a Report with every check id.

    Connection problems arrive as the Runner's ThrustError (exit 68/69/76/77); a host without the
    configured python is UnreachableError (69). A failing check is data: Report.exit_code says 1.
    fresh: import torch again even where the host kept a passing probe (envcheck/torchprobe.py).
    """
    report = run_envcheck(runner, host, job, workdir=workdir, torch_timeout=torch_timeout, fresh=fresh)
    missing = [cid for cid in CHECK_IDS if cid not in {c.id for c in report.checks}]
    if missing:  # an old payload cached under the same hash cannot happen; a hand-edited one can
        raise ThrustError(f"envcheck on {runner.name} did not report {', '.join(missing)}")
    return report


def collect_facts(runner: Runner, host: HostConfig, job: Job = None, **kw) -> dict:
    """Just the facts (for buildenv): what the train pipeline needs before a build or a run."""
    return run_envcheck(runner, host, job, **kw).facts
