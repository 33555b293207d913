"""`thrust-remote train JOB`: the whole pipeline is pipeline.train; this module only renders.

`logs RUN --follow` (cli/runs.py) ends a reattached train run through the same `show_outcome`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from .. import pipeline
from ..config import HostConfig
from ..console import console, err_console
from ..session import HostSession
from .common import get_config, open_runner, state
from .follow import LogReporter, reattach_command, say


class CliReporter(LogReporter):
    """Steps and warnings on stderr; a followed log as LogReporter renders it."""

    def __init__(self, quiet: bool = False, fancy: bool | None = None, *, out: Console | None = None,
                 raw: bool = False) -> None:
        super().__init__(fancy, out=out, raw=raw)
        self.quiet = quiet

    def step(self, message: str) -> None:
        if not self.quiet:
            err_console.print(f"[cyan]›[/] {escape(message)}", highlight=False)

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)

    def following(self, run_id: str, offset: int) -> None:
        say(f"following {run_id} (Ctrl-C detaches; the run goes on)")
        super().following(run_id, offset)


def register(app: typer.Typer) -> None:
    app.command("train", help="Sync the code, set up the host, run the job detached, follow it, fetch the model.")(
        train
    )


def train(
    ctx: typer.Context,
    job: str = typer.Argument(..., help="Job name: snake, cartpole, or one from thrust.yaml."),
    host: str | None = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml (default: default_host)."),
    gpus: str | None = typer.Option(None, "--gpus", help="N (the first N free GPUs) or a list like 0,2."),
    nproc: int | None = typer.Option(None, "--nproc", help="Processes under torchrun (default: one per GPU)."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE: override a trainer flag (repeatable)."),
    params: Path | None = typer.Option(None, "--params", help="YAML of parameters (e.g. optimize's best)."),
    detach: bool = typer.Option(False, "--detach", help="Return once the run has started."),
    no_fetch: bool = typer.Option(False, "--no-fetch", help="Do not fetch the model when the run finishes."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object (with --detach: the "
                                 "started run); progress goes to stderr."),
) -> None:
    config = get_config(ctx)
    host_cfg = config.host(host)
    job_cfg = config.job(job)
    config_path = state(ctx).config_path  # repeated in every command a hint names
    runner = open_runner(host_cfg)
    started = time.monotonic()
    try:
        request = pipeline.TrainRequest(job=job_cfg, host=host_cfg, gpus=gpus, nproc=nproc, sets=sets,
                                        params_file=params, detach=detach, fetch=not no_fetch)
        session = HostSession.open(runner, host_cfg, config)
        # --json: stdout carries the one JSON object; the progress view goes to stderr
        reporter = CliReporter(quiet=as_json, out=err_console if as_json else None)
        outcome = pipeline.train(config, request, session, reporter, config_path=config_path)
    finally:
        runner.close()
    _render(outcome, host_cfg, as_json, started, config_path)


def show_outcome(outcome: pipeline.TrainOutcome, host_cfg: HostConfig, as_json: bool, started: float,
                 config_path: Path | None = None) -> None:
    """How a followed train run ends on screen (train, and `logs -f` of a train run); raises typer.Exit
    with the job's exit code when it did not finish."""
    _render(outcome, host_cfg, as_json, started, config_path)


def _render(outcome: pipeline.TrainOutcome, host_cfg: HostConfig, as_json: bool, started: float,
            config_path: Path | None = None) -> None:
    launched = outcome.launched
    if outcome.status is None:  # detached
        if as_json:
            typer.echo(json.dumps(launched.as_json()))
        else:
            console.print(f"run [bold]{launched.run_id}[/] started on {host_cfg.name} (pid {launched.pid})")
            console.print(f"follow it with: {reattach_command(launched.run_id, host_cfg, None, config_path)}",
                          highlight=False, soft_wrap=True)
        return
    if as_json:  # docs/architecture.md, "JSON shapes": the one object on stdout, whatever the end
        typer.echo(json.dumps(outcome.as_json(time.monotonic() - started)))
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
        return
    status = outcome.status
    if status["state"] != "FINISHED":
        say(f"run {launched.run_id} ended {status['state']} (exit code {status.get('exit_code')})")
        raise typer.Exit(outcome.exit_code)
    result = outcome.fetched
    if result is not None:
        say(
            f"model: {result.model} ({result.bytes:,} bytes, sha256 {result.sha256[:12]}…), "
            f"manifest {result.manifest.name}; checked with onnx + onnxruntime"
        )
        say("see it play: thrust-remote play")
    elif outcome.fetchable:
        say(f"not fetched; fetch the model with: {pipeline.fetch_command(launched.run_id, host_cfg, config_path)}")
    say(f"done in {time.monotonic() - started:.1f} s")
