"""How a run reaches the screen: `CliReporter` (steps, warnings and a followed log, as the run's
Reporter is told them) and `show_outcome` (how a followed run ends: `train`, `logs -f`, `resume`, `watch`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console

from thrust_remote.agent.protocol import MANIFEST, USER_STOP, RunState, StatusAnswer
from thrust_remote.backends import backend_for
from thrust_remote.cli.common import get_config, loaded_config, state
from thrust_remote.cli.follow import LogReporter, reattach_command, run_time, say
from thrust_remote.cli.kept import command, render_fetched, say_line
from thrust_remote.core.config import JobConfig
from thrust_remote.core.console import console, err_console, host_text
from thrust_remote.play import PLAYABLE_ENVS
from thrust_remote.run import fetching, vocab
from thrust_remote.run.vocab import TrainOutcome
from thrust_remote.runs import index


def why_ended(status: StatusAnswer, *, detail: bool = True) -> str:
    """` [reason: detail]` of a run that did not end by itself or by `stop` (the idle-GPU stop, its
    max_duration:, a scheduler's word on it); "" otherwise. Every line that says how a run ended says it."""
    reason = status.get("reason")
    if not reason or reason == USER_STOP:
        return ""
    said = status.get("reason_detail") if detail else ""
    return f" [{reason}{': ' + said if said else ''}]"


class CliReporter(LogReporter):
    """Steps and warnings on stderr; a followed log as LogReporter renders it.

    The `›` stages are shown with --json as well: they go to stderr, never to the stdout that carries
    the JSON, and a script (or its user) waiting on a long sync or set-up needs them as much as a
    person does."""

    def __init__(self, fancy: bool | None = None, *, out: Console | None = None, raw: bool = False) -> None:
        super().__init__(fancy, out=out, raw=raw)

    def step(self, message: str) -> None:
        # soft_wrap: a path in a step stays one line to copy, whatever the width
        err_console.print(f"[cyan]›[/] {host_text(message, lines=True)}", highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/] {host_text(message, lines=True)}", highlight=False)

    def note(self, message: str) -> None:
        say(message)

    def following(self, run_id: str, offset: int) -> None:
        say(f"following {run_id} (Ctrl-C detaches; the run goes on)")
        job = followed_job(run_id)
        if job is not None:  # what the live line leads with, and whether a pattern reads its metrics
            self.objective = job.objective.metric if job.objective is not None else None
            self.pattern = bool(job.metrics.pattern)
        super().following(run_id, offset)


def followed_job(run_id: str) -> JobConfig | None:
    """The job of a followed run, as this project's thrust.yaml has it (the local index names it): what
    every command that follows a run (train, logs -f, resume, watch, optimize) shows its progress by,
    without each handing it over; None outside a command or for a run or job this config lacks."""
    config = loaded_config()
    if config is None:
        return None
    entry = index.lookup(config.root, run_id)
    return config.jobs.get(entry.job) if entry is not None else None


def show_outcome(ctx: typer.Context, outcome: TrainOutcome, as_json: bool, started: float) -> None:
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
            if launched.scheduler_job:
                console.print(f"run [bold]{launched.run_id}[/] submitted to {backend_for(host_cfg).scheduler} on "
                              f"{host_cfg.name} as job "
                              f"{host_text(launched.scheduler_job)}: it starts when the scheduler gives it its nodes")
            elif launched.pid is None:
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
        code = status.get("exit_code")
        say(f"run {launched.run_id} ended {status['state']}{'' if code is None else f' (exit code {code})'}"
            f"{why_ended(status)}{vocab.disk_note(status)}")
        if outcome.fetchable:  # it left a model behind: the user decides, nothing is placed by itself
            say("its model was not fetched")
            say_line(f"keep it (not placed): {command(ctx, 'fetch', launched.run_id, host=host_cfg.name)}")
            say_line(f"place it anyway: {command(ctx, 'fetch', launched.run_id, '--force', host=host_cfg.name)}")
        say_next(outcome)
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
        say(f"not fetched; fetch the model with: {fetching.fetch_command(launched.run_id, host_cfg, config_path)}")
    # said outright: a run that ends quietly (no model, no metrics) must not look like one still going
    say(f"FINISHED: run {launched.run_id} on {host_cfg.name}, done in {run_time(time.monotonic() - started)}")


def say_next(outcome: TrainOutcome) -> None:
    """What to type after an end other than FINISHED (run/endings.py), one line each."""
    for line in outcome.next_steps:
        say(f"next: {line}")


def _manifest_env(path: Path) -> str | None:
    try:
        env = json.loads(path.read_text()).get("env")
    except (OSError, ValueError, AttributeError):
        return None
    return env if isinstance(env, str) else None
