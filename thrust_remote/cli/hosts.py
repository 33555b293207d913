"""`hosts`, `ping` and `exec`: the Runner end to end, before any training is involved."""

from __future__ import annotations

import json
import sys
import time

import typer
from rich.markup import escape
from rich.table import Table

from thrust_remote.cli.common import get_config, get_fleet, plain_table
from thrust_remote.core.console import console
from thrust_remote.core.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("hosts", help="List the configured hosts.")(hosts)
    app.command("ping", help="Connect to a host and run `true`; prints the round trip.")(ping)
    app.command(
        "exec",
        help="Run one command on a host: thrust-remote exec --host H -- CMD ARGS... (argv, never a shell string).",
        context_settings={"allow_interspersed_args": False},
    )(exec_)


def hosts(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    config = get_config(ctx)
    rows = [
        {
            "name": h.name,
            "address": h.address or "(this machine)",
            "workdir": h.workdir,
            "python": h.python,
            "host_key_policy": h.host_key_policy,
            "default": h.name == config.default_host,
        }
        for h in config.hosts.values()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    headers = ("host", "address", "workdir", "python", "host keys")
    cells = [(f"{r['name']} (default)" if r["default"] else r["name"], r["address"], r["workdir"], r["python"],
              r["host_key_policy"]) for r in rows]
    if not console.is_terminal:  # piped: whole values, never `trialb…`
        plain_table(headers, cells)
        return
    table = Table(*headers)
    for row in cells:
        table.add_row(*(escape(c) for c in row))
    console.print(table)


def ping(
    ctx: typer.Context,
    host: str | None = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml."),
) -> None:
    runner = get_fleet(ctx).runner(host)
    try:
        started = time.monotonic()
        runner.run(["true"]).check("true")
        first = time.monotonic() - started
        started = time.monotonic()
        runner.run(["true"]).check("true")
        again = time.monotonic() - started
    finally:
        runner.close()
    console.print(f"{runner.name}: ok (connect + first command {first * 1000:.0f} ms, next {again * 1000:.1f} ms)")


def exec_(
    ctx: typer.Context,
    command: list[str] = typer.Argument(..., metavar="CMD", help="The command and its arguments, after --."),
    host: str | None = typer.Option(None, "--host", "-H", help="Host name from thrust.yaml."),
    cwd: str | None = typer.Option(None, "--cwd", help="Directory to run in (default: the home directory)."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for the command's environment."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds before the command is killed."),
) -> None:
    env_map: dict[str, str] = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env_map[key] = value
    runner = get_fleet(ctx).runner(host)

    def stream(name: str, line: str) -> None:
        out = sys.stdout if name == "out" else sys.stderr
        out.write(line + "\n")
        out.flush()

    try:
        result = runner.run(command, env=env_map, cwd=cwd, timeout=timeout, stream=stream)
    finally:
        runner.close()
    raise typer.Exit(result.exit_code)
