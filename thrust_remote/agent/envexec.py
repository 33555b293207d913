"""Run an argv with environment values that never appear on a command line, and (watch) end it when
the SSH channel that started it is gone.

    python -S -c <this file's source> exec ARGV...
    python -S -c <this file's source> watch ARGV...
    stdin: one JSON line {"KEY": "value", ...}, then (exec) the command's own stdin

An SSH command line is visible to every user of the host (`ps`, /proc/PID/cmdline), so the SSH runner
sends a command's env here on stdin instead of as `env -- K=V` (docs/architecture.md, "Security").
The line is read one byte at a time, so nothing after it is consumed.

exec: the process becomes the command: it inherits the rest of stdin, its exit status and signals are
the command's own.

watch: for a long command the laptop waits for (a job's `setup:`, `exec`, a build). A command run
over SSH without a pty gets no signal when its channel closes, so a Ctrl-C or a laptop that died left
it running on the host for hours. Here the command runs as a child in a process group of its own with
stdin from /dev/null, while this process holds the channel's stdin, which the laptop keeps open and
never writes to: EOF means sshd closed it (the channel was closed, the connection died), and the
command's whole group gets SIGTERM, then SIGKILL after GRACE_S. A SIGTERM/SIGHUP/SIGINT to this
process (the host's `timeout`) is passed on the same way. The exit status is the command's (128+N for
a signal).

A command that cannot be started exits 127 (not found) or 126 (not executable), as env(1) does.
Standard library only, and imported by nothing: the SSH layer runs this file's text with `python -S -c`.
"""

import contextlib
import json
import os
import select
import signal
import sys
import time

GRACE_S = 4.0  # SIGTERM to SIGKILL; under the host's `timeout -k 5`, so this process is never killed first
POLL_S = 0.25


def read_line(fd: int = 0) -> bytes:
    line = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            return bytes(line)
        line += byte


def start(argv: list) -> int:
    """Exec argv; returns only when it cannot be started (127/126). Python ignores SIGPIPE and SIGXFSZ
    for itself, and an ignored signal stays ignored across exec: the command gets the defaults back."""
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        sys.stderr.write(f"{argv[0]}: No such file or directory\n")
        return 127
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: {exc.strerror or exc}\n")
        return 126
    return 0  # not reached: exec replaced this process


def status_code(status: int) -> int:
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def end_group(pid: int, signum: int) -> int:
    """The command's group: `signum`, then SIGKILL after GRACE_S; the command's exit code."""
    deadline = time.monotonic() + GRACE_S
    for sig in (signum, signal.SIGKILL):
        with contextlib.suppress(OSError):  # the group is gone already
            os.killpg(pid, sig)
        while sig != signal.SIGKILL and time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return status_code(status)
            time.sleep(0.05)
    _, status = os.waitpid(pid, 0)
    return status_code(status)


def watch(argv: list) -> int:
    pid = os.fork()
    if pid == 0:  # the command: a group of its own (what end_group signals), stdin not the channel's
        code = 127
        try:
            os.setpgid(0, 0)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            code = start(argv)
        finally:
            os._exit(code)
    with contextlib.suppress(OSError):  # also here: a signal before the child ran its own must reach its group
        os.setpgid(pid, pid)
    caught = []
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: caught.append(signum))
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status_code(status)
        if caught:
            return end_group(pid, caught[0])
        ready, _, _ = select.select([0], [], [], POLL_S)
        if ready:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:  # sshd closed the channel's stdin: nobody waits for this command any more
                return end_group(pid, signal.SIGTERM)


def main(argv: list) -> int:
    if len(argv) < 2 or argv[0] not in ("exec", "watch"):
        sys.stderr.write("envexec: usage: exec|watch ARGV...\n")
        return 2
    line = read_line()
    env = json.loads(line.decode("utf-8")) if line else {}
    os.environ.update({str(k): str(v) for k, v in env.items()})
    return start(argv[1:]) if argv[0] == "exec" else watch(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
