"""`doctor` in order: one host's checklist (its safe fixes when asked, then the checklist again), or
every node's at once, each with its rendezvous row. The reports come back as data; what is shown
meanwhile (a fix's diff before it is written, the fixes tried) goes to the caller's callbacks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from envcheck.checks import CARGO_ONLY
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


# a requirement line naming one of PyTorch's companions (what pip reads: the name first)
_COMPANION = re.compile(r"^\s*(torchvision|torchaudio)(?![\w.-])", re.IGNORECASE | re.MULTILINE)
REACH_S = 5


def companion_row(runner: Runner, host: HostConfig, job: JobConfig | None, facts: dict, root: Path) -> Check | None:
    """`doctor --job`: a job whose requirements name torchvision / torchaudio, on a host whose torch is
    a variant build (`+cpu`, `+cu128`), gets those from the variant's index (run/venv.py): can the host
    reach it? A `+cpu` torch has no other source (PyPI's Linux builds are CUDA ones): a fail, as the
    run's setup would refuse; for a CUDA torch PyPI's build may fit: a warning."""
    if job is None or job.kind == "cargo":
        return None
    text = "\n".join(job.requirements)
    if job.requirements_file:
        with contextlib.suppress(OSError):  # a missing file: the preflight names it
            text += "\n" + (root / job.requirements_file).read_text(errors="replace")
    named = sorted({m.lower() for m in _COMPANION.findall(text)})
    torch = facts.get("torch")
    index = torch_index(host.torch_index, torch)
    url = urllib.parse.urlsplit(index or "")
    if not named or not index:
        return None
    if url.scheme == "file":
        return _file_index_row(runner, host, named, str(torch), index, urllib.parse.unquote(url.path))
    if url.scheme not in ("http", "https") or not url.hostname:
        return None
    port = url.port or (443 if url.scheme == "https" else 80)
    result, _ = payload.run_pyz(runner, host, payload.agent(), ["reach", url.hostname, str(port), "--timeout",
                                                                str(REACH_S)], timeout=REACH_S + 30, flags=("-S",))
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"ok": False, "error": (result.stderr or result.stdout).strip()[-200:]}
    what = f"{', '.join(named)} for torch {torch} come from {index}"
    title = "torch's companions for the host's torch"
    if answer.get("ok"):
        pages = {name: _agent_page(runner, host, f"{index.rstrip('/')}/{name}/") for name in named}
        return _listed_row(host, named, str(torch), index, pages, "reaches")
    variant = str(torch).partition("+")[2]
    return Check("torch-companions", title, "fail" if variant == "cpu" else "warn",
                 f"{what}, which {host.name} cannot reach ({answer.get('error')}); "
                 + ("PyPI's builds are CUDA ones: a run of this job is refused at its setup" if variant == "cpu"
                    else "a run uses PyPI's build only if it loads beside that torch"),
                 f"let {host.name} reach {url.hostname}:{port}, or set `torch_index:` under hosts.{host.name} "
                 f"to a mirror of it (`{{variant}}` stands for {variant})")


def _agent_page(runner: Runner, host: HostConfig, url: str) -> tuple[str | None, str]:
    """(the page's text, URL) as the host reads it, or (None, URL and why it could not)."""
    result, _ = payload.run_pyz(runner, host, payload.agent(), ["page", url, "--timeout", str(REACH_S)],
                                timeout=REACH_S + 30, flags=("-S",))
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"ok": False, "error": (result.stderr or result.stdout).strip()[-200:]}
    return (str(answer.get("text") or ""), url) if answer.get("ok") else (None, f"{url}: {answer.get('error')}")


def _file_index_row(runner: Runner, host: HostConfig, named: Sequence[str], torch: str, index: str,
                    path: str) -> Check:
    """A `torch_index:` on the host's own disk (file://, a mirror as PEP 503 lays it out: INDEX/NAME/
    index.html, the page pip reads there)."""
    pages: dict[str, tuple[str | None, str]] = {}
    for name in named:
        page = f"{path.rstrip('/')}/{name}/index.html"
        result = runner.run(["cat", "--", page], timeout=REACH_S + 30)
        why = result.stderr.strip().rpartition(": ")[2] or f"cat exited {result.exit_code}"
        pages[name] = (result.stdout, page) if result.exit_code == 0 else (None, f"{page}: {why}")
    return _listed_row(host, named, torch, index, pages, "holds")


def _listed_row(host: HostConfig, named: Sequence[str], torch: str, index: str,
                pages: dict[str, tuple[str | None, str]], has: str) -> Check:
    """Reaching the index says nothing of what it serves: each companion's page (its text, or where it
    was sought) must list a build for the torch's variant (`+cpu` in a wheel's name), which is what the
    run's setup will ask the index for (agent/venv.py fit_companions)."""
    variant = torch.partition("+")[2]
    missing = [name for name, (text, _) in pages.items() if f"+{variant}-" not in urllib.parse.unquote(text or "")]
    what = f"{', '.join(named)} for torch {torch} come from {index}"
    title = "torch's companions for the host's torch"
    if not missing:
        return Check("torch-companions", title, "ok", f"{what}, which {host.name} {has}, listing +{variant} builds")
    sought = "; ".join(where if pages[name][0] is None else f"{where} lists none"
                       for name in missing for where in [pages[name][1]])
    return Check("torch-companions", title, "fail" if variant == "cpu" else "warn",
                 f"{index} on {host.name} lists no +{variant} build of {', '.join(missing)} ({sought}); "
                 + ("PyPI's builds are CUDA ones: a run of this job is refused at its setup" if variant == "cpu"
                    else "a run uses PyPI's build only if it loads beside that torch"),
                 f"set `torch_index:` under hosts.{host.name} to an index that has them "
                 f"(`{{variant}}` stands for {variant}), or put the +{variant} wheels in {index}")
