"""What a host says reaches the terminal escaped, and a run this account cannot read says so (issue 26, 8 and 9).

A crafted run directory on the sshd "host" stands in for a compromised or hostile host: its run.json holds
escape sequences (clear the screen, set the window title) and rich markup in every string the CLI shows.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import remote_tempdir, throwaway_account

from thrust_remote.core.console import host_text
from thrust_remote.core.errors import ExitCode

RUN_ID = "cartpole-20261124-120000-evil"
CLEAR, TITLE = "\x1b[2J", "\x1b]0;pwned\x07"
HOSTILE = f"{CLEAR}{TITLE}[bold]loud[/bold]\x9b31m"


def _crafted_run(workdir: Path, **fields: object) -> Path:
    run_dir = workdir / ".thrust" / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    meta = {"run_id": RUN_ID, "job": "evil" + HOSTILE, "cwd": "/tmp/" + HOSTILE, "host": "h" + HOSTILE,
            "commit": HOSTILE, "started_at": "2026-11-24T12:00:00" + HOSTILE, "pid": 1, **fields}
    (run_dir / "run.json").write_text(json.dumps(meta))
    (run_dir / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_at": HOSTILE}))
    return run_dir


def _assert_inert(text: str) -> None:
    assert CLEAR not in text and "\x1b]" not in text and "\x9b" not in text, repr(text)


def test_host_text_escapes_controls_and_markup():
    assert host_text("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert host_text("[bold]x", markup=False) == "[bold]x"
    assert host_text("[bold]x") == "\\[bold]x"
    assert host_text("l1\nl2\r\t", lines=True) == "l1\nl2\\x0d\t"
    assert host_text("l1\nl2") == "l1\\x0al2"
    assert host_text("\u202eevil") == "\\u202eevil"
    assert host_text(b"caf\xe9".decode("utf-8", "surrogateescape"), markup=False) == "caf\\xe9"
    assert host_text("déjà vu 東京", markup=False) == "déjà vu 東京"


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_status_and_runs_show_a_hostile_run_json_escaped(cli, sshd, tmp_path, terminal):
    workdir = remote_tempdir(sshd) / "wd"
    _crafted_run(workdir)
    cfg = sshd.thrust_yaml(tmp_path / "thrust.yaml", workdir=str(workdir))
    env = {"THRUST_CONFIG": str(cfg), **({"FORCE_COLOR": "1", "TTY_COMPATIBLE": "1"} if terminal else {})}
    for args in (("status", RUN_ID), ("runs",)):
        result = cli(*args, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        out = result.stdout + result.stderr
        _assert_inert(out)
        if not terminal:
            assert "\x1b" not in out  # nothing but the host's text could have put one there
        assert "\\x1b]0;pwned\\x07" in out, out
        assert "[bold]loud[/bold]" in out  # the host's markup prints as itself, never as bold


def test_an_error_carrying_host_output_is_escaped(cli, sshd, tmp_path):
    """The host's `python:` stands in for a hostile host: it answers doctor with escape sequences and markup
    on stderr, which the error quotes."""
    fake = remote_tempdir(sshd) / "python3"
    fake.write_text("#!/bin/sh\n"
                    '[ "$1" = --version ] && { echo "Python 3.11.7"; exit 0; }\n'  # a Python, by its word
                    f"printf '%s\\n' 'boom{HOSTILE}' >&2\nexit 3\n")
    fake.chmod(0o755)
    cfg = sshd.thrust_yaml(tmp_path / "thrust.yaml")
    cfg.write_text(cfg.read_text().replace(f"python: {sshd.host_config().python}", f"python: {fake}"))
    result = cli("doctor", env={"THRUST_CONFIG": str(cfg)}, cwd=tmp_path)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert "\x1b" not in result.stdout + result.stderr
    assert "boom\\x1b[2J\\x1b]0;pwned\\x07[bold]loud[/bold]" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


# ------------------------------------------------------------------------------------------ item 9


@pytest.fixture
def other_account(sshd) -> Iterator[tuple[str, Path]]:
    """A throwaway account the sshd logs in as: root ignores file modes, so a run directory only another
    account can read needs one."""
    with throwaway_account(sshd) as account:
        yield account


@pytest.mark.parametrize("locked", ["run-dir", "run.json"])
def test_a_run_this_account_cannot_read_says_permission_denied_and_where(cli, sshd, tmp_path, other_account,
                                                                         locked):
    name, home = other_account
    workdir = home / "wd"
    run_dir = _crafted_run(workdir, job="cartpole", cwd=str(workdir), host="sandbox", commit="0" * 40)
    for path in (workdir, workdir / ".thrust", workdir / ".thrust" / "runs"):
        shutil.chown(path, name, name)  # the account's own tree; the run in it is root's
    (run_dir if locked == "run-dir" else run_dir / "run.json").chmod(0o700 if locked == "run-dir" else 0o600)
    if locked == "run.json":
        run_dir.chmod(0o755)
    denied = str(run_dir) if locked == "run-dir" else str(run_dir / "run.json")
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(
        "default_host: sandbox\nhosts:\n  sandbox:\n"
        f"    address: {name}@{sshd.ip}:{sshd.port}\n    workdir: {workdir}\n    python: /usr/bin/python3\n"
        f"    identity: {sshd.client_key}\n    known_hosts: {sshd.known_hosts}\n    connect_timeout: 5\n")
    env = {"THRUST_CONFIG": str(cfg)}
    for args in (("status", RUN_ID), ("fetch", RUN_ID), ("logs", RUN_ID), ("status", RUN_ID, "--json")):
        result = cli(*args, env=env, cwd=tmp_path)
        assert result.returncode == ExitCode.UNAVAILABLE, (args, result.stdout, result.stderr)
        assert "permission denied" in result.stderr and denied in result.stderr, result.stderr
        assert "LOST" not in result.stdout + result.stderr and "no job recorded" not in result.stderr
    listed = cli("runs", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "(permission denied)" in listed.stdout and RUN_ID in listed.stdout


def test_a_run_json_too_large_to_be_ours_is_refused_naming_the_host_and_the_file(cli, sshd, tmp_path):
    """A run.json of megabytes was read whole (200 MB took 650 MB of the laptop's memory) and then said
    nothing: the agent's status and the laptop's own reads stop at RUN_JSON_MAX and say where."""
    from thrust_remote.core.errors import TransferError
    from thrust_remote.host.session import HostSession
    from thrust_remote.host.ssh import SSHRunner
    from thrust_remote.runs import control

    workdir = remote_tempdir(sshd)
    run_dir = _crafted_run(workdir, job="cartpole", cwd=str(workdir), host="sandbox", commit="0" * 40,
                           padding="x" * (2 << 20))
    env = {"THRUST_CONFIG": str(sshd.thrust_yaml(tmp_path / "thrust.yaml", workdir=str(workdir)))}
    too_large = f"run {RUN_ID} on sandbox: {run_dir}/run.json is larger than 1,048,576 bytes: not read"
    for args in (("status", RUN_ID), ("resume", RUN_ID), ("logs", RUN_ID, "--follow")):
        result = cli(*args, env=env, cwd=tmp_path)
        assert result.returncode == ExitCode.TRANSFER, (args, result.stderr)
        assert too_large in result.stderr and "Traceback" not in result.stderr, result.stderr
    host = sshd.host_config(workdir=str(workdir))
    with HostSession.open(SSHRunner.from_host(host), host) as session, pytest.raises(TransferError) as info:
        control.read_run_json(session, str(run_dir))  # what resume, a reattach and tensorboard read
    assert info.value.message == f"{run_dir}/run.json on sandbox is larger than 1,048,576 bytes: not read"
