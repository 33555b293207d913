"""`thrust-remote train JOB`: the run's whole life is lifecycle.train; this module only renders.

`logs RUN --follow` (cli/runs.py) ends a reattached train run through the same `show_outcome`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console

from thrust_remote.agent.protocol import MANIFEST, RunState
from thrust_remote.cli.common import get_config, open_runner, state
from thrust_remote.cli.follow import LogReporter, reattach_command, say
from thrust_remote.cli.kept import command, render_fetched, say_line
from thrust_remote.core.console import console, err_console, host_text
from thrust_remote.play import PLAYABLE_ENVS
from thrust_remote.run import lifecycle, multinode, pipeline, resume


class CliReporter(LogReporter):
    """Steps and warnings on stderr; a followed log as LogReporter renders it."""

    def __init__(self, quiet: bool = False, fancy: bool | None = None, *, out: Console | None = None,
                 raw: bool = False) -> None:
        super().__init__(fancy, out=out, raw=raw)
        self.quiet = quiet

    def step(self, message: str) -> None:
        if not self.quiet:
            # soft_wrap: a path in a step stays one line to copy, whatever the width
            err_console.print(f"[cyan]›[/] {host_text(message, lines=True)}", highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/] {host_text(message, lines=True)}", highlight=False)

    def following(self, run_id: str, offset: int) -> None:
        say(f"following {run_id} (Ctrl-C detaches; the run goes on)")
        super().following(run_id, offset)


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
    share_gpus: bool = typer.Option(False, "--allow-shared-gpus",
                                    help="Run on --gpus that a RUNNING run already holds (refused otherwise)."),
    queue: bool = typer.Option(False, "--queue", help="When its GPUs (or, without GPUs, the host's cpu_slots) "
                               "are taken by running runs, wait in the host's queue and start by itself when "
                               "they free (refused otherwise)."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE: a job argument, --KEY VALUE (a command job: "
                                   "the word KEY=VALUE); KEY alone or KEY=true: a bare --KEY; KEY=false: left "
                                   "out; repeatable."),
    params: Path | None = typer.Option(None, "--params", help="YAML of parameters (e.g. optimize's best)."),
    detach: bool = typer.Option(False, "--detach", help="Return once the run has started."),
    no_fetch: bool = typer.Option(False, "--no-fetch", help="Do not fetch the model when the run finishes."),
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
) -> None:
    config = get_config(ctx)
    hosts = config.host_list(host)
    request = pipeline.TrainRequest(job=config.job(job), host=hosts[0], gpus=gpus, nproc=nproc, sets=sets,
                                    params_file=params, detach=detach, fetch=not no_fetch, force=force,
                                    share_gpus=share_gpus, queue=queue, sync_every=sync_every)
    lifecycle.check_request(request, hosts, max_restarts)  # before anything connects
    started = time.monotonic()
    # --json: stdout carries the one JSON object; the progress view goes to stderr
    reporter = CliReporter(quiet=as_json, out=err_console if as_json else None)
    _check_following(request, retry, sync_every, reporter)


    def first() -> pipeline.TrainOutcome:
        sessions = multinode.open_sessions(config, hosts, open_runner)
        try:
            return lifecycle.train(config, request, sessions, reporter, max_restarts=max_restarts,
                                   config_path=state(ctx).config_path)
        finally:
            for session in sessions:
                session.close()

    if detach:
        outcome = first()
    else:
        from thrust_remote.cli.resume import followed_with_retry  # it imports this module

        outcome = followed_with_retry(ctx, request.job, retry, reporter, first, sync_every)
    show_outcome(ctx, outcome, as_json, started)


def _check_following(request: pipeline.TrainRequest, retry: int | None, sync_every: float | None,
                     reporter: CliReporter) -> None:
    """--retry needs a job that can continue from a checkpoint (64 now, not when a host dies hours in);
    --retry and --sync-every act while a run is followed: with --detach, nothing does (said)."""
    if request.detach and (retry or sync_every is not None):
        given = " and ".join(f for f, v in (("--retry", retry), ("--sync-every", sync_every)) if v is not None)
        reporter.warn(f"{given}: acted on while a run is followed, and with --detach nothing follows it; "
                      "`thrust-remote watch RUN` follows it with its retries (and pulls), `logs RUN -f` with pulls")
    elif retry:
        resume.template_of(request.job)


def show_outcome(ctx: typer.Context, outcome: pipeline.TrainOutcome, as_json: bool, started: float) -> None:
    """How a train run ends on screen (train, and `logs -f` of a train run); raises typer.Exit with the
    job's exit code when it did not finish. Over several hosts, the node that failed first is named
    with the end of its log (node 0's was on screen)."""
    launched = outcome.launched
    host_cfg = get_config(ctx).host(launched.host)  # node 0's, where the hints lead
    config_path = state(ctx).config_path
    failed = (outcome.status or {}).get("failed_node")
    if failed and not as_json:
        say(f"node {failed['node']} ({failed['host']}) failed first: {failed.get('why')}")
        if failed.get("log_tail"):
            say(f"the end of node {failed['node']}'s log:\n{failed['log_tail'].rstrip()}")
    if outcome.status is None:  # detached
        if as_json:
            typer.echo(json.dumps(launched.as_json()))
        else:
            if launched.pid is None:
                console.print(f"run [bold]{launched.run_id}[/] queued on {host_cfg.name} (position "
                              f"{host_text(launched.position)}): it starts there by itself when what it asks frees")
            else:
                console.print(f"run [bold]{launched.run_id}[/] started on {host_cfg.name} "
                              f"(pid {host_text(launched.pid)})")
            console.print(f"follow it with: {reattach_command(launched.run_id, host_cfg, None, config_path)}",
                          highlight=False, soft_wrap=True)
        return
    if as_json:  # docs/architecture.md, "JSON shapes": the one object on stdout, whatever the end
        typer.echo(json.dumps(outcome.as_json(time.monotonic() - started)))
        if outcome.exit_code:
            raise typer.Exit(outcome.exit_code)
        return
    status = outcome.status
    if outcome.attempts:  # a retried run: where it went on, after how many tries
        first, last = outcome.attempts[0], outcome.attempts[-1]
        tries = len(outcome.attempts) - 1
        chain = " -> ".join(f"{a['run_id']} ({a['state']})" for a in outcome.attempts)
        say(f"run {first['run_id']} went on as {last['run_id']} on {last['host']} after {tries} "
            f"retr{'y' if tries == 1 else 'ies'}: {chain}")
    if status["state"] != RunState.FINISHED:
        say(f"run {launched.run_id} ended {status['state']} (exit code {status.get('exit_code')})")
        if outcome.fetchable:  # it left a model behind: the user decides, nothing is placed by itself
            say("its model was not fetched")
            say_line(f"keep it (not placed): {command(ctx, 'fetch', launched.run_id, host=host_cfg.name)}")
            say_line(f"place it anyway: {command(ctx, 'fetch', launched.run_id, '--force', host=host_cfg.name)}")
        raise typer.Exit(outcome.exit_code)
    result = outcome.fetched
    if result is not None:
        render_fetched(ctx, result, host_cfg.name, get_config(ctx).root)
        env = _manifest_env(result.kept / MANIFEST)
        if env in PLAYABLE_ENVS:
            say("see it play: thrust-remote play")
        else:
            say(f"(the browser page plays {', '.join(PLAYABLE_ENVS)} only: this {env} model is kept, not playable "
                "there)")
    elif outcome.fetchable:
        say(f"not fetched; fetch the model with: {pipeline.fetch_command(launched.run_id, host_cfg, config_path)}")
    say(f"done in {time.monotonic() - started:.1f} s")


def _manifest_env(path: Path) -> str | None:
    try:
        env = json.loads(path.read_text()).get("env")
    except (OSError, ValueError, AttributeError):
        return None
    return env if isinstance(env, str) else None
