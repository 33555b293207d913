"""`resume RUN` and `watch RUN`: runs that outlive their host (the Run handle sequences: run/handle.py,
run/resume.py; this module parses the options and renders).

`train` with a retry policy is the same chain (run/handle.train): the run, then each retry, followed as one."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from thrust_remote.cli.common import HOST_OPT, MAX_DURATION_HELP, get_config, get_fleet, max_duration_of
from thrust_remote.cli.outcome import CliReporter, show_outcome
from thrust_remote.core.console import err_console
from thrust_remote.run.handle import Run

SYNC_HELP = ("Seconds between pulls of the run's newest checkpoint and changed artifacts while it is followed "
             "(default: the job's sync_every:, else 300; 0: off).")
RETRY_HELP = ("Resume the run from its newest checkpoint up to N times when its host stops answering or it "
              "ends LOST (the job's retry: says more: on, hosts).")


def register(app: typer.Typer) -> None:
    app.command("resume", help="A new run of RUN's job at RUN's code, from its newest checkpoint (on its host, or "
                "the one pulled here), on its host or --host.")(resume_cmd)
    app.command("watch", help="Follow a run and its retries: resumed from its newest checkpoint when its host "
                "stops answering or it ends LOST (the job's retry:, or --retry N).")(watch)


def resume_cmd(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN_ID", help="The run to continue."),
    host: list[str] = typer.Option([], "--host", "-H", help="Where the new run goes (repeat it, or name a group, "
                                   "for several hosts; node 0 gets the checkpoint). Default: the run's own."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE: change a job argument for the continuation "
                                   "(as train --set: KEY alone or KEY=true: a bare --KEY; KEY=false: left out); a "
                                   "word that starts with - (--set=-m, Hydra's multirun): passed as it is, first; "
                                   "repeatable."),
    params: Path | None = typer.Option(None, "--params", help="YAML of parameters for the continuation."),
    detach: bool = typer.Option(False, "--detach", help="Return once the new run has started."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as train --json does."),
    force: bool = typer.Option(False, "--force", help="Resume a run that is still RUNNING (it goes on beside)."),
    sync_every: float | None = typer.Option(None, "--sync-every", min=0, help=SYNC_HELP),
    retry: int | None = typer.Option(None, "--retry", min=0, help=RETRY_HELP),
    max_duration: str | None = typer.Option(None, "--max-duration", metavar="DURATION", help=MAX_DURATION_HELP),
) -> None:
    config = get_config(ctx)
    bound = max_duration_of(max_duration)
    started = time.monotonic()
    reporter = CliReporter(out=err_console if as_json else None)
    targets = [h.name for h in config.host_list(host)] if host else []
    outcome = Run(get_fleet(ctx), run_id).resume(reporter, hosts=targets, sets=sets, params=params, detach=detach,
                                                 force=force, sync_every=sync_every, retry=retry,
                                                 max_duration=bound)
    show_outcome(ctx, outcome, as_json, started)


def watch(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN_ID"),
    host: str | None = HOST_OPT,
    sync_every: float | None = typer.Option(None, "--sync-every", min=0, help=SYNC_HELP),
    retry: int | None = typer.Option(None, "--retry", min=0, help=RETRY_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the last run's result as train --json does."),
) -> None:
    """Follow RUN (as `logs -f`) and, by the job's retry policy, each run that resumes it."""
    fleet = get_fleet(ctx)
    started = time.monotonic()
    reporter = CliReporter(out=err_console if as_json else None)
    outcome = Run(fleet, run_id, host).watch(reporter, retry=retry, sync_every=sync_every)
    show_outcome(ctx, outcome, as_json, started)
