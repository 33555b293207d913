"""`doctor` in order: one host's checklist (its safe fixes when asked, then the checklist again), or
every node's at once, each with its rendezvous row. The reports come back as data; what is shown
meanwhile (a fix's diff before it is written, the fixes tried) goes to the caller's callbacks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from envcheck.checks import CARGO_ONLY
from thrust_remote.backends import backend_for
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.doctor.checklist import FixResult, apply_fixes
from thrust_remote.doctor.rdzv import rendezvous_checks
from thrust_remote.host.fleet import Fleet, each
from thrust_remote.host.report import Check, Report, run_doctor
from thrust_remote.host.session import resolve_host


def workdir_of(config: Config, host: HostConfig) -> str:
    """Where envcheck looks on the host; the local host's workdir is the project itself, wherever the
    command was started from."""
    if host.is_local and not os.path.isabs(os.path.expanduser(host.workdir)):
        return str((config.root / host.workdir).resolve())
    return host.workdir


def wants_cargo(config: Config, job: JobConfig | None) -> bool:
    """Whether the tch-rs (cargo) checks concern this doctor: the job it was asked about is a cargo job,
    or, none asked about, the project has one."""
    if job is not None:
        return job.kind == "cargo"
    return any(j.kind == "cargo" for j in config.jobs.values())


def cargo_skips(report: Report) -> list[Check]:
    """The report's tch-rs (cargo) checks that skipped (never one that warns or fails)."""
    return [c for c in report.checks if c.id in CARGO_ONLY and c.status == "skip"]


def one_host(fleet: Fleet, host: HostConfig, job: JobConfig | None, *, fresh: bool = False, fix: bool = False,
             local_crate: Path | None = None, show: Callable[[str, str], None] | None = None,
             fixed: Callable[[list[FixResult]], None] = lambda _: None) -> Report:
    """The host's checklist; with `fix`, the safe fixes (`show` sees each diff before it is written,
    `fixed` the fixes tried) and, when any was tried, the checklist again."""
    workdir = workdir_of(fleet.config, host)
    runner = fleet.runner(host)
    try:
        # `python:` means what it means for every other command (session.resolve_python)
        host = resolve_host(runner, host, fleet.config)
        report = run_doctor(runner, host, job, workdir=workdir, fresh=fresh)
        # what the host's kind adds (a cluster's login node: the scheduler's and a compute node's rows)
        report.checks += backend_for(host).doctor_checks(fleet, host, workdir)
        if fix:
            results = apply_fixes(runner, report, job, local_crate=local_crate, show=show)
            fixed(results)
            if results:
                report = run_doctor(runner, host, job, workdir=workdir)
    finally:
        runner.close()
    return report


def over_nodes(fleet: Fleet, hosts: Sequence[HostConfig], job: JobConfig | None, *,
               fresh: bool = False) -> list[Report]:
    """Every node's checklist (at once), each with its rendezvous row (rdzv.py), node 0 first."""
    with fleet.sessions(hosts) as sessions:
        reports = each(lambda s: run_doctor(s.runner, s.host, job, workdir=workdir_of(fleet.config, s.host),
                                            fresh=fresh), sessions)
        for report, row in zip(reports, rendezvous_checks(sessions), strict=True):
            report.checks.append(row)
    return reports
