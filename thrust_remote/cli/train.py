"""`thrust-remote train JOB`: the run's whole life is run/handle.train (lifecycle.train, then its
retries); this module parses the options and renders (cli/outcome.py: how a run ends on screen).

`logs RUN --follow` (cli/runs.py) ends a reattached train run through the same `show_outcome`."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import typer

from thrust_remote.cli.common import MAX_DURATION_HELP, get_config, get_fleet, max_duration_of
from thrust_remote.cli.outcome import CliReporter, show_outcome
from thrust_remote.core.config import JobConfig
from thrust_remote.core.console import err_console
from thrust_remote.run import handle
from thrust_remote.run.vocab import TrainRequest


def register(app: typer.Typer) -> None:
    app.command("train", help="Sync the code, set up the host, run the job detached, follow it, fetch the model.")(
        train
    )


def train(
    ctx: typer.Context,
    job: str = typer.Argument(..., metavar="JOB", help="Job name: snake, cartpole, or one from thrust.yaml."),
    host: list[str] = typer.Option([], "--host", "-H", help="Host name from thrust.yaml (default: default_host); "
                                   "repeat it (or name a group) for one run over several hosts; the first "
                                   "serves the rendezvous."),
    gpus: str | None = typer.Option(None, "--gpus", help="N (the first N free GPUs) or a list like 0,2."),
    nproc: int | None = typer.Option(None, "--nproc", min=1, help="Processes under torchrun (default: one per GPU)."),
    nodes: int = typer.Option(1, "--nodes", min=1, help="A cluster's scheduler: nodes of one run, torchrun across them "
                              "(its rendezvous on the first)."),
    share_gpus: bool = typer.Option(False, "--allow-shared-gpus",
                                    help="Run on --gpus that a RUNNING run already holds (refused otherwise)."),
    queue: bool = typer.Option(False, "--queue", help="When its GPUs (or, without GPUs, the host's cpu_slots) "
                               "are taken by running runs, wait in the host's queue and start by itself when "
                               "they free (refused otherwise)."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE: a job argument, --KEY VALUE (a command job: "
                                   "the word KEY=VALUE); KEY alone or KEY=true: a bare --KEY; KEY=false: left "
                                   "out; a word that starts with - (--set=-m, Hydra's multirun): passed as it "
                                   "is, first; repeatable."),
    params: Path | None = typer.Option(None, "--params", help="YAML of parameters (e.g. optimize's best)."),
    detach: bool = typer.Option(False, "--detach", help="Return once the run has started."),
    no_fetch: bool = typer.Option(False, "--no-fetch", help="Bring nothing at the run's end (model, checkpoint, "
                                  "artifacts); `fetch RUN_ID` brings them later."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object (with --detach: the "
                                 "started run); progress goes to stderr."),
    force: bool = typer.Option(False, "--force", help="Place the new model in web/public even when it scores "
                               "clearly worse than the placed one (it is kept in .thrust/fetched/ either way)."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="Several hosts: torchrun restarts every "
                                     "node's workers this often after a failure (they resume from the latest "
                                     "checkpoint)."),
    sync_every: float | None = typer.Option(None, "--sync-every", min=0, help="Seconds between pulls of the run's "
                                            "newest checkpoint and changed artifacts while it is followed (default: "
                                            "the job's sync_every:, else 300; 0: off)."),
    retry: int | None = typer.Option(None, "--retry", min=0, help="Resume the run from its newest checkpoint up to "
                                     "N times when its host stops answering or it ends LOST (the job's retry: "
                                     "says more: on, hosts)."),
    max_duration: str | None = typer.Option(None, "--max-duration", metavar="DURATION", help=MAX_DURATION_HELP),
) -> None:
    config = get_config(ctx)
    hosts = config.host_list(host)
    request = TrainRequest(job=_bounded(config.job(job), max_duration), host=hosts[0], gpus=gpus, nproc=nproc,
                           sets=sets, params_file=params, detach=detach, fetch=not no_fetch, force=force,
                           share_gpus=share_gpus, queue=queue,
                           sync_every=sync_every, nodes=nodes)
    started = time.monotonic()
    # --json: stdout carries the one JSON object; the progress view goes to stderr
    reporter = CliReporter(out=err_console if as_json else None)
    outcome = handle.train(get_fleet(ctx), request, hosts, reporter, max_restarts=max_restarts, retry=retry)
    show_outcome(ctx, outcome, as_json, started)



def _bounded(job: JobConfig, max_duration: str | None) -> JobConfig:
    """The job with `--max-duration` in place of its own `max_duration:`."""
    seconds = max_duration_of(max_duration)
    return job if seconds is None else dataclasses.replace(job, max_duration=seconds)
