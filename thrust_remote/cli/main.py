"""Entry point: global options, command registration, and the one place errors become exit codes."""

from __future__ import annotations

import errno
import importlib
import logging
import math
import os
import shlex
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer.core import TyperCommand, TyperGroup

from thrust_remote.cli.common import AppState, _env_flag
from thrust_remote.core.config import ENV_CONFIG, ENV_DEBUG, SECONDS_MAX
from thrust_remote.core.console import err_console, host_text
from thrust_remote.core.errors import DISK_FULL, ExitCode, Interrupted, ThrustError, disk_full


class _SwitchesTakeNoValue:
    """Help shows a switch (`--json`, `--help`) as a bare flag: typer's rich help prints the type of
    every option, `<bool>` for switches too, as if they took a value; a switch's metavar "" blanks it."""

    def get_params(self, ctx: typer.Context) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:
                param.metavar = ""
        return params


class SwitchCommand(_SwitchesTakeNoValue, TyperCommand):
    """A command whose help shows switches as flags (see `_SwitchesTakeNoValue`), and whose Ctrl-C is
    said: some typer versions turn a KeyboardInterrupt into a silent exit 130 before run() sees it."""

    def invoke(self, ctx: typer.Context) -> Any:
        _check_numbers(ctx)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted("stopped by Ctrl-C") from None


INT_LIMIT = 2**63  # what a file offset, a pid or a count on the host (a C long) can hold


def _check_numbers(ctx: typer.Context) -> None:
    """Every number option within what its use can take, as a usage error (64) naming the option: a
    float is seconds everywhere (a timeout, a period, a grace), so finite and at most SECONDS_MAX (`nan`
    passes click's range checks, `inf` overflows every timer); an int fits 64 bits (`logs --offset
    99...9` overflowed the host's seek)."""
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= SECONDS_MAX):
            raise typer.BadParameter(f"{value} is not a number of seconds up to {SECONDS_MAX:,}", ctx=ctx,
                                     param=param)
        if isinstance(value, int) and not isinstance(value, bool) and not -INT_LIMIT <= value < INT_LIMIT:
            raise typer.BadParameter("too large a number", ctx=ctx, param=param)


class SwitchGroup(_SwitchesTakeNoValue, TyperGroup):
    """The top-level group, with the same help for its switches (`--debug`, `--version`, `--help`)."""


app = typer.Typer(
    cls=SwitchGroup,
    name="thrust-remote",
    help="Take an RL job from a laptop to a GPU box over SSH and get a working model back.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # the handler in run() decides what the user sees
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Each module defines `register(app)`. Add a command by adding its module here.
COMMAND_MODULES: tuple[str, ...] = ("hosts", "play", "doctor", "train", "runs", "resume", "optimize", "init",
                                    "tensorboard")


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"thrust-remote {version('thrust-remote')}")
        raise typer.Exit(0)


@app.callback()
def _global(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", envvar=ENV_CONFIG, help="Path of thrust.yaml (default: nearest one upwards)."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    ctx.obj = AppState(config_path=config, debug=debug or _env_flag(ENV_DEBUG))


for _name in COMMAND_MODULES:
    importlib.import_module(f"{__package__}.{_name}").register(app)
for _info in app.registered_commands:
    if _info.cls in (None, TyperCommand):  # typer's default; a command's own class is left alone
        _info.cls = SwitchCommand


def run(argv: list[str] | None = None) -> None:
    """Console-script entry: run the app and map every failure to the exit codes of docs/architecture.md."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or _env_flag(ENV_DEBUG)
    if debug:  # library log lines (paramiko's) to stderr; without --debug they go nowhere
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        code = app(args=args, prog_name="thrust-remote", standalone_mode=False)
        sys.stdout.flush()  # a reader gone (`| head`) shows here, inside the handlers, not at exit
    except BrokenPipeError:
        _reader_gone()
    except SystemExit as exc:
        # typer answers a broken stdout (EPIPE) itself, with exit 1: the same case as above
        if isinstance(exc.__context__, OSError) and exc.__context__.errno == errno.EPIPE:
            _reader_gone()
        raise
    except ThrustError as exc:
        if debug:  # the traceback on top; the message and the exit code stay what a script expects
            traceback.print_exc()
        _report(exc.message, exc.hint, exc.label)
        sys.exit(exc.exit_code)
    except typer.Abort as exc:
        if isinstance(exc.__cause__, EOFError):  # typer turns an EOFError that escaped into Abort
            if debug:
                traceback.print_exception(exc.__cause__)
            _report("the SSH connection ended in the middle of a request", "rerun with --debug for the details")
            sys.exit(ExitCode.CONNECTION_LOST)
        err_console.print("interrupted")
        sys.exit(ExitCode.INTERRUPTED)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(ExitCode.INTERRUPTED)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except OSError as exc:
        if exc.errno not in DISK_FULL:
            _internal(exc, debug)
        if debug:
            traceback.print_exc()
        full = disk_full(exc)
        _report(full.message, full.hint, full.label)
        sys.exit(full.exit_code)
    except Exception as exc:
        if getattr(exc, "exit_code", None) == 2 and hasattr(exc, "format_message"):  # click's UsageError (typer
            # vendors click in some versions: known by its shape): error/hint as every other error
            _report(exc.format_message(), _global_option_hint(args, getattr(exc, "option_name", None))
                    or _usage_hint(getattr(exc, "ctx", None)))
            sys.exit(ExitCode.USAGE)
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click's other errors (a file it cannot open)
            exc.show()
            sys.exit(exc.exit_code)
        _internal(exc, debug)
    sys.exit(code if isinstance(code, int) else 0)


def _internal(exc: Exception, debug: bool) -> NoReturn:
    """The last resort: a bug, shown briefly unless --debug."""
    if debug:
        raise exc
    _report(f"internal error: {type(exc).__name__}: {exc}", "rerun with --debug for the traceback")
    sys.exit(ExitCode.FAILED)


GLOBAL_OPTIONS = {"--config": 1, "--debug": 0}  # thrust-remote's own options: how many values each takes


def _global_option_hint(args: list[str], option: str | None) -> str | None:
    """`train cartpole --config x.yaml`: the global option given after the command. The hint is the
    same command with it moved in front, where it works (a command's words after `--` are never
    taken for it)."""
    name = (option or "").split("=", 1)[0]
    if name not in GLOBAL_OPTIONS:
        return None
    end = args.index("--") if "--" in args else len(args)
    at = next((i for i, a in enumerate(args[:end]) if a == name or a.startswith(name + "=")), None)
    if at is None:
        return None
    width = 1 if "=" in args[at] else 1 + GLOBAL_OPTIONS[name]
    moved = [*args[at:at + width], *args[:at], *args[at + width:]]
    return f"{name} is thrust-remote's own option: it goes before the command: {shlex.join(['thrust-remote', *moved])}"


def _usage_hint(ctx: Any) -> str:
    """The command's usage line and how to see its options: what click prints above its `Error:`."""
    if ctx is None:
        return "thrust-remote -h lists the commands"
    usage = ctx.get_usage().removeprefix("Usage:").strip()
    return f"usage: {usage}; {ctx.command_path} -h shows its options"


def _reader_gone() -> None:
    """stdout's reader closed it (`train --json | head -1`): what a program killed by SIGPIPE gives,
    128 + 13, quietly; not 1, which would say the job failed. stdout goes to /dev/null so the
    interpreter's own flush at exit does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(128 + signal.SIGPIPE)


def _report(message: str, hint: str | None, label: str = "error") -> None:
    colour = "bold red" if label == "error" else "bold yellow"
    # messages carry host answers (an error, a cwd, a path): host_text escapes their control characters
    err_console.print(f"[{colour}]{label}:[/] {host_text(message, lines=True)}", highlight=False, markup=True,
                      soft_wrap=True)
    if hint:
        err_console.print(f"[yellow]hint:[/] {host_text(hint, lines=True)}", highlight=False, soft_wrap=True)
