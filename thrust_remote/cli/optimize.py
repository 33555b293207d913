"""`thrust-remote optimize [JOB] --trials N`: the live table and summary; the core is thrust_remote.optimize."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import typer
from rich.live import Live
from rich.table import Table

from thrust_remote import optimize as core
from thrust_remote.agent.protocol import RunState
from thrust_remote.cli.common import get_config, get_fleet
from thrust_remote.cli.outcome import CliReporter
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.console import console, err_console, host_text
from thrust_remote.core.errors import UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.fleet import Fleet
from thrust_remote.runs import notify

STATE_STYLE = {"RUNNING": "cyan", "LAUNCHING": "cyan", "COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red"}


def register(app: typer.Typer) -> None:
    app.command("optimize", help="Search a job's hyperparameters: an Optuna study over the GPU slots of one "
                                 "host or several.")(
        optimize
    )


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


class LiveTable:
    """Renders the scheduler's trials: a live rich table on a terminal, one line per event otherwise."""

    def __init__(self, enabled: bool, title: str) -> None:
        self.enabled = enabled
        self.title = title
        self.live: Live | None = None

    def __enter__(self) -> LiveTable:
        if self.enabled:
            self.live = Live(Table(), console=err_console, refresh_per_second=4, transient=False)
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.stop()

    def event(self, message: str) -> None:
        if self.live is not None:
            self.live.console.print(f"[dim]{host_text(message)}[/]", highlight=False)
        else:
            err_console.print(host_text(message, lines=True, markup=False), highlight=False, markup=False,
                              soft_wrap=True)

    def update(self, trials: Sequence[core.TrialView], counts: Mapping[str, int]) -> None:
        if self.live is None:
            return
        table = Table(title=f"{self.title}  done {counts.get('done', 0)}  running {counts.get('RUNNING', 0)}  "
                            f"pruned {counts.get('PRUNED', 0)}  failed {counts.get('FAIL', 0)}")
        for col in ("trial", "slot", "params", "progress", "value", "state"):
            table.add_column(col, overflow="fold" if col == "params" else "ellipsis")
        several = len({t.host for t in trials}) > 1
        for t in sorted(trials, key=lambda v: v.number)[-30:]:
            params = " ".join(f"{k}={_short(v)}" for k, v in t.params.items())
            progress = f"{t.step:,}/{t.total_steps:,}" if t.total_steps else (f"{t.step:,}" if t.step else "")
            value = _short(t.value if t.value is not None else t.intermediate)
            style = STATE_STYLE.get(t.state, "")
            slot = f"{t.host}/{t.slot}" if several and t.slot else t.slot or ""
            state = host_text(t.state)  # a host's word, like the slot's name
            table.add_row(str(t.number), host_text(slot), host_text(params), progress, host_text(value),
                          f"[{style}]{state}[/]" if style else state)
        self.live.update(table)


def _name_the_job(config: Config, names: Sequence[str], trials: int | None, host: Sequence[str] | None) -> str:
    """The usage error of an optimize without a job: its example is the command the user typed with one of
    the project's `search:` jobs (else the trainer's cartpole, whose space is built in), so pasted it
    runs what they asked: their --trials, not twenty trials of a job they may not have meant."""
    example = command_hint("optimize", names[0] if names else "cartpole", "--trials", str(trials or 20),
                           host=host[0] if host else None, config=config.given_path)
    return f"name the job to optimize{', one of ' + ', '.join(names) if names else ''} (e.g. {example})"


def optimize(
    ctx: typer.Context,
    job: str | None = typer.Argument(None, metavar="JOB",
                                     help="Job to tune (default: the one job under `search:` in thrust.yaml)."),
    trials: int | None = typer.Option(None, "--trials", "-n", help="Trials to finish (COMPLETE + PRUNED)."),
    host: list[str] | None = typer.Option(None, "--host", "-H",
                                          help="Host (or group) from thrust.yaml; repeat for a study over several "
                                               "hosts (default: default_host)."),
    parallel: int | None = typer.Option(None, "--parallel", "-p",
                                        help="Trials at once (CPU host: this many CPU slots; default 1)."),
    gpus: str | None = typer.Option(None, "--gpus", help="GPU indices for slots, like 0,1,2,3 (default: all)."),
    slots_per_gpu: int = typer.Option(1, "--slots-per-gpu", help="Trials sharing one GPU (default 1)."),
    study: str | None = typer.Option(None, "--study", help="Study name (default: the job's name)."),
    storage: str | None = typer.Option(None, "--storage", envvar="THRUST_STUDY_STORAGE",
                                       help="Optuna storage URL, or journal:FILE (default: SQLite on the host; "
                                            "over several hosts, in <project>/.thrust/studies/)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds after which no new trial starts."),
    sets: list[str] = typer.Option([], "--set", help="KEY=VALUE: fix a flag (a command job: a word) for "
                                      "every trial; KEY alone or KEY=true: a bare --KEY; KEY=false: left out; a word "
                                      "that starts with - (--set=-m, Hydra's multirun): passed as it is, first; "
                                      "repeatable."),
    pruner: str = typer.Option("median", "--pruner", help="median | halving | none."),
    prune_startup: int = typer.Option(2, "--prune-startup", help="median: complete trials before pruning."),
    prune_warmup: int = typer.Option(4, "--prune-warmup", help=f"rungs (of {core.RUNGS}) before pruning."),
    metric: str = typer.Option("auto", "--metric",
                               help="The trainer's: auto (eval_return, else return_mean) | eval_return | return_mean "
                                    "| score_mean. A job of your own names its objective in thrust.yaml."),
    seed: int | None = typer.Option(None, "--seed", help="Sampler seed."),
    out: Path | None = typer.Option(None, "--out", help="Best params YAML (default: <study>-best.yaml)."),
    poll: float = typer.Option(0.5, "--poll", help="Seconds between polls of the running trials."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
    stop: bool = typer.Option(False, "--stop", help="Stop the study's driver and its running trials."),
) -> None:
    config = get_config(ctx)
    if job is None:
        names = sorted(config.search)
        if len(names) != 1:
            raise UsageError(_name_the_job(config, names, trials, host))
        job = names[0]
    job_cfg = config.job(job)
    hosts = config.host_list(host)  # a group stands for its hosts; a host named twice is refused (64)
    if stop:
        _stop(get_fleet(ctx), job_cfg, hosts, study, as_json)
        return
    if trials is None:
        raise UsageError("--trials N is required (how many trials the study should finish)")
    request = core.OptimizeRequest(
        job=job_cfg, host=hosts[0], trials=trials, parallel=parallel, gpus=gpus, slots_per_gpu=slots_per_gpu,
        study=study, storage=storage, timeout=timeout, sets=sets, pruner=pruner, prune_startup=prune_startup,
        prune_warmup=prune_warmup, metric=metric, seed=seed, out=out, poll_s=poll, hosts=hosts,
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our table says what happens
    control = core.Control()
    fleet = get_fleet(ctx)
    runners = {h.name: fleet.runner(h) for h in hosts}
    reporter = CliReporter()
    previous = signal.signal(signal.SIGINT, _sigint_handler(control))
    try:
        with LiveTable(err_console.is_terminal and not as_json, f"study {study or job}") as view:
            optimizer = core.Optimizer(config, request, runners, reporter, view, control)
            summary = optimizer.run()
    finally:
        signal.signal(signal.SIGINT, previous)
        for runner in runners.values():
            runner.close()
    if as_json:
        typer.echo(json.dumps(summary.as_json(), indent=2))
    else:
        render_summary(summary, {h.name: h for h in hosts})
    _tell(config, summary, reporter)
    raise typer.Exit(summary.exit_code)


def _tell(config: Config, s: core.Summary, reporter: CliReporter) -> None:
    """The study's end to `notify:` (each end: a resumed study ends again): THRUST_RUN_ID is its name."""
    cfg = config.notify_for(s.job)
    if cfg.enabled:
        state = (RunState.FINISHED if s.exit_code == 0
                 else RunState.STOPPED if s.stopped == "aborted" else RunState.FAILED)
        host = ",".join(s.hosts) if s.hosts else str(s.host)
        notify.tell(cfg, notify.Ended(s.study, state.value, s.exit_code, host, f"optimize {s.job}"), reporter.warn,
                    cwd=config.path.parent if config.path else config.root)


def _stop(fleet: Fleet, job: JobConfig, hosts: Sequence[HostConfig], study: str | None, as_json: bool) -> None:
    """`optimize --stop`: the study's driver sees the stop file (on every host of the study); its
    running trials are stopped here."""
    stopped: list[str] = []
    for host in hosts:
        runner = fleet.runner(host)
        try:
            stopped += core.request_stop(runner, host, fleet.config, study or core.default_study_name(job))
        finally:
            runner.close()
    if as_json:
        typer.echo(json.dumps({"stopped": stopped}))
    else:
        console.print(f"stop requested; stopped {len(stopped)} running trial(s)")


def _sigint_handler(control: core.Control) -> Callable[[int, FrameType | None], None]:
    """Ctrl-C once: drain (no new trials); twice: stop the running ones; three times: interrupt."""
    presses = [0]

    def on_sigint(_signum: int, _frame: FrameType | None) -> None:
        if not control.started:  # still syncing / setting up: nothing to drain, just stop
            raise KeyboardInterrupt
        presses[0] += 1
        if presses[0] == 1:
            control.drain = True
            err_console.print("[yellow]Ctrl-C: no new trials; the running ones finish. "
                              "Ctrl-C again stops them.[/]")
        elif presses[0] == 2:
            control.abort = True
            err_console.print("[yellow]Ctrl-C: stopping the running trials (rerun the command to continue)[/]")
        else:
            raise KeyboardInterrupt

    return on_sigint


def render_summary(s: core.Summary, hosts: Mapping[str, HostConfig] | None = None) -> None:
    c = s.counts
    # the target counts trials done (complete or pruned); a failed one is not one of them
    done, failed = c.get("COMPLETE", 0) + c.get("PRUNED", 0), c.get("FAIL", 0)
    console.print(f"study [bold]{host_text(s.study)}[/] ({host_text(s.storage)}): {done} of {s.trials_target} trials "
                  f"done ({c.get('COMPLETE', 0)} complete, {c.get('PRUNED', 0)} pruned)"
                  + (f"; {failed} failed, not counted" if failed else "") + f", in {s.wall_s:.1f} s", highlight=False)
    if len(s.hosts) > 1:
        console.print("trials per host (complete + pruned): "
                      + ", ".join(f"{host_text(h)} {n}" for h, n in s.hosts.items()), highlight=False)
    for name, why in s.lost_hosts.items():
        console.print(f"[yellow]host {host_text(name)} was lost: {host_text(why)}; its trials ran again on the "
                      "others[/]", highlight=False)
    if s.stopped:
        console.print(f"[yellow]stopped before {s.trials_target} trials: {s.stopped}; rerun the same command to "
                      "continue[/]")
    if s.best is None:
        console.print("[red]no trial completed[/]")
        return
    on = f" on {s.best['host']}" if len(s.hosts) > 1 and s.best.get("host") else ""
    table = Table("parameter", "best value", "importance", title=f"best: trial {s.best['number']}{on}, "
                  f"{s.best.get('metric') or s.metric} = {s.best['value']:.4g}")
    for k, v in s.best["params"].items():
        imp = (s.importances or {}).get(k)
        table.add_row(k, _short(v), "" if imp is None else f"{imp:.2f}")
    console.print(table)
    if s.importances is None:
        console.print(f"importances not computed: {host_text(s.importance_note or '')}", highlight=False)
    best_host = s.best.get("host") or s.host
    train = command_hint("train", s.job, "--params", str(s.best_params_file),
                         host=(hosts or {}).get(best_host) or best_host)
    console.print(f"best params: {s.best_params_file}  →  {train}", highlight=False)
    console.print(f"dashboard: optuna-dashboard {host_text(s.dashboard_url or s.storage)}", highlight=False)
