"""`thrust-remote train JOB`: the whole pipeline; the core is thrust_remote.pipeline."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.markup import escape

from .. import pipeline
from ..console import console, err_console
from ..errors import ThrustError
from .common import get_config, open_runner
from .follow import exit_code_for, follow, reattach_command, say


class CliReporter:
    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def step(self, message: str) -> None:
        if not self.quiet:
            err_console.print(f"[cyan]›[/] {escape(message)}", highlight=False)

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False)


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
    as_json: bool = typer.Option(False, "--json", help="With --detach: print the run as JSON."),
) -> None:
    config = get_config(ctx)
    host_cfg = config.host(host)
    job_cfg = config.job(job)
    runner = open_runner(host_cfg)
    reporter = CliReporter(quiet=as_json)
    started = time.monotonic()
    try:
        request = pipeline.TrainRequest(job=job_cfg, host=host_cfg, gpus=gpus, nproc=nproc, sets=sets,
                                        params_file=params)
        launched = pipeline.start(config, request, runner, reporter)
        if detach:
            if as_json:
                typer.echo(json.dumps(launched.as_json()))
            else:
                console.print(f"run [bold]{launched.run_id}[/] started on {host_cfg.name} (pid {launched.pid})")
                console.print(f"follow it with: {reattach_command(launched.run_id, host_cfg)}", highlight=False)
            return
        say(f"following {launched.run_id} (Ctrl-C detaches; the run goes on)")
        status, _offset = follow(runner, host_cfg, launched.paths, launched.run_id)
        code = exit_code_for(status)
        if status["state"] != "FINISHED":
            say(f"run {launched.run_id} ended {status['state']} (exit code {status.get('exit_code')})")
            raise typer.Exit(code)
        if not no_fetch:
            reporter.step("fetching the model")
            result = pipeline.finish(config, runner, job_cfg, launched.run_dir, launched.paths, host_cfg.python)
            say(
                f"model: {result.model} ({result.bytes:,} bytes, sha256 {result.sha256[:12]}…), "
                f"manifest {result.manifest.name}; checked with onnx + onnxruntime"
            )
            say("see it play: thrust-remote play")
        say(f"done in {time.monotonic() - started:.1f} s")
    except ThrustError:
        raise
    finally:
        runner.close()
