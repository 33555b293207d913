"""`doctor` in order: one host's checklist (its safe fixes when asked, then the checklist again), or
every node's at once, each with its rendezvous row. The reports come back as data; what is shown
meanwhile (a fix's diff before it is written, the fixes tried) goes to the caller's callbacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from envcheck.checks import CARGO_ONLY
from thrust_remote.agent.venv import named_companions
from thrust_remote.backends import backend_for
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.config.hosts import torch_index
from thrust_remote.doctor.checklist import FixResult, apply_fixes
from thrust_remote.doctor.rdzv import rendezvous_checks
from thrust_remote.host import payload
from thrust_remote.host.fleet import Fleet, each
from thrust_remote.host.report import Check, Report, run_doctor
from thrust_remote.host.runner import Runner
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
        row = companion_row(runner, host, job, report.facts, fleet.config.root)
        report.checks += [row] if row else []
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


REACH_S = 5 + 60  # the agent's connect (5 s) and the host python's torch import (the probe)
TITLE = "torch's companions for the host's torch"


def companion_row(runner: Runner, host: HostConfig, job: JobConfig | None, facts: dict, root: Path) -> Check | None:
    """`doctor --job`: a job whose requirements name torchvision / torchaudio, on a host whose torch is
    a variant build (`+cpu`, `+cu128`), keeps the host python's own build when it loads beside that torch,
    else gets it from the variant's index (run/venv.py): can the host reach it, and does it list a build
    of the variant? The agent's `venv source` answers, as `venv ensure` asks before pip. A `+cpu` torch
    has no other source (PyPI's Linux builds are CUDA ones): a fail, as the run's setup refuses; for a
    CUDA torch PyPI's build may fit: a warning."""
    if job is None or job.kind == "cargo":
        return None
    text = ""
    if job.requirements_file:
        with contextlib.suppress(OSError):  # a missing file: the preflight names it
            text = (root / job.requirements_file).read_text(errors="replace")
    named = named_companions(job.requirements, text)
    torch = str(facts.get("torch"))
    index = torch_index(host.torch_index, facts.get("torch"))
    if not named or not index:
        return None
    result, _ = payload.run_pyz(runner, host, payload.agent(), ["venv", "source", "--torch", torch,
                                                                "--torch-index", index, "--", *named],
                                timeout=REACH_S + 30, flags=("-S",))
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": (result.stderr or result.stdout).strip()[-200:] or f"exit {result.exit_code}",
                  "loaded": [], "missing": [], "sought": {}}
    return _source_row(host, named, torch, index, answer)


def _source_row(host: HostConfig, named: Sequence[str], torch: str, index: str, answer: dict) -> Check:
    variant = torch.partition("+")[2]
    loaded = list(answer.get("loaded") or ())
    if loaded == list(named):
        return Check("torch-companions", TITLE, "ok",
                     f"{_names(loaded)} in {host.name}'s python {_verb(loaded, 'load', 'loads')} beside its torch "
                     f"{torch}: the job's venv uses {_verb(loaded, 'them', 'it')}, needing nothing from {index}")
    need = [n for n in named if n not in loaded]
    what = f"{_names(need)} for torch {torch} {_verb(need, 'come', 'comes')} from {index}"
    refused = ("PyPI's builds are CUDA ones: a run of this job is refused before its venv's install"
               if variant == "cpu" else "a run uses PyPI's build only if it loads beside that torch")
    url = urllib.parse.urlsplit(index)
    if answer.get("error"):
        where = answer.get("address") or url.hostname or index
        return Check("torch-companions", TITLE, "fail" if variant == "cpu" else "warn",
                     f"{what}, which {host.name} cannot reach ({answer['error']}); {refused}",
                     f"let {host.name} reach {where}, or set `torch_index:` under hosts.{host.name} "
                     f"to a mirror of it (`{{variant}}` stands for {variant})")
    missing = list(answer.get("missing") or ())
    has = "holds" if url.scheme == "file" else "reaches"
    if not missing:
        return Check("torch-companions", TITLE, "ok", f"{what}, which {host.name} {has}, listing +{variant} builds")
    sought = "; ".join(str((answer.get("sought") or {}).get(name)) for name in missing)
    return Check("torch-companions", TITLE, "fail" if variant == "cpu" else "warn",
                 f"{index} on {host.name} lists no +{variant} build of {_names(missing)} ({sought}); {refused}",
                 f"set `torch_index:` under hosts.{host.name} to an index that has "
                 f"{_verb(missing, 'them', 'it')} (`{{variant}}` stands for {variant}), or put the +{variant} "
                 f"wheels in {index}")


def _names(names: Sequence[str]) -> str:
    return " and ".join(names) if len(names) <= 2 else ", ".join(names[:-1]) + f" and {names[-1]}"


def _verb(names: Sequence[str], several: str, one: str) -> str:
    return one if len(names) == 1 else several
