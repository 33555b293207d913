"""`runs`, `status`, `logs`, `stop`, `fetch`: the detached runs on a host."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import typer
from rich.markup import escape
from rich.table import Table

from .. import fetchdir, index, multinode, pipeline, runs
from ..console import console, err_console
from ..errors import ConnectionLostError, ExitCode, ThrustError, UsageError
from ..session import HostSession
from .common import get_config, open_runner, state
from .follow import say
from .train import CliReporter, show_outcome

HOST_OPT = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml (default: the run's host from the "
                        "local index, else default_host).")
STATE_STYLE = {"RUNNING": "cyan", "FINISHED": "green", "FAILED": "red", "LOST": "yellow", "STOPPED": "magenta"}


def register(app: typer.Typer) -> None:
    app.command("runs", help="List the runs on a host (--all: on every configured host).")(list_runs)
    app.command("status", help="State of one run: RUNNING, FINISHED, FAILED, STOPPED or LOST.")(status)
    app.command("logs", help="Print a run's log from a byte offset; --follow until it ends.")(logs)
    app.command("stop", help="Stop a run: TERM its process group, KILL after a grace period.")(stop)
    app.command("fetch", help="Fetch a run's model into web/public and its artifacts into .thrust/fetched/RUN/"
                "artifacts/ (verified; again: only what changed).")(fetch)


def _open(ctx: typer.Context, host: str | None, run_id: str | None = None) -> HostSession:
    """A session on `--host`, else (for a run id) the host the local index recorded, else the default."""
    config = get_config(ctx)
    if run_id is not None:
        host = index.resolve_host(config, runs.check_run_id(run_id), host)
    host_cfg = config.host(host)
    runner = open_runner(host_cfg)
    try:
        return HostSession.open(runner, host_cfg, config)
    except BaseException:
        runner.close()
        raise


def list_runs(ctx: typer.Context,
              host: str | None = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml "
                                              "(default: default_host)."),
              all_hosts: bool = typer.Option(False, "--all", help="Every configured host's runs, asked in parallel."),
              timeout: float = typer.Option(10.0, "--timeout", min=0.1,
                                            help="With --all: seconds to wait for each host."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    if all_hosts:
        if host:
            raise UsageError("give --all or --host, not both")
        _list_all(ctx, timeout, as_json)
        return
    session = _open(ctx, host)
    try:
        items = runs.list_runs(session)
    finally:
        session.runner.close()
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    _print_table(COLUMNS, [_row(r) for r in items])


def _list_all(ctx: typer.Context, timeout: float, as_json: bool) -> None:
    config = get_config(ctx)
    listings = runs.list_hosts(list(config.hosts), lambda name: _open(ctx, name), timeout)
    if as_json:
        out: list[dict] = []
        for listing in listings:
            out += listing.runs if listing.runs is not None else [{"host": listing.host, "error": listing.error}]
        typer.echo(json.dumps(out, indent=2))
    else:
        rows, notes = [], []
        for listing in listings:
            if listing.runs is None:
                # piped: the reason in the row (one line per host for grep); on a terminal: under the table
                why = "" if console.is_terminal else listing.error or ""
                rows.append((listing.host, "", _unreachable(listing), "", "", "", "", why))
                notes.append(f"{listing.host}: {listing.error}")
            rows += [(listing.host, *_row(r)) for r in listing.runs or []]
        _print_table(("host", *COLUMNS), rows, notes)
    answered = [listing for listing in listings if listing.runs is not None]
    if not answered:  # no host answered: the first one's reason is the exit code (69 for a timeout)
        raise typer.Exit(listings[0].exit_code if listings else 0)


def _unreachable(listing: runs.HostListing) -> str:
    down = (ExitCode.UNAVAILABLE, ExitCode.UNKNOWN_HOST, ExitCode.CONNECTION_LOST)
    return "UNREACHABLE" if listing.exit_code in down else "ERROR"


COLUMNS = ("job", "state", "exit", "started", "ended", "commit", "run")


def _row(r: dict) -> tuple[str, ...]:
    code = r.get("exit_code")
    return (r.get("job") or "", r["state"], "" if code is None else str(code), r.get("started_at") or "",
            r.get("ended_at") or "", (r.get("commit") or "")[:12], r["run_id"])


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = ()) -> None:
    """A rich table on a terminal; without one (a pipe, CI) plain columns with every value whole,
    so `runs | grep` and `awk` see full run ids, never `cart…`."""
    if not console.is_terminal:
        widths = [max([len(h), *(len(row[i]) for row in rows)]) for i, h in enumerate(headers)]
        for line in (headers, *rows):
            typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
        return
    table = Table(*headers[:-1])
    table.add_column(headers[-1], no_wrap=True)
    state_at = list(headers).index("state")
    for row in rows:
        style = STATE_STYLE.get(row[state_at], "red" if row[state_at] else "")
        cells = [escape(c) for c in row]
        cells[state_at] = f"[{style}]{cells[state_at]}[/]" if style else cells[state_at]
        table.add_row(*cells)
    console.print(table)
    for note in notes:
        console.print(f"[red]{escape(note)}[/]", highlight=False)


def status(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    session = _open(ctx, host, run_id)
    try:
        st = runs.status(session, runs.check_run_id(run_id))
        if len(st.get("nodes") or []) > 1:  # a run over several hosts: every node's state, and the run's
            st = _over_nodes(ctx, session, run_id, st)
    finally:
        session.runner.close()
    if as_json:
        typer.echo(json.dumps(st))
        return
    style = STATE_STYLE.get(st["state"], "")
    code = f" (exit code {st['exit_code']})" if st.get("exit_code") is not None else ""
    console.print(f"{st['run_id']}: [{style}]{st['state']}[/]{code}  job={st.get('job')} pid={st.get('pid')} "
                  f"started={st.get('started_at')} commit={(st.get('commit') or '')[:12]}")
    failed = st.get("failed_node")
    if failed:
        console.print(f"  node {failed['node']} ({escape(str(failed['host']))}) failed first: "
                      f"{escape(str(failed.get('why')))}", highlight=False)
    for node in st.get("nodes") or []:
        code = "" if node.get("exit_code") is None else f" (exit code {node['exit_code']})"
        console.print(f"  node {node['node']}  {escape(str(node['host']))}  "
                      f"[{STATE_STYLE.get(node['state'], 'red')}]{node['state']}[/]{code}", highlight=False)


def _node_sessions(ctx: typer.Context, names: list[str], have: HostSession) -> list[HostSession | None]:
    """A session on each node of a run (the one already open reused); None where it cannot be opened
    (a host this config no longer has, or one that does not answer)."""

    def one(name: str) -> HostSession | None:
        if name == have.name:
            return have
        try:
            return _open(ctx, name)
        except ThrustError:
            return None

    return multinode.each(one, names)


def _over_nodes(ctx: typer.Context, session: HostSession, run_id: str, st: dict) -> dict:
    names = [str(n) for n in st["nodes"]]
    sessions = _node_sessions(ctx, names, session)
    try:  # the node already asked is not asked again
        states = multinode.node_states([None if s is session else s for s in sessions], run_id)
    finally:
        for s in sessions:
            if s is not None and s is not session:
                s.runner.close()
    return multinode.aggregate(names, [st if s is session else got for s, got in zip(sessions, states, strict=True)])


def logs(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
         follow_: bool = typer.Option(False, "--follow", "-f", help="Follow until the run ends, with the progress "
                                      "view of train; a train run's model is then fetched, as train does."),
         offset: int = typer.Option(0, "--offset", min=0, help="Start at this byte of the log."),
         no_fetch: bool = typer.Option(False, "--no-fetch", help="With --follow: do not fetch the model; print "
                                       "the fetch command instead."),
         raw: bool = typer.Option(False, "--raw", help="With --follow: the log's bytes exactly, no progress view."),
         as_json: bool = typer.Option(False, "--json", help="With --follow: print the result as train --json does "
                                      "(progress to stderr)."),
         node: int | None = typer.Option(None, "--node", min=0, help="A run over several hosts: this node's log "
                                         "(default: node 0, where rank 0 writes).")) -> None:
    session = _open(ctx, host, run_id)
    runs.check_run_id(run_id)
    if node is not None:
        session = _node_session(ctx, session, run_id, node)
    try:
        if follow_:
            _reattach(ctx, session, run_id, offset=offset, fetch=not no_fetch, raw=raw, as_json=as_json)
            return
        import sys

        runs.status(session, run_id)  # a clear error for an unknown id
        runs.follow_log(session, run_id, offset=offset, follow=False,
                        on_bytes=lambda b: (sys.stdout.buffer.write(b), sys.stdout.buffer.flush()))
    finally:
        session.runner.close()


def _node_session(ctx: typer.Context, session: HostSession, run_id: str, node: int) -> HostSession:
    """`logs --node i`: a session on node i's host (its name from the run's run.json)."""
    try:
        names = [str(n) for n in runs.status(session, run_id).get("nodes") or [session.name]]
    except BaseException:
        session.runner.close()
        raise
    if node >= len(names):
        session.runner.close()
        raise UsageError(f"--node {node}: run {run_id} has {len(names)} node(s) ({', '.join(names)})",
                         f"give --node 0 to {len(names) - 1}")
    if names[node] == session.name:
        return session
    session.runner.close()
    return _open(ctx, names[node])


def _reattach(ctx: typer.Context, session: HostSession, run_id: str, *, offset: int, fetch: bool, raw: bool,
              as_json: bool) -> None:
    """`logs -f`: the pipeline's reattach (follow, then fetch a finished train run) rendered as train's
    end is; the exit code is the job's (docs/architecture.md, "Exit codes")."""
    started = time.monotonic()
    config_path = state(ctx).config_path
    reporter = CliReporter(quiet=as_json, out=err_console if as_json else None, raw=raw)
    outcome = pipeline.reattach(get_config(ctx), session, run_id, reporter, offset=offset, fetch=fetch,
                                config_path=config_path)
    if not outcome.fetchable and not as_json:  # not a train run: nothing to fetch, only the end to tell
        if outcome.exit_code:
            say(f"run {run_id} ended {outcome.status['state']} (exit code {outcome.status.get('exit_code')})")
        raise typer.Exit(outcome.exit_code)
    show_outcome(ctx, outcome, session.host, as_json, started, config_path)


def stop(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
         grace: float = typer.Option(10.0, "--grace", help="Seconds between TERM and KILL.")) -> None:
    session = _open(ctx, host, run_id)
    try:
        names = [str(n) for n in runs.status(session, runs.check_run_id(run_id)).get("nodes") or [session.name]]
        sessions = _node_sessions(ctx, names, session) if len(names) > 1 else [session]
        try:
            answers = multinode.each(lambda s: _stop_one(s, run_id, grace), sessions)
        finally:
            for s in sessions:
                if s is not None and s is not session:
                    s.runner.close()
    finally:
        session.runner.close()
    for name, answer in zip(names, answers, strict=True):
        where = f" on {name}" if len(names) > 1 else ""
        if answer is None:
            console.print(f"{run_id}{where}: unreachable (it stops itself when it loses the other nodes)")
        elif answer.get("stopped"):
            how = "killed after the grace period" if answer.get("killed") else "stopped"
            console.print(f"{run_id}{where}: {how} ({answer.get('state')})")
        else:
            console.print(f"{run_id}{where}: not running ({answer.get('state')})")


def _stop_one(session: HostSession | None, run_id: str, grace: float) -> dict | None:
    if session is None:
        return None
    try:
        return runs.stop(session, run_id, grace)
    except ConnectionLostError:
        return None


def fetch(ctx: typer.Context, run_id: str = typer.Argument(...), host: str | None = HOST_OPT,
          force: bool = typer.Option(False, "--force", help="Place the model in web/public even when its run did "
                                     "not FINISH or it scores clearly worse than the placed one.")) -> None:
    config = get_config(ctx)
    session = _open(ctx, host, run_id)
    result = got = None
    try:
        st = runs.status(session, runs.check_run_id(run_id))
        job_name = st.get("job")
        if not job_name:
            raise ThrustError(f"run {run_id} has no job recorded")
        job, run_dir = config.job(job_name), session.paths.run(run_id)
        if pipeline.exports_model(job):
            result = pipeline.finish(config, session, job, run_dir, run_id=run_id, status=st, force=force)
        elif not fetchdir.artifact_globs(job):
            raise UsageError(f"job {job_name} exports no model and has no `artifacts:`: nothing to fetch",
                             f"add `export:` or `artifacts:` under jobs.{job_name} in thrust.yaml")
        reporter = CliReporter()
        got = pipeline.fetch_artifacts(config, session, job, run_dir, run_id, reporter)
    finally:
        session.runner.close()
    if result is None:
        assert got is not None
        typer.echo(got.dest)
        return
    from .kept import render_fetched

    render_fetched(ctx, result, session.name, config.root)
    typer.echo(result.model)  # the placed model, or the kept one when not placed
