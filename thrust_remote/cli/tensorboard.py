"""`tensorboard RUN_ID`: TensorBoard on a run's fetched artifacts, or `--remote` on the host through an
SSH port forward (the core is tboard.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

import typer

from thrust_remote.cli.common import HOST_OPT, get_config, get_fleet
from thrust_remote.core.console import err_console, host_text
from thrust_remote.fetch.models import relative
from thrust_remote.run.handle import Run
from thrust_remote.runs import tboard


def register(app: typer.Typer) -> None:
    app.command("tensorboard", help="TensorBoard on a run's fetched artifacts (or, with --remote, on the host "
                "through an SSH port forward); Ctrl-C stops it, and whatever ends it (SIGTERM, SIGHUP) ends "
                "that TensorBoard too.")(tensorboard)


def _say(text: str) -> None:
    err_console.print(host_text(text, lines=True), highlight=False, soft_wrap=True)


def tensorboard(
    ctx: typer.Context,
    run_id: str = typer.Argument(..., metavar="RUN_ID"),
    host: str | None = HOST_OPT,
    port: int = typer.Option(tboard.DEFAULT_PORT, "--port", "-p", min=0, max=65535,
                             help="Port on 127.0.0.1 here (0: any free port)."),
    remote: bool = typer.Option(False, "--remote", help="Run TensorBoard on the host (the job's python) on what "
                                "the run wrote there, reached through an SSH port forward."),
    job_name: str | None = typer.Option(None, "--job", help="The run's job, when the local index does not know "
                                        "it (its `metrics.tensorboard` names the dir)."),
) -> None:
    try:
        with tboard.ended_by_signals():
            _serve(ctx, run_id, host, port, remote, job_name)
    except tboard.Ended as ended:
        _die_of(ended.signum)


def _die_of(signum: int) -> None:
    """Die of the signal that ended us, now that TensorBoard has ended: whoever sent it sees a death by
    it (143 in a shell for SIGTERM), as from a process without a handler. The code is the fallback."""
    with contextlib.suppress(OSError):  # a hung-up terminal or a closed pipe: nothing left to flush to
        sys.stdout.flush()
        sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    raise typer.Exit(128 + signum)


def _serve(ctx: typer.Context, run_id: str, host: str | None, port: int, remote: bool, job_name: str | None) -> None:
    config = get_config(ctx)
    job = tboard.job_of(config, run_id, job_name)
    if not remote:
        tboard.require_tensorboard()
        logdir = tboard.local_logdir(config, run_id, job, host)
        _say(f"TensorBoard on {relative(logdir, config.root)}/ (Ctrl-C stops it)")
        try:  # its URL is its own line
            code = tboard.serve_local(tboard.tensorboard_argv(sys.executable, str(logdir), port))
        except KeyboardInterrupt:
            code = 0  # the user stopped it (TensorBoard got the same Ctrl-C); serve_local ended it
        raise typer.Exit(code)
    with Run(get_fleet(ctx), run_id, host).session() as session:
        try:
            argv, logdir = tboard.remote_plan(session, run_id, job)
            _say(f"starting TensorBoard on {session.name}:{logdir}")
            tboard.serve_remote(session, argv, port, lambda url: _say(
                f"TensorBoard ({session.name}, through SSH): {url} (Ctrl-C stops it)"))
        except KeyboardInterrupt:
            pass  # the user stopped it; serve_remote hung up the host's TensorBoard
