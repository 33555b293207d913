"""`thrust-remote doctor [--host H] [--job J] [--json] [--fix]`: the GPU box checklist, with fixes."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import typer
from rich.table import Table

from thrust_remote.cli.common import get_config, get_fleet
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.console import console, err_console, host_text
from thrust_remote.core.errors import UsageError
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.doctor import checkup
from thrust_remote.doctor.checklist import FixResult
from thrust_remote.host.report import Check, Report

STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
MARK = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "skip"}


def register(app: typer.Typer) -> None:
    app.command("doctor", help="Check a host for everything GPU training needs; --fix applies the safe fixes.")(
        doctor
    )


def doctor(
    ctx: typer.Context,
    host: list[str] = typer.Option([], "--host", "-H", help="Host name from thrust.yaml; several (or a group): "
                                   "each one's checklist, and whether each node reaches the first one's rendezvous."),
    job: str | None = typer.Option(None, "--job", "-j", help="Also check this job (cargo jobs: the tch-rs build)."),
    as_json: bool = typer.Option(False, "--json", help="Print envcheck's JSON report."),
    fix: bool = typer.Option(False, "--fix", help="Apply the safe fixes (cargo clean, build.rs lines), then recheck."),
    fresh: bool = typer.Option(False, "--fresh", help="Import torch again even if the host kept a passing probe "
                               "(kept up to 10 min while its python, packages, driver and GPUs are unchanged)."),
    every: bool = typer.Option(False, "--all", help="Show every check: on a terminal the tch-rs (cargo) rows "
                               "are left out unless the project has a cargo job or --job names one."),
) -> None:
    config = get_config(ctx)
    hosts = config.host_list(host)
    job_cfg = config.job(job) if job else None
    if len(hosts) > 1:
        if fix:
            raise UsageError("--fix works on one host at a time", "give one --host with --fix")
        _doctor_nodes(ctx, hosts, job_cfg, as_json, fresh, every)
        return
    # JSON on stdout stays parseable: everything else goes to stderr in --json mode
    out = err_console if as_json else console
    show = None
    if fix:
        from rich.syntax import Syntax  # a fix's preview only: not on every command's start

        def show(check_id: str, preview: str) -> None:
            out.print(f"[bold]{check_id}[/]: writing this change")
            out.print(Syntax(preview, "diff", theme="ansi_dark", background_color="default"))

    report = checkup.one_host(get_fleet(ctx), hosts[0], job_cfg, fresh=fresh, fix=fix,
                              local_crate=_local_crate(config, job_cfg) if fix else None, show=show,
                              fixed=lambda results: _render_fixes(out, results))
    if as_json:
        typer.echo(json.dumps(report.to_json(), indent=2))
    else:
        render(report, _left_out(config, job_cfg, report, every), _why_left_out(config, job_cfg, hosts[0], bool(host)))
    raise typer.Exit(report.exit_code)


def _doctor_nodes(ctx: typer.Context, hosts: list[HostConfig], job_cfg: JobConfig | None, as_json: bool,
                  fresh: bool, every: bool) -> None:
    """Every node's checklist (at once), each with its rendezvous row; exit 1 when any fails."""
    config = get_config(ctx)
    reports = checkup.over_nodes(get_fleet(ctx), hosts, job_cfg, fresh=fresh)
    if as_json:
        typer.echo(json.dumps([r.to_json() for r in reports], indent=2))
    else:
        for report, node in zip(reports, hosts, strict=True):
            render(report, _left_out(config, job_cfg, report, every), _why_left_out(config, job_cfg, node, True))
    raise typer.Exit(max(r.exit_code for r in reports))


def _left_out(config: Config, job: JobConfig | None, report: Report, every: bool) -> list[Check]:
    """The rows a person at a terminal is spared: the tch-rs (cargo) checks' skips when no cargo job
    concerns this doctor (ten rows that say only "for tch-rs jobs"). A pipe, a log or --json keeps every
    check id, as scripts and `grep` expect (the ids are envcheck's contract)."""
    if every or not console.is_terminal or checkup.wants_cargo(config, job):
        return []
    return checkup.cargo_skips(report)


def _why_left_out(config: Config, job: JobConfig | None, host: HostConfig, named: bool) -> str:
    """Why the cargo rows are left out, and `thrust-remote doctor --all` (with the host when the user named
    one, and their --config) that shows them."""
    why = f"{job.name!r} is a {job.kind} job" if job else f"no cargo job in {config_file(host)}"
    every = command_hint("doctor", "--all", *(["--job", job.name] if job else []),
                         host=host.name if named else None, config=host.config_path)
    return f"({why}); every check: {every}"


def _local_crate(config: Config, job) -> Path | None:
    if job is None or job.kind != "cargo":
        return None
    crate = (config.root / job.crate).resolve()
    return crate if (crate / "Cargo.toml").is_file() else None


NARROW = 80  # below it a table folds paths and fix commands mid-token: the plain lines instead


def render(report: Report, left_out: Sequence[Check] = (), why: str = "") -> None:
    """The checklist and its summary line; `left_out` rows are neither shown nor counted: a line says
    how many, then `why` (and how to see them)."""
    if left_out:
        report = replace(report, checks=[c for c in report.checks if c not in left_out])
    if console.is_terminal and console.width >= NARROW:
        _render_table(report)
    else:
        _render_plain(report)
    facts = report.facts
    counts = report.counts()
    torch = f"torch {facts['torch']}" if facts.get("torch") else "no torch"
    summary = ", ".join(f"[{STYLE[s]}]{n} {s}[/]" for s, n in counts.items() if n)
    console.print(
        f"{summary} — {host_text(str(facts.get('python_path')))} (Python {facts.get('python')}, {torch}) "
        f"in {report.wall_s:.2f} s" + (" (envcheck uploaded)" if report.uploaded else ""),
        highlight=False, soft_wrap=True,
    )
    if left_out:
        console.print(f"{len(left_out)} tch-rs (cargo) checks left out {why}", style="dim", highlight=False,
                      markup=False, soft_wrap=True)


def _render_plain(report: Report) -> None:
    """Without a terminal (a pipe, CI, a log), or on a narrow one: a line per check and one per fix,
    never folded by us, so a path or a fix command pastes back whole and `grep fail` finds the check."""
    width = max((len(c.id) for c in report.checks), default=5)
    typer.echo(f"doctor: {host_text(report.host, markup=False)}")
    for c in report.checks:
        detail = host_text(" ".join(c.detail.split()), markup=False)
        typer.echo(f"{MARK.get(c.status, c.status):<4}  {c.id:<{width}}  {detail}")
        if c.fix and c.status in ("fail", "warn"):
            typer.echo(f"{'':<4}  {'':<{width}}  fix: {host_text(' '.join(c.fix.split()), markup=False)}")


def _render_table(report: Report) -> None:
    table = Table(title=f"doctor: {host_text(report.host)}", title_justify="left", show_lines=False, expand=False)
    table.add_column("", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("evidence / fix", overflow="fold")
    for c in report.checks:
        style = STYLE.get(c.status, "")
        text = host_text(c.detail, lines=True)
        if c.fix and c.status in ("fail", "warn"):
            text += f"\n[bold]fix:[/] [cyan]{host_text(c.fix, lines=True)}[/]"
        table.add_row(f"[{style}]{MARK.get(c.status, c.status)}[/]", f"[{style}]{c.id}[/]", text)
    console.print(table)


def _render_fixes(out, results: list[FixResult]) -> None:
    if not results:
        out.print("--fix: nothing to fix automatically")
        return
    for r in results:
        mark = "[green]fixed[/]" if r.applied else "[yellow]not applied[/]"
        out.print(f"{mark} {host_text(r.check_id)}: {host_text(r.action)} — {host_text(r.detail)}", highlight=False)
        if r.output and not r.applied:
            out.print(host_text(r.output, lines=True), style="dim")
