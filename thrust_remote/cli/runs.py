"""`runs`, `status`, `logs`, `stop`, `fetch`: the detached runs on a host."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from .. import pipeline, runs
from ..console import console
from ..errors import ThrustError
from ..session import HostSession
from .common import get_config, open_runner
from .follow import exit_code_for, follow, say

HOST_OPT = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml (default: default_host).")
STATE_STYLE = {"RUNNING": "cyan", "FINISHED": "green", "FAILED": "red", "LOST": "yellow", "STOPPED": "magenta"}


def register(app: typer.Typer) -> None:
    app.command("runs", help="List the runs on a host.")(list_runs)
    app.command("status", help="State of one run: RUNNING, FINISHED, FAILED, STOPPED or LOST.")(status)
    app.command("logs", help="Print a run's log from a byte offset; --follow until it ends.")(logs)
    app.command("stop", help="Stop a run: TERM its process group, KILL after a grace period.")(stop)
    app.command("fetch", help="Fetch a finished run's model into web/public (verified).")(fetch)


def _open(ctx: typer.Context, host: str | None) -> HostSession:
    config = get_config(ctx)
    host_cfg = config.host(host)
    runner = open_runner(host_cfg)
    try:
        return HostSession.open(runner, host_cfg, config)
    except BaseException:
        runner.close()
        raise


def list_runs(ctx: typer.Context, host: str | None = HOST_OPT,
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    session = _open(ctx, host)
    try:
        items = runs.list_runs(session)
    finally:
        session.runner.close()
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    table = Table("job", "state", "exit", "started", "ended", "commit")
    table.add_column("run", no_wrap=True)
    for r in items:
        style = STATE_STYLE.get(r["state"], "")
        code = r.get("exit_code")
        table.add_row(r.get("job") or "", f"[{style}]{r['state']}[/]", "" if code is None else str(code),
                      r.get("started_at") or "", r.get("ended_at") or "", (r.get("commit") or "")[:12], r["run_id"])
    console.print(table)


def status(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    session = _open(ctx, host)
    try:
        st = runs.status(session, runs.check_run_id(run_id))
    finally:
        session.runner.close()
    if as_json:
        typer.echo(json.dumps(st))
        return
    style = STATE_STYLE.get(st["state"], "")
    code = f" (exit code {st['exit_code']})" if st.get("exit_code") is not None else ""
    console.print(f"{st['run_id']}: [{style}]{st['state']}[/]{code}  job={st.get('job')} pid={st.get('pid')} "
                  f"started={st.get('started_at')} commit={(st.get('commit') or '')[:12]}")


def logs(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
         follow_: bool = typer.Option(False, "--follow", "-f", help="Keep following until the run ends."),
         offset: int = typer.Option(0, "--offset", min=0, help="Start at this byte of the log.")) -> None:
    session = _open(ctx, host)
    runs.check_run_id(run_id)
    try:
        if follow_:
            st, _ = follow(session, run_id, offset=offset, fancy=False)
            code = exit_code_for(st)
            if code:
                say(f"run {run_id} ended {st['state']} (exit code {st.get('exit_code')})")
            raise typer.Exit(code)
        import sys

        runs.status(session, run_id)  # a clear error for an unknown id
        runs.follow_log(session, run_id, offset=offset, follow=False,
                        on_bytes=lambda b: (sys.stdout.buffer.write(b), sys.stdout.buffer.flush()))
    finally:
        session.runner.close()


def stop(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
         grace: float = typer.Option(10.0, "--grace", help="Seconds between TERM and KILL.")) -> None:
    session = _open(ctx, host)
    try:
        answer = runs.stop(session, runs.check_run_id(run_id), grace)
    finally:
        session.runner.close()
    if answer.get("stopped"):
        how = "killed after the grace period" if answer.get("killed") else "stopped"
        console.print(f"{run_id}: {how} ({answer.get('state')})")
    else:
        console.print(f"{run_id}: not running ({answer.get('state')})")


def fetch(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
          force: bool = typer.Option(False, "--force", help="Place the model in web/public even when its run did "
                                     "not FINISH or it scores clearly worse than the placed one.")) -> None:
    config = get_config(ctx)
    session = _open(ctx, host)
    try:
        st = runs.status(session, runs.check_run_id(run_id))
        job_name = st.get("job")
        if not job_name:
            raise ThrustError(f"run {run_id} has no job recorded")
        result = pipeline.finish(config, session, config.job(job_name), session.paths.run(run_id), run_id=run_id,
                                 status=st, force=force)
    finally:
        session.runner.close()
    from .kept import render_fetched

    render_fetched(ctx, result, session.name, config.root)
    typer.echo(result.model)  # the placed model, or the kept one when not placed
