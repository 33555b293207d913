"""Run an argv with environment values that never appear on a command line.

    python -S -c <this file's source> ARGV...
    stdin: one JSON line {"KEY": "value", ...}, then the command's own stdin

An SSH command line is visible to every user of the host (`ps`, /proc/PID/cmdline), so the SSH runner
sends a command's env here on stdin instead of as `env -- K=V` (docs/architecture.md, "Security").
The line is read one byte at a time, so nothing after it is consumed: the command inherits the rest of
stdin. Then the process becomes the command (exec): its exit status and signals are the command's own.
A command that cannot be started exits 127 (not found) or 126 (not executable), as env(1) does.
Standard library only, and imported by nothing: the SSH layer runs this file's text with `python -S -c`.
"""

import json
import os
import sys


def read_line(fd: int = 0) -> bytes:
    line = bytearray()
    while True:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            return bytes(line)
        line += byte


def main(argv: list) -> int:
    if not argv:
        sys.stderr.write("envexec: no command\n")
        return 2
    line = read_line()
    env = json.loads(line.decode("utf-8")) if line else {}
    os.environ.update({str(k): str(v) for k, v in env.items()})
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        sys.stderr.write(f"{argv[0]}: No such file or directory\n")
        return 127
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: {exc.strerror or exc}\n")
        return 126
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
