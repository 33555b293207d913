"""Bad input is a clear error with its documented exit code (docs/architecture.md, "Exit codes": 64 a
usage error, 78 a bad config or params file), never a traceback, a hang or a crash on the host (issue 34's
fuzz cases). Each row is a project of its own (a thrust.yaml, maybe a params file) and a command line run
by the CLI in this process; none needs a host beyond `local`, and each is refused before a run starts."""

from __future__ import annotations

import time

import pytest
from helpers import git_init

SECRET = "sk-live-0123456789"
JOB = "jobs:\n  j:\n    command: [sh, -c, 'true']\n"
HUGE = "1" + "0" * 400  # 10**400: an int YAML reads whole, too large for any float
RUN = "j-20261127-000000-abcd"


def _laughs() -> str:
    """A "billion laughs": ten lines whose aliases expand to 9**10 strings (safe_load makes them at once;
    turning them into arguments took 64 s and then MemoryError)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "params:\n" + "".join(f"  {line}\n" for line in lines)


CASES = {
    # id: (thrust.yaml (bytes), other files, argv, exit code, what the error says)
    "deep-nesting": (b"jobs: " + b"[" * 5000 + b"]" * 5000 + b"\n", {}, ["runs"], 78,
                     "thrust.yaml:1: nested more than 64 levels deep"),
    "huge-connect-timeout": (f"hosts:\n  h:\n    address: u@box\n    connect_timeout: {HUGE}\n".encode(), {},
                             ["runs"], 78, "thrust.yaml:4: hosts.h.connect_timeout: expected seconds"),
    "huge-sync-every": (f"{JOB}    sync_every: {HUGE}\n".encode(), {}, ["runs"], 78,
                        "thrust.yaml:4: jobs.j.sync_every: expected seconds between pulls"),
    "nan-timeout": (b"hosts:\n  h:\n    address: u@box\n    connect_timeout: .nan\n", {}, ["runs"], 78,
                    "thrust.yaml:4: hosts.h.connect_timeout: expected seconds"),
    "invalid-utf8": (b"jobs:\n  j:\n    command: [caf\xe9]\n", {}, ["runs"], 78, "thrust.yaml:3: not UTF-8 text"),
    "nul-byte": (b"jobs:\n  j:\n    command: [x\x00]\n", {}, ["runs"], 78,
                 "thrust.yaml:3: not valid YAML: a character YAML does not allow (#x0000"),
    "alias-loop": (b"jobs: &a\n  j: *a\n", {}, ["runs"], 78, "thrust.yaml:1: an alias that refers to the value"),
    "billion-laughs-params": (JOB.encode(), {"laughs.yaml": _laughs()}, ["train", "j", "--params", "laughs.yaml"],
                              78, "laughs.yaml:7: aliases here expand to more than 100,000 values"),
    "nul-in-command": (b'jobs:\n  j:\n    command: ["x\\0y"]\n', {}, ["train", "j"], 78,
                       "thrust.yaml:3: jobs.j.command: a value that contains a NUL byte"),
    "surrogate-in-env": (JOB.encode() + b'    env: {TOKEN: "\\ud800"}\n', {}, ["train", "j"], 78,
                         "thrust.yaml:4: jobs.j.env.TOKEN: a value that contains a lone surrogate"),
    "surrogate-in-set": (JOB.encode(), {}, ["train", "j", "--set", "name=caf\udce9"], 64,
                         "--set name: a value that contains a lone surrogate"),
    "nproc-0": (JOB.encode(), {}, ["train", "j", "--nproc", "0"], 64, "Invalid value for '--nproc'"),
    "nproc-negative": (JOB.encode(), {}, ["train", "j", "--nproc", "-3"], 64, "Invalid value for '--nproc'"),
    "huge-offset": (JOB.encode(), {}, ["logs", RUN, "--offset", "9" * 30], 64,
                    "Invalid value for '--offset': too large a number"),
    "nan-wait-timeout": (JOB.encode(), {}, ["wait", RUN, "--timeout", "nan"], 64,
                         "Invalid value for '--timeout': nan is not a number of seconds"),
    "config-not-yaml": (b"", {"fake.env": f"API_KEY={SECRET}\nOTHER=1\n"}, ["--config", "fake.env", "runs"], 78,
                        "fake.env:1: expected a mapping of settings"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_clear_error_with_its_exit_code_and_no_traceback(cli, tmp_path, case):
    config, files, argv, code, says = CASES[case]
    project = git_init(tmp_path / "p")
    (project / "thrust.yaml").write_bytes(config)
    for name, text in files.items():
        (project / name).write_text(text)
    started = time.monotonic()
    result = cli(*argv, "--host", "local", cwd=project)
    assert time.monotonic() - started < 20  # refused as it is read, not after a minute of expanding it
    assert result.returncode == code, result.stderr
    assert says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr
    assert SECRET not in result.stdout + result.stderr
