"""`runs`, `status`, `logs`, `stop`, `fetch`: the detached runs on a host."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from thrust_remote.agent.protocol import RunState, StatusAnswer
from thrust_remote.backends import backend_for
from thrust_remote.backends.base import Backend
from thrust_remote.cli.common import HOST_OPT, get_config, get_fleet, plain_table
from thrust_remote.cli.follow import duration, say
from thrust_remote.cli.outcome import CliReporter, show_outcome, why_ended
from thrust_remote.core.config import LOCAL, Config
from thrust_remote.core.console import console, err_console, host_text
from thrust_remote.core.errors import ExitCode, StillGoing, ThrustError, UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.fleet import Fleet
from thrust_remote.run import lifecycle, vocab, waiting
from thrust_remote.run.handle import Run
from thrust_remote.runs import control, trees, usage
from thrust_remote.runs.pull import Pulled

STATE_STYLE = {RunState.QUEUED: "blue", RunState.RUNNING: "cyan", RunState.FINISHED: "green",
               RunState.FAILED: "red", RunState.LOST: "yellow", RunState.STOPPED: "magenta"}


def register(app: typer.Typer) -> None:
    app.command("runs", help="List the runs on a host (--all: on every configured host; --summary: "
                "GPU-hours per host and job).")(list_runs)
    app.command("status", help="State of one run: QUEUED, RUNNING, FINISHED, FAILED, STOPPED or LOST.")(status)
    app.command("logs", help="Print a run's log from a byte offset; --follow until it ends.")(logs)
    app.command("stop", help="Stop a run: TERM its process group, KILL after a grace period.")(stop)
    app.command("wait", help="Wait until every run named has ended; exit 0 when all FINISHED.")(wait)
    app.command("prune", help="Remove the trees of ended runs beyond the host's keep: {runs: N} (--keep N), the "
                "fetched ones first, never a queued or running run's (--dry-run: only list them).")(prune)
    app.command("fetch", help="Fetch a run's model into web/public, its newest checkpoint and its artifacts into "
                ".thrust/fetched/RUN/ (verified; again: only what changed; a RUNNING run: checkpoint and artifacts "
                "so far).")(fetch)


def list_runs(ctx: typer.Context,
              host: str | None = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml "
                                              "(default: default_host)."),
              all_hosts: bool = typer.Option(False, "--all", help="Every configured host's runs, asked in parallel."),
              timeout: float = typer.Option(10.0, "--timeout", min=0.1,
                                            help="With --all: seconds to wait for each host."),
              summary: bool = typer.Option(False, "--summary", help="Totals per host and job: runs, wall-hours, "
                                            "GPU-hours."),
              since: str | None = typer.Option(None, "--since", help="With --summary: only runs started within "
                                               "this long, e.g. 7d, 24h, 30m."),
              as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    if all_hosts and host:
        raise UsageError("give --all or --host, not both")
    if since is not None and not summary:
        raise UsageError("--since goes with --summary", "thrust-remote runs --summary --since 7d")
    if summary:
        since_s = usage.parse_since(since) if since is not None else None  # a bad value before connecting
        _summary(ctx, host, all_hosts, timeout, since_s, as_json)
        return
    if all_hosts:
        _list_all(ctx, timeout, as_json)
        return
    with Fleet(get_config(ctx)).open(host) as session:
        items = control.list_runs(session, trees=True)
        listed, kind = session.name, backend_for(session.host)
    if as_json:
        typer.echo(json.dumps(items, indent=2))
        return
    # which host was asked goes to stderr (a pipe's columns stay the runs'): without --host it is the
    # default host, and an empty table alone would read as "you have no runs" anywhere
    where = _where(ctx, listed, host)
    say(f"no {where}" if not items else where)
    if items:
        resumed, extra = _any_resumed(items), [_extra(kind, r) for r in items]
        named = _extra_columns(extra)
        _print_table(_columns(resumed, named), [_row(r, resumed, x, named) for r, x in zip(items, extra, strict=True)])


def _summary(ctx: typer.Context, host: str | None, all_hosts: bool, timeout: float, since_s: float | None,
             as_json: bool) -> None:
    """`runs --summary`: GPU-hours and wall-hours per host and job (runs/usage.py)."""
    if all_hosts:
        config = get_config(ctx)
        listings = control.list_hosts(list(config.hosts), Fleet(config).open, timeout)
        for listing in listings:
            if listing.runs is None:
                say(f"{listing.host}: not counted ({listing.error})")
        _fail_when_none_answered(config, listings)  # totals of nothing would read as no GPU-hours anywhere
        rows = [r for listing in listings for r in listing.runs or []]
    else:
        with Fleet(get_config(ctx)).open(host) as session:
            rows = [{**r, "host": r.get("host") or session.name} for r in control.list_runs(session)]
            listed = session.name
    totals = usage.summarize(rows, since_s=since_s)
    if as_json:
        typer.echo(json.dumps(totals, indent=2))
        return
    if not all_hosts:  # as plain `runs` says it: a table of nothing would read as no runs anywhere
        say(f"{'' if totals else 'no '}{_where(ctx, listed, host)}")
    _print_table(("host", "job", "runs", "wall_hours", "gpu_hours"),
                 [(t["host"], t["job"], str(t["runs"]), f"{t['wall_hours']:.2f}", f"{t['gpu_hours']:.2f}")
                  for t in totals])


def _where(ctx: typer.Context, listed: str, host: str | None) -> str:
    """Which host was asked (on stderr: a pipe's columns stay the runs'): without --host the default
    host, and an empty table alone would read as "you have no runs" anywhere."""
    others = len(get_config(ctx).hosts) > 1
    return f"runs on {listed}" if host else f"runs on {listed} (the default host" + (
        "; --host H for another, --all for every host)" if others else ")")


def _list_all(ctx: typer.Context, timeout: float, as_json: bool) -> None:
    config = get_config(ctx)
    listings = control.list_hosts(list(config.hosts), Fleet(config).open, timeout)
    if as_json:
        out: list[dict] = []
        for listing in listings:
            out += listing.runs if listing.runs is not None else [{"host": listing.host, "error": listing.error}]
        typer.echo(json.dumps(out, indent=2))
    else:
        rows, notes = [], []
        resumed = _any_resumed([r for listing in listings for r in listing.runs or []])
        extra = {id(r): _extra(backend_for(config.host(listing.host)), r)
                 for listing in listings for r in listing.runs or []}
        named = _extra_columns(list(extra.values()))
        for listing in listings:
            if listing.runs is None:
                # piped: the reason in the row (one line per host for grep); on a terminal: under the table
                why = "" if console.is_terminal else listing.error or ""
                blank = ("",) * (len(COLUMNS) - 3 + len(named))  # exit, started, ended, commit, tree...: none
                rows.append((listing.host, "", _unreachable(listing), *blank, why, *([""] if resumed else [])))
                notes.append(f"{listing.host}: {listing.error}")
            rows += [(listing.host, *_row(r, resumed, extra[id(r)], named)) for r in listing.runs or []]
        _print_hosts_table(("host", *_columns(resumed, named)), rows, notes)
    _fail_when_none_answered(config, listings)


def _fail_when_none_answered(config: Config, listings: Sequence[control.HostListing]) -> None:
    """`runs --all` when no host answered: an error, not exit 0 under a table of UNREACHABLE rows, which a
    script would read as "no runs anywhere". The laptop's `local` (there even when thrust.yaml names no
    such host) always answers, so its empty answer does not count; its runs do. Its code is the one all
    the failures share (77 when every host refused the key), else 69: unavailable."""
    failed = [listing for listing in listings if listing.runs is None]
    if not failed or any(listing.runs is not None and (listing.host != LOCAL or listing.runs)
                         for listing in listings):
        return
    codes = {listing.exit_code for listing in failed}
    raise ThrustError(f"no host answered ({', '.join(listing.host for listing in failed)}); each one's reason is "
                      "listed with it", command_hint("doctor", host=config.host(failed[0].host)),
                      exit_code=codes.pop() if len(codes) == 1 else ExitCode.UNAVAILABLE)


def _unreachable(listing: control.HostListing) -> str:
    down = (ExitCode.UNAVAILABLE, ExitCode.UNKNOWN_HOST, ExitCode.CONNECTION_LOST)
    return RunState.UNREACHABLE if listing.exit_code in down else "ERROR"


COLUMNS = ("job", "state", "exit", "started", "ended", "commit", "tree", "run")
RESUMED = "resumed_from"  # a column only when a listed run continues another (`resume`, a retry)


def _any_resumed(items: Sequence[dict]) -> bool:
    return any(r.get(RESUMED) for r in items)


def _columns(resumed: bool, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """COLUMNS with what a host's backend adds (its `fields`: a cluster's job id) before the run id, and
    RESUMED when a run has one."""
    return (*COLUMNS[:-1], *extra, COLUMNS[-1], *((RESUMED,) if resumed else ()))


def _extra(kind: Backend, r: StatusAnswer) -> dict[str, str]:
    """What the run's host kind adds to its line (`status` adds the same): a cluster's job id."""
    return {k: str(v) for k, v in kind.fields(r).items() if v not in (None, "")}


def _extra_columns(extra: Sequence[dict[str, str]]) -> list[str]:
    return list(dict.fromkeys(k for fields in extra for k in fields))  # only when a listed run has one


def _row(r: StatusAnswer, resumed: bool = False, extra: dict[str, str] | None = None,
         named: Sequence[str] = ()) -> tuple[str, ...]:
    code = r.get("exit_code")
    state = f"{r['state']} ({r['position']})" if r.get("position") else r["state"]  # QUEUED (2): its place
    if r.get("unreadable"):  # its state is a guess: `status RUN` names the path
        state += " (permission denied)"
    if RunState.of(r.get("state")).is_terminal or r.get("state") == RunState.QUEUED:
        # STOPPED [max-duration], FAILED [not-submitted]: why, not how long; QUEUED [Priority]: what it waits for
        state += why_ended(r, detail=False)
    tree = "" if "tree" not in r else trees.size_text(r.get("tree_bytes") if r.get("tree_kept") else "gone")
    row = (r.get("job") or "", state, "" if code is None else str(code), r.get("started_at") or "",
           r.get("ended_at") or "", (r.get("commit") or "")[:12], tree,
           *((extra or {}).get(k, "") for k in named), r["run_id"])
    return (*row, str(r.get(RESUMED) or "")) if resumed else row


# what a narrow terminal drops first: the values are whole or absent, never `FINI…`
DROP_FIRST = (RESUMED, "commit", "tree", "ended", "started", "job", "exit", "host")  # `runs --all`'s host last


def _print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = (),
                 out: Console | None = None) -> None:
    """A rich table on a terminal; without one (a pipe, CI) plain columns with every value whole,
    so `runs | grep` and `awk` see full run ids, never `cart…`. Cells and notes come from hosts: shown
    with their control characters escaped (host_text)."""
    out = out or console
    rows = [[host_text(c, markup=False) for c in row] for row in rows]
    notes = [host_text(n, lines=True, markup=False) for n in notes]
    if not out.is_terminal:
        plain_table(headers, rows)
        return
    state_at = list(headers).index("state") if "state" in headers else None
    keep = _columns_that_fit(headers, rows, out.width)
    if state_at is not None and _width(headers, rows, keep) > out.width:
        # still too wide with every droppable column gone: a state's reason ("STOPPED [max-duration]")
        # goes before a run id is cut (`status RUN` says it whole)
        rows = [[c.split(" [")[0] if i == state_at else c for i, c in enumerate(row)] for row in rows]
        keep = _columns_that_fit(headers, rows, out.width)
    table = Table(*(headers[i] for i in keep))
    for column in table.columns:
        column.no_wrap = True
    for row in rows:
        cells = [escape(c) for c in row]  # control characters escaped above; markup here
        if state_at is not None:
            word = row[state_at].split(" ")[0]
            style = STATE_STYLE.get(word, "red" if word else "")
            cells[state_at] = f"[{style}]{cells[state_at]}[/]" if style else cells[state_at]
        table.add_row(*(cells[i] for i in keep))
    out.print(table)
    for note in notes:
        out.print(f"[red]{escape(note)}[/]", highlight=False)


def _print_hosts_table(headers: Sequence[str], rows: Sequence[Sequence[str]], notes: Sequence[str] = (),
                       out: Console | None = None) -> None:
    """`runs --all`: one table with a host column; on a terminal too narrow to keep that column, a
    table per host under its name instead (a run listed without its host says nothing of where)."""
    out = out or console
    hosts = list(dict.fromkeys(row[0] for row in rows))
    if not out.is_terminal or not hosts or 0 in _columns_that_fit(headers, rows, out.width):
        _print_table(headers, rows, notes, out)
        return
    for i, host in enumerate(hosts):  # the notes under the last table, as under the one table
        out.print(f"[bold]{escape(host_text(host, markup=False))}[/]", highlight=False)
        _print_table(headers[1:], [row[1:] for row in rows if row[0] == host], notes if i == len(hosts) - 1 else (),
                     out)


def _width(headers: Sequence[str], rows: Sequence[Sequence[str]], keep: Sequence[int]) -> int:
    """The width rich's table of columns `keep` takes, every value whole (3 a column's borders and padding)."""
    return sum(max([len(headers[i]), *(len(r[i]) for r in rows)]) + 3 for i in keep) + 1


def _columns_that_fit(headers: Sequence[str], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """The columns shown: all when they fit whole, else without the least needed (DROP_FIRST)."""
    keep = list(range(len(headers)))
    own = [h for h in headers if h not in (*COLUMNS, *DROP_FIRST)]  # a backend's own fields: dropped first
    for name in (*own, *DROP_FIRST):
        if _width(headers, rows, keep) <= width:
            break
        if name in headers:
            keep.remove(list(headers).index(name))
    return keep


def status(ctx: typer.Context, run_id: str = typer.Argument(..., metavar="RUN_ID"), host: str | None = HOST_OPT,
           as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    config = get_config(ctx)
    # over several hosts every node's state, and the run's; `continued_by`: resumed since (`resume`, a retry)
    run = Run(get_fleet(ctx), run_id, host)
    st = run.status()
    if as_json:
        typer.echo(json.dumps(st))
        return
    style = STATE_STYLE.get(st["state"], "")
    code = f" (exit code {st['exit_code']})" if st.get("exit_code") is not None else ""
    code += why_ended(st)  # the idle-GPU stop, max_duration:; a scheduler's pending reason, its end's
    if st.get("position"):
        code += f" (position {st['position']} in the queue since {st.get('queued_at')})"
    h = host_text  # every value below is the host's answer
    # a queued run has no pid nor start yet: not "None"
    tree = None if "tree" not in st else (f"{st['tree']} ({trees.size_text(st.get('tree_bytes'))})"
                                           if st.get("tree_kept") else f"{st['tree']} (removed)")
    known = {"job": st.get("job"), "pid": st.get("pid"), "started": st.get("started_at"),
             "commit": (st.get("commit") or "")[:12], RESUMED: st.get(RESUMED), "tree": tree}
    backend = backend_for(config.host(run.host()))  # node 0's host: what its kind adds (a scheduler's job id)
    known.update(backend.fields(st))
    fields = "  ".join(f"{k}={h(v)}" for k, v in known.items() if v not in (None, ""))
    console.print(f"{h(st['run_id'])}: [{style}]{h(st['state'])}[/]{h(code)}  {fields}", highlight=False)
    if vocab.disk_note(st):
        console.print(f"  {h(vocab.disk_note(st).removeprefix('; '))}", highlight=False)
    failed = st.get("failed_node")
    if failed:
        console.print(f"  node {h(failed['node'])} ({h(failed['host'])}) failed first: "
                      f"{h(failed.get('why'), lines=True)}", highlight=False)
    for node in st.get("nodes") or []:
        code = "" if node.get("exit_code") is None else f" (exit code {node['exit_code']})"
        where = backend.node_label(node)  # a scheduler's nodes: its name for each
        console.print(f"  node {h(node['node'])}  {h(where)}  "
                      f"[{STATE_STYLE.get(node['state'], 'red')}]{h(node['state'])}[/]{h(code)}", highlight=False)
    if st.get("continue_error"):  # a cluster's run that was to resubmit itself at its time limit and did not
        console.print(f"  not resubmitted by the cluster: {h(st['continue_error'])}", highlight=False)
    for e in st.get("continued_by") or []:  # where the work went on
        again = command_hint("status", e["run_id"], config=config.given_path)
        console.print(f"  continued by {h(e['run_id'])} on {h(e['host'])}: {h(again)}", highlight=False)


def wait(ctx: typer.Context, run_ids: list[str] = typer.Argument(..., metavar="RUN...", help="Run ids."),
         host: str | None = HOST_OPT,
         timeout: float | None = typer.Option(None, "--timeout", min=0, help="Give up after this many seconds "
                                              "(exit 75: the runs go on)."),
         as_json: bool = typer.Option(False, "--json", help="Print the runs' statuses as a JSON list."),
         sync_every: float | None = typer.Option(None, "--sync-every", min=0, help="Seconds between pulls of each "
                                                 "run's newest checkpoint and changed artifacts (default: the job's "
                                                 "sync_every:, else 300; 0: off).")) -> None:
    """Each run asked on its own host (the index's, or --host) over one connection per host; the exit
    code is 0 when every run FINISHED, else the one `train` would give for the first that did not. A
    run of a job of this config has its checkpoint pulled meanwhile, and once more when it ends."""
    fleet = get_fleet(ctx)
    unique = list(dict.fromkeys(control.check_run_id(r) for r in run_ids))
    try:
        statuses = waiting.wait(fleet, unique, _WaitShown(), host=host, timeout=timeout, sync_every=sync_every)
    except StillGoing as still:
        if as_json:  # the statuses so far (a run not yet ended as it was last seen), then the 75
            typer.echo(json.dumps(getattr(still, "statuses", [])))
        raise
    if as_json:
        typer.echo(json.dumps(statuses))
    raise typer.Exit(lifecycle.wait_code(statuses))


# How often `wait` says the runs it waits for (a line each, on stderr; the first at once): a wait in a
# pipe or a CI log is not silent for the hours a run takes, and a minute's lines stay few.
WAIT_SAY_EVERY_S = 60.0


class _WaitShown:
    """`wait`'s view: each run's end and each pull with something new as a line on stderr, warnings as
    warnings, and the runs still going now and then (their state, time and last metrics)."""

    def __init__(self, every: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = WAIT_SAY_EVERY_S if every is None else every
        self.clock = clock
        self.said_at: float | None = None

    def warn(self, message: str) -> None:
        CliReporter().warn(message)

    def ended(self, status: StatusAnswer) -> None:
        _said_ended(status)

    def pulled(self, run_id: str, pulled: Pulled) -> None:
        if pulled.files:
            say(f"{run_id}: {pulled.text()}")

    def said(self, run_id: str, message: str) -> None:
        say(f"{run_id}: {message}")

    def going(self, runs: Sequence[StatusAnswer], metrics: Callable[[str], dict[str, object]]) -> None:
        if self.said_at is not None and self.clock() - self.said_at < self.every:
            return
        self.said_at = self.clock()
        for st in runs:
            hours = st.get("wall_hours")
            ran = f" {duration(float(hours) * 3600)}" if isinstance(hours, int | float) else ""
            numbers = _numbers(metrics(str(st["run_id"]))) if st.get("state") == RunState.RUNNING else ""
            say(f"{st['run_id']}: {st['state']}{ran}{f' ({numbers})' if numbers else ''}{why_ended(st)}")


def _said_ended(st: StatusAnswer) -> None:
    code = "" if st.get("exit_code") is None else f" (exit code {st['exit_code']})"
    see = "" if st.get("state") == RunState.FINISHED else \
        f"; its log: {command_hint('logs', st['run_id'], host=st.get('host') or None)}"
    numbers = _numbers(st.get("metrics") or {})
    said = f" ({numbers})" if numbers else ""
    say(f"{st['run_id']}: {st['state']}{code}{why_ended(st)}{said}{vocab.disk_note(st)}{see}")


def _numbers(metrics: Mapping[str, object]) -> str:
    """A run's last metrics as `wait` says them: step 1,200/50,000, loss 0.3124."""
    total = metrics.get("total_steps")
    out = []
    for k, v in metrics.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or k == "total_steps" and "step" in metrics:
            continue
        out.append(f"{k} {v:,}" + (f"/{total:,}" if isinstance(total, int) else "") if k == "step" else f"{k} {v:.4g}")
    return ", ".join(out)


def logs(ctx: typer.Context, run_id: str = typer.Argument(..., metavar="RUN_ID"), host: str | None = HOST_OPT,
         follow_: bool = typer.Option(False, "--follow", "-f", help="Follow until the run ends, with the progress "
                                      "view of train; a train run's model is then fetched, as train does."),
         offset: int = typer.Option(0, "--offset", min=0, help="Start at this byte of the log."),
         no_fetch: bool = typer.Option(False, "--no-fetch", help="With --follow: do not fetch the model; print "
                                       "the fetch command instead."),
         raw: bool = typer.Option(False, "--raw", help="With --follow: the log's bytes exactly, no progress view."),
         as_json: bool = typer.Option(False, "--json", help="With --follow: print the result as train --json does "
                                      "(progress to stderr)."),
         node: int | None = typer.Option(None, "--node", min=0, help="A run over several hosts: this node's log "
                                         "(default: node 0, where rank 0 writes)."),
         sync_every: float | None = typer.Option(None, "--sync-every", min=0, help="With --follow: seconds between "
                                                 "pulls of the run's newest checkpoint and changed artifacts "
                                                 "(default: the job's sync_every:, else 300; 0: off).")) -> None:
    control.check_run_id(run_id)
    run = Run(get_fleet(ctx), run_id, host)
    if follow_:
        _reattach(ctx, run, node=node, offset=offset, fetch=not no_fetch, raw=raw, as_json=as_json,
                  sync_every=sync_every)
        return

    def out(chunk: bytes) -> None:
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()

    got = run.read_log(out, node=node, offset=offset)
    if not got.bytes:  # say so on stderr: nothing on stdout could be a log, or a wrong node
        which = f" node {node} ({got.node_host})" if node is not None else ""
        queued = " (it is QUEUED: it has not started yet)" if got.state == RunState.QUEUED else ""
        say(f"run {run_id}{which}: nothing in its log" + (f" past byte {offset}" if offset else "") + queued)


def _reattach(ctx: typer.Context, run: Run, *, node: int | None, offset: int, fetch: bool, raw: bool, as_json: bool,
              sync_every: float | None = None) -> None:
    """`logs -f`: the run's follow and end as `train` has them, over every node of the run (a failed
    node named, a finished train run fetched), rendered as train's end is; the exit code is the job's
    (docs/architecture.md, "Exit codes")."""
    reporter = CliReporter(out=err_console if as_json else None, raw=raw)
    outcome = run.follow(reporter, node=node, offset=offset, fetch=fetch, sync_every=sync_every)
    # ended as `train` ends, whatever the job (a quiet job's follow must not end with no word), its time
    # the run's own (its status's wall time), not how long this reattach watched it
    hours = (outcome.status or {}).get("wall_hours")
    show_outcome(ctx, outcome, as_json, time.monotonic() - (float(hours) * 3600 if isinstance(hours, int | float)
                                                             else 0.0))


def stop(ctx: typer.Context, run_id: str = typer.Argument(..., metavar="RUN_ID"), host: str | None = HOST_OPT,
         grace: float = typer.Option(10.0, "--grace", help="Seconds between TERM and KILL.")) -> None:
    answers = Run(get_fleet(ctx), run_id, host).stop(grace)
    for name, answer in answers:
        where = f" on {name}" if len(answers) > 1 else ""
        if answer is None:
            console.print(f"{run_id}{where}: unreachable (it stops itself when it loses the other nodes)")
        elif answer.get("stopped"):
            how = "killed after the grace period" if answer.get("killed") else "stopped"
            console.print(f"{run_id}{host_text(where)}: {how} ({host_text(answer.get('state'))})")
        else:
            console.print(f"{run_id}{host_text(where)}: not running ({host_text(answer.get('state'))})")


def fetch(ctx: typer.Context, run_id: str = typer.Argument(..., metavar="RUN_ID"), host: str | None = HOST_OPT,
          force: bool = typer.Option(False, "--force", help="Place the model in web/public even when its run did "
                                     "not FINISH or it scores clearly worse than the placed one."),
          all_checkpoints: bool = typer.Option(False, "--all-checkpoints", help="Every checkpoint on the host, not "
                                               "only the newest."),
          as_json: bool = typer.Option(False, "--json", help="Print what was fetched as JSON (progress to stderr).")
          ) -> None:
    """A RUNNING run brings its newest checkpoint and changed artifacts (its model once it ends)."""
    config = get_config(ctx)
    got = Run(get_fleet(ctx), run_id, host).fetch(CliReporter(), force=force,
                                                  all_checkpoints=all_checkpoints)
    if as_json:
        model = got.model
        typer.echo(json.dumps({
            "run_id": run_id, "host": got.host, "state": got.state,
            "model": str(model.model) if model else None, "sha256": model.sha256 if model else None,
            "placed": model.placed if model else False, "kept": str(model.kept) if model else None,
            "why_not_placed": model.why_not if model else None,
            "checkpoint": got.checkpoint.as_json() if got.checkpoint else None,
            "artifacts": got.artifacts.as_json() if got.artifacts else None,
        }))
        return
    if got.model is None:  # stdout names what is here now: the checkpoint, the artifacts' directory
        if got.checkpoint is not None and got.checkpoint.newest:
            typer.echo(got.checkpoint.dest / got.checkpoint.newest)
        if got.artifacts is not None and got.artifacts.dest.is_dir():
            typer.echo(got.artifacts.dest)
        return
    from thrust_remote.cli.kept import render_fetched

    render_fetched(ctx, got.model, got.host, config.root)
    typer.echo(got.model.model)  # the placed model, or the kept one when not placed


def prune(ctx: typer.Context,
          host: str | None = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml (default: "
                                          "default_host)."),
          keep: int | None = typer.Option(None, "--keep", min=0, help="Keep the trees of the newest N ended runs "
                                          "(default: the host's keep: {runs: N})."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Only list what would be removed."),
          as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    config = get_config(ctx)
    with get_fleet(ctx).open(host) as session:
        if session.host.is_local:
            raise UsageError("host local runs in the project itself: it has no trees to prune",
                             "give --host with a remote host")
        pruned = trees.prune(session, config.root, session.host.keep_runs if keep is None else keep,
                             dry_run=dry_run)
    if as_json:
        typer.echo(json.dumps(pruned.as_json()))
        return
    for tree in pruned.removed:
        console.print(("would remove " if dry_run else "removed ") + host_text(trees.describe(tree)), highlight=False)
    for tree in pruned.held:  # why a tree that --keep would take stays: said, not left to guess
        console.print("kept " + host_text(trees.describe(tree)), highlight=False)
    err_console.print(host_text(trees.summary(pruned)), highlight=False)
