"""A study's driver lease on the host (agent/lease.py), in this process: the lease is what keeps two
drivers of one study from both running it, so its exclusivity is tried with real threads racing on a
real file, and every answer the agent's subcommand gives (JSON, exit code) is checked as the laptop
reads it. The same subcommands over a real sshd: test_agent_link.py; the study's use of them:
test_optimize.py's compare-and-swap test."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from pathlib import Path

import pytest

from thrust_remote.agent import lease
from thrust_remote.agent.protocol import AgentExit


def _agent(*argv: str, stdin: str = "") -> tuple[int, dict]:
    """`agent lease ARGV` as the host runs it: its exit code and its one JSON line."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), _stdin(stdin):
        code = lease.main(list(argv))
    return code, json.loads(out.getvalue())


@contextlib.contextmanager
def _stdin(text: str):
    import sys

    before, sys.stdin = sys.stdin, io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = before


def test_of_many_drivers_creating_the_lease_at_once_exactly_one_holds_it(tmp_path: Path) -> None:
    path = str(tmp_path / "studies" / "s.driver.json")  # its directory does not exist yet
    barrier, won = threading.Barrier(16), []

    def driver(n: int) -> None:
        barrier.wait()
        if lease.create(path, json.dumps({"token": f"t{n}"})):
            won.append(n)

    threads = [threading.Thread(target=driver, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(won) == 1
    assert lease.read(path)["lease"] == {"token": f"t{won[0]}"}  # the winner's body, whole
    assert Path(path).stat().st_mode & 0o077 == 0  # the account's own: it names the driver's host and pid


def test_renew_and_release_belong_to_the_holder_alone(tmp_path: Path) -> None:
    path = str(tmp_path / "s.driver.json")
    assert _agent("create", path, stdin='{"token": "mine", "heartbeat": 1}') == (AgentExit.OK, {"created": True})
    assert _agent("create", path, stdin='{"token": "theirs"}') == (AgentExit.REFUSED, {"created": False})
    # a driver that lost the lease can neither renew it nor drop it
    assert _agent("renew", path, "--token", "theirs", stdin='{"token": "theirs"}') == \
        (AgentExit.REFUSED, {"renewed": False})
    assert _agent("release", path, "--token", "theirs") == (AgentExit.OK, {"released": False})
    assert _agent("read", path)[1]["lease"] == {"token": "mine", "heartbeat": 1}
    # the holder renews (its heartbeat moves on) and then lets go
    assert _agent("renew", path, "--token", "mine", stdin='{"token": "mine", "heartbeat": 2}') == \
        (AgentExit.OK, {"renewed": True})
    assert _agent("read", path)[1]["lease"]["heartbeat"] == 2
    assert _agent("release", path, "--token", "mine") == (AgentExit.OK, {"released": True})
    assert _agent("read", path)[1] == {"present": False, "text": "", "lease": {}}
    assert _agent("renew", path, "--token", "mine", stdin="{}")[1] == {"renewed": False}  # nothing to renew


@pytest.mark.parametrize("text", ["{half a lease", "[1, 2]", "   \n"])
def test_a_lease_that_is_not_a_json_object_counts_as_no_drivers(tmp_path: Path, text: str) -> None:
    """A driver killed mid-write, or a file edited by hand: the study may be taken over, never a crash."""
    path = tmp_path / "s.driver.json"
    path.write_text(text)
    _, answer = _agent("read", str(path))
    assert answer["lease"] == {} and answer["text"] == text
    assert answer["present"] is bool(text.strip())


def test_the_stop_file_says_when_and_renew_or_release_without_a_token_is_a_usage_error(tmp_path, capsys) -> None:
    stop = tmp_path / "s.stop"
    assert _agent("stop", str(stop)) == (AgentExit.OK, {"path": str(stop)})
    assert stop.read_text().strip().endswith("Z") and stop.read_text()[:2] == "20"  # a UTC date
    for action in ("renew", "release"):
        with pytest.raises(SystemExit) as info:
            lease.main([action, str(tmp_path / "s.driver.json")])
        assert info.value.code == 2 and f"{action} needs --token" in capsys.readouterr().err
