"""`resume RUN` and `watch RUN`: runs that outlive their host (run/resume.py sequences; this renders).

`train` with a retry policy comes here too (`followed_with_retry`): the run, then each retry, followed
as one chain."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import typer

from thrust_remote.cli.common import get_config, open_runner, state
from thrust_remote.cli.follow import say
from thrust_remote.cli.runs import HOST_OPT, open_session, opener
from thrust_remote.cli.train import CliReporter, show_outcome
from thrust_remote.core.config import Config, JobConfig
from thrust_remote.core.console import err_console
from thrust_remote.core.errors import UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.run import lifecycle, multinode, resume
from thrust_remote.run.vocab import TrainOutcome, TrainRequest
from thrust_remote.runs import control, index

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
                                   "(as train --set); repeatable."),
    params: Path | None = typer.Option(None, "--params", help="YAML of parameters for the continuation."),
    detach: bool = typer.Option(False, "--detach", help="Return once the new run has started."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as train --json does."),
    force: bool = typer.Option(False, "--force", help="Resume a run that is still RUNNING (it goes on beside)."),
    sync_every: float | None = typer.Option(None, "--sync-every", min=0, help=SYNC_HELP),
    retry: int | None = typer.Option(None, "--retry", min=0, help=RETRY_HELP),
) -> None:
    config = get_config(ctx)
    started = time.monotonic()
    reporter = CliReporter(quiet=as_json, out=err_console if as_json else None)
    targets = [h.name for h in config.host_list(host)] if host else []
    source = resume.plan(config, run_id, lambda name: open_session(ctx, name), reporter, hosts=targets, force=force)
    for note in source.notes:
        reporter.warn(note)
    reporter.step(f"resuming run {run_id} ({source.job.name}) from checkpoint {source.resume.label} "  # type: ignore[union-attr]
                  f"on {', '.join(source.hosts)}")
    make = _attempts(ctx, config, reporter, sets=sets, params=params, detach=detach, sync_every=sync_every)
    policy = None if detach else resume.policy_for(source.job, retry)
    if policy is None:
        outcome = make(source)
    else:
        outcome = _chain(ctx, config, policy, reporter, make, sync_every).run(lambda: make(source))
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
    config = get_config(ctx)
    started = time.monotonic()
    reporter = CliReporter(quiet=as_json, out=err_console if as_json else None)
    run_id = control.check_run_id(run_id)
    name = index.resolve_host(config, run_id, host) or config.default_host
    entry = index.lookup(config.root, run_id)
    job = config.jobs.get(entry.job) if entry else None
    if job is None:
        with open_session(ctx, name) as session:
            job = config.jobs.get(str(control.status(session, run_id).get("job") or ""))
    if job is None:
        raise UsageError(f"run {run_id}'s job is not one of this config's: there is nothing to retry it as",
                         f"follow it with: thrust-remote logs {run_id} --follow --host {name}")
    follow = _reattach(ctx, config, reporter, sync_every)
    policy = resume.policy_for(job, retry)
    if policy is None:
        reporter.warn(f"job {job.name} has no retry policy (`retry:` or --retry N): this follows run {run_id} only")
        outcome = follow(run_id, name)
    else:
        resume.template_of(job)  # a job that cannot continue from a checkpoint: 64 now, not when a host dies
        make = _attempts(ctx, config, reporter, sync_every=sync_every)
        outcome = _chain(ctx, config, policy, reporter, make, sync_every).run(lambda: follow(run_id, name))
    show_outcome(ctx, outcome, as_json, started)


def followed_with_retry(ctx: typer.Context, job: JobConfig, given: int | None, reporter: CliReporter,
                        first: Callable[[], TrainOutcome], sync_every: float | None) -> TrainOutcome:
    """`train` attached: the run, and by the job's retry policy (or --retry N) its retries."""
    policy = resume.policy_for(job, given)
    if policy is None:
        return first()
    config = get_config(ctx)
    make = _attempts(ctx, config, reporter, sync_every=sync_every)
    return _chain(ctx, config, policy, reporter, make, sync_every).run(first)


def _attempts(ctx: typer.Context, config: Config, reporter: CliReporter, *, sets: list[str] | None = None,
              params: Path | None = None, detach: bool = False,
              sync_every: float | None = None) -> Callable[[resume.Source], TrainOutcome]:
    """A resumed run started (and followed unless detached) from a plan."""

    def make(source: resume.Source) -> TrainOutcome:
        hosts = config.host_list(list(source.hosts))
        request: TrainRequest = resume.request_for(source, hosts[0], sets=sets or [], params_file=params,
                                                   detach=detach, sync_every=sync_every)
        lifecycle.check_request(request, hosts)
        sessions = multinode.open_sessions(config, hosts, open_runner)
        try:
            return lifecycle.train(config, request, sessions, reporter, config_path=state(ctx).config_path)
        finally:
            for session in sessions:
                session.close()

    return make


def _reattach(ctx: typer.Context, config: Config, reporter: CliReporter,
              sync_every: float | None) -> Callable[[str, str], TrainOutcome]:
    def follow(run_id: str, name: str) -> TrainOutcome:
        with open_session(ctx, name) as session:
            return lifecycle.reattach(config, session, run_id, opener(ctx, run_id), reporter,
                                      config_path=state(ctx).config_path, sync_every=sync_every)

    return follow


def _chain(ctx: typer.Context, config: Config, policy: resume.RetryPolicy, reporter: CliReporter,
           make: Callable[[resume.Source], TrainOutcome], sync_every: float | None) -> resume.Chain:
    session_on = lambda name: open_session(ctx, name)  # noqa: E731

    def attempt(run_id: str, hosts: list[str]) -> TrainOutcome:
        source = resume.plan(config, run_id, session_on, reporter, hosts=hosts, force=True)
        say(f"retry: run {run_id} resumes from checkpoint {source.resume.label} on "  # type: ignore[union-attr]
            f"{', '.join(source.hosts)}")
        return make(source)

    def hosts_of(run_id: str) -> list[str]:
        entry = index.lookup(config.root, run_id)
        return list(entry.nodes or (entry.host,)) if entry else []

    def hint(command: str, run_id: str, host: str) -> str:
        return command_hint(command, run_id, host=config.hosts.get(host) or host, config=state(ctx).config_path)

    return resume.Chain(policy, reporter, attempt=attempt, follow=_reattach(ctx, config, reporter, sync_every),
                        answers=resume.probe(session_on), hosts_of=hosts_of, hint=hint)
