"""`runs --all`'s exit code: 0 (with the failing hosts' reasons) when at least one host answered,
69 (unavailable) when none did, over a real sshd and a port nothing listens on."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from helpers import new_project

from thrust_remote.core.errors import ExitCode


def _closed_port() -> int:
    """A port nothing listens on (bound, then released): a connection to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _down(name: str, sshd) -> str:
    return (f"  {name}:\n    address: {sshd.user}@127.0.0.1:{_closed_port()}\n"
            f"    known_hosts: {sshd.known_hosts}\n    identity: {sshd.client_key}\n    connect_timeout: 5\n")


def test_runs_all_is_0_when_one_host_answered_and_69_when_none_did(cli, sshd, tmp_path: Path) -> None:
    proj = new_project(tmp_path / "proj", sshd, tmp_path / "work")
    config = proj / "thrust.yaml"
    config.write_text(config.read_text().replace("hosts:\n", "hosts:\n" + _down("down", sshd), 1))
    some = cli("runs", "--all", "--timeout", "30", "--json", cwd=proj)
    assert some.returncode == 0, some.stderr  # sandbox answered (no runs): success, down's error in its row
    rows = json.loads(some.stdout)
    assert [r["host"] for r in rows] == ["down"] and "error" in rows[0], rows

    # no host answers: a listing of nothing would read as "no runs anywhere"
    only_down = tmp_path / "down.yaml"
    only_down.write_text("default_host: down\nhosts:\n" + _down("down", sshd) + _down("gone", sshd))
    for extra in ((), ("--json",), ("--summary",)):
        none = cli("--config", str(only_down), "runs", "--all", "--timeout", "30", *extra, cwd=proj)
        assert none.returncode == ExitCode.UNAVAILABLE, (extra, none.returncode, none.stdout, none.stderr)
        assert "Traceback" not in none.stderr
        assert "down" in none.stderr + none.stdout and "gone" in none.stderr + none.stdout
        assert "no host answered" in none.stderr, none.stderr
