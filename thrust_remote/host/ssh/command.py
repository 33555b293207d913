"""A command over SSH: the one string sent to the server, and the channel as `runner.drive` sees it.

- The command is built from an argv with shlex.join, so nothing the user passes is ever parsed by the
  remote shell. Env values are never in it (a command line is world-readable on the host: `ps`): they
  go on stdin to agent/envexec.py, which sets them and execs the argv (`with_env`). It runs under `sh -c '...; exit $?'`
  so a command killed by a signal reports 128+N (paramiko drops `exit-signal`); a channel that
  closes without a status therefore really means the link died (exit 75).
- sshd gives that string to the account's login shell, which need not be a POSIX one (fish, tcsh):
  `for_login_shell` writes it so that every one of them runs the same `sh -c SCRIPT`.
- A timeout is enforced by the host (`timeout -k 5 N`), so a timed-out command does not linger there.
- A long command (`with_env(watch=True)`) runs under envexec's watch, which ends it on the host when
  its channel is gone (Ctrl-C, a laptop killed): without a pty, sshd signals nothing.
"""

from __future__ import annotations

import functools
import json
import re
import select
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import paramiko
from paramiko.ssh_exception import SSHException

from thrust_remote.agent import envexec
from thrust_remote.agent.loginenv import LOGIN_ENV
from thrust_remote.core.errors import UsageError
from thrust_remote.host.runner import LinkLost, check_argv, check_env

CHUNK = 1 << 20


@functools.cache
def envexec_source() -> str:
    """agent/envexec.py as installed with this package: run with `python -S -c`, nothing uploaded first."""
    return Path(envexec.__file__).read_text(encoding="utf-8")


def with_env(python: str, argv: Sequence[str], env: Mapping[str, str] | None, stdin: bytes | None, *,
             watch: bool = False) -> tuple[list[str], bytes | None, int]:
    """(argv, stdin, wrapper) that run `argv` under `env` with no value on the command line: the values
    travel as stdin's first line to envexec, which execs argv with the rest of stdin. `watch` (no
    stdin of its own): envexec's watch mode instead, which ends the command's process group when the
    channel is gone; the caller then keeps the channel's stdin open. `wrapper`: how many words in front
    of argv are envexec's, which the command may run without (`build_remote_command`): only a watch
    with no env. No env and no watch: argv and stdin unchanged."""
    args = check_argv(argv)
    env_items = check_env(env)
    if watch and stdin:
        raise ValueError("a watched command takes no stdin: the channel's is the watch's")
    if not env_items and not watch:
        return args, stdin, 0
    line = json.dumps(env_items).encode() + b"\n"  # JSON escapes a newline inside a value
    prefix = [python, "-S", "-c", envexec_source(), "watch" if watch else "exec"]
    return [*prefix, *args], line + (stdin or b""), 0 if env_items else len(prefix)


def build_remote_command(
    argv: Sequence[str],
    cwd: str | None = None,
    timeout: float | None = None,
    *,
    wrapper: int = 0,
    login: bool = False,
) -> str:
    """The one string sent to the server. Every user value is a separately quoted word; env values are
    never among them (`with_env`). The first `wrapper` words of argv (envexec's watch) are left out
    when their program is not on the host, the command's stdin then /dev/null: a wrong `python:`
    must not stop `exec` from running the command that finds the right one. `login`: run in the host's
    login environment (agent/loginenv.py; a Slurm host's `login_shell: true`)."""
    args = check_argv(argv)
    for word in {args[0], args[min(wrapper, len(args) - 1)]}:
        if "=" in word:
            raise UsageError(f"command name {word!r} contains '='")
    limit: list[str] = []
    if timeout is not None:
        # the host enforces the limit itself, so a timed-out command does not linger there
        limit = ["timeout", "-k", "5", f"{max(timeout, 0.001):g}"]
    choose = ""
    if wrapper:
        head, args = args[:wrapper], args[wrapper:]
        choose = (f"if command -v {shlex.quote(head[0])} >/dev/null 2>&1; then set -- {shlex.join(head)}; "
                  "else set --; exec </dev/null; fi; ")
        script = " ".join(filter(None, [shlex.join(limit), '"$@"', shlex.join(args)]))
    else:
        script = shlex.join([*limit, *args])
    if cwd:
        if cwd == "~":
            target = '"$HOME"'
        elif cwd.startswith("~/"):
            target = '"$HOME"/' + shlex.quote(cwd[2:])
        else:
            target = shlex.quote(cwd)
        script = f"cd -- {target} && {script}"
    # `; exit $?` keeps sh as the parent (no exec optimisation), so a signal death becomes 128+N.
    return for_login_shell(f"{LOGIN_ENV if login else ''}{choose}{script}; exit $?")


# ------------------------------------------------------------------------------------------ login shells
# sshd hands the command string to the account's LOGIN shell (`$SHELL -c STRING`), which may be bash,
# dash, zsh, fish or tcsh: shlex.join quotes for a POSIX shell only (fish reads `\\` and `\'` inside
# single quotes as escapes; tcsh expands `!` even there and refuses a newline inside quotes). So the
# string is `sh -c WORD` with WORD written in the subset all of them read alike: runs of plain text in
# single quotes, `'`, `!` and `\` each as a backslash escape outside quotes. A control character
# (a newline, a tab, an escape) has no such spelling: a script holding one travels as printf %b's
# escapes (`\0ooo`), decoded by sh itself, byte for byte.

_PLAIN_RUN = re.compile(r"[^'!\\\x00-\x1f\x7f]+|['!\\]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_DECODE = 's=$(printf %bx "$1") && eval "${s%x}"'  # the x keeps trailing newlines from $(...)


def login_word(text: str) -> str:
    """`text` (no control characters) as one word that sh, bash, dash, zsh, fish and tcsh all read back
    unchanged."""
    if _CONTROL.search(text):
        raise ValueError("a control character has no spelling common to every login shell")
    if not text:
        return "''"
    return "".join(f"\\{run}" if run in ("'", "!", "\\") else f"'{run}'" for run in _PLAIN_RUN.findall(text))


def for_login_shell(script: str) -> str:
    """The command string that makes any login shell run `sh -c script`, `script` unchanged."""
    if not _CONTROL.search(script):
        return f"sh -c {login_word(script)}"
    escaped = _CONTROL.sub(lambda m: f"\\0{ord(m.group()):03o}", script.replace("\\", "\\\\"))
    return f"sh -c {login_word(_DECODE)} sh {login_word(escaped)}"


EOF_GRACE_S = 2.0  # past the exit status, how long a command's output may take to end (EOF)


class ChannelProcess:
    """The `runner.Process` hooks for a command running on an exec channel."""

    host_enforces_timeout = True  # build_remote_command wraps it in timeout(1)
    LINK_ERRORS = (SSHException, EOFError, OSError)

    def __init__(self, chan: paramiko.Channel, alive: Callable[[], bool], drop: Callable[[], None]) -> None:
        self.chan = chan
        self.transport = chan.get_transport()
        self.alive = alive
        self.lost = drop
        self._status_seen: float | None = None  # when the exit status was there with no EOF yet

    def read(self, wait: float) -> list[tuple[str, bytes]]:
        chan = self.chan
        chunks: list[tuple[str, bytes]] = []
        try:
            if not chan.closed:  # a closed channel may still hold output: read on
                select.select([chan], [], [], wait)
            while chan.recv_ready():
                chunks.append(("out", chan.recv(CHUNK)))
            while chan.recv_stderr_ready():
                chunks.append(("err", chan.recv_stderr(CHUNK)))
        except self.LINK_ERRORS:
            raise LinkLost from None
        return chunks

    def exit_code(self) -> int | None:
        chan = self.chan
        try:
            drained = not chan.recv_ready() and not chan.recv_stderr_ready()
            if (chan.exit_status_ready() and drained and self._output_ended()) or chan.closed \
                    or not self.transport.is_active():
                # paramiko marks a channel closed without a status as "ready" with -1; our sh wrapper
                # always sends a real status, so -1 means the link died under the command.
                if not chan.exit_status_ready() or chan.exit_status == -1:
                    raise LinkLost
                code = chan.recv_exit_status()
                chan.close()
                return code
        except self.LINK_ERRORS:
            raise LinkLost from None
        return None

    def _output_ended(self) -> bool:
        """The output is whole: sshd sends the exit status as soon as the command exits, while output past
        the channel's window still waits to be read (a 3 MB answer lost its last 32 KB under load), so
        the end is EOF too. A child that keeps the command's stdout open holds EOF back: after
        EOF_GRACE_S the status alone ends it, as before."""
        if self.chan.eof_received:
            return True
        now = time.monotonic()
        if self._status_seen is None:
            self._status_seen = now
        return now - self._status_seen >= EOF_GRACE_S

    def kill(self) -> None:
        # the remote `timeout` should have ended it already; do not wait forever
        self.chan.close()
