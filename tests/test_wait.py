"""`wait RUN...`: block until every run named has ended; 0 when all FINISHED, else the code `train` would
give for the first that did not; `--timeout` gives up with 75 (the runs go on) and the command to wait
again. The loop itself first (no SSH: statuses from a list, a clock of our own), then end to end over a
real sshd with runs that end when the test says so (a file on the host), never after a sleep."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from helpers import EXE, Clock, new_project, remote_tempdir, wait_until

from thrust_remote.core.errors import ConnectionLostError, ExitCode, StillGoing, UnreachableError
from thrust_remote.run import lifecycle


def _asks(answers: dict[str, list[str]]) -> list[tuple[str, lifecycle.Ask]]:
    """Each run's states, one per ask; the last one repeats."""
    def ask(run_id: str):
        seq = answers[run_id]
        state = seq.pop(0) if len(seq) > 1 else seq[0]
        return lambda: {"run_id": run_id, "state": state, "exit_code": 3 if state == "FAILED" else 0}
    return [(r, (lambda r=r: ask(r)())) for r in answers]


def test_wait_returns_every_status_in_the_order_given_and_tells_each_end_once():
    clock, heard = Clock(), []
    asks = _asks({"a": ["RUNNING", "RUNNING", "FINISHED"], "b": ["RUNNING", "FAILED"]})
    got = lifecycle.wait(asks, every=2.0, on_end=lambda st: heard.append(st["run_id"]), clock=clock,
                         sleep=clock.sleep)
    assert [st["run_id"] for st in got] == ["a", "b"] and [st["state"] for st in got] == ["FINISHED", "FAILED"]
    assert heard == ["b", "a"]  # as they ended, each once
    assert clock.now == 4.0  # asked at 0, 2 and 4 s
    assert lifecycle.wait_code(got) == 3  # the first that did not finish gives the code train would
    assert lifecycle.wait_code([got[0]]) == 0


def test_wait_past_its_timeout_names_the_runs_that_go_on_and_the_command_to_wait_again():
    clock = Clock()
    asks = _asks({"a": ["FINISHED"], "b": ["RUNNING"], "c": ["QUEUED"]})
    with pytest.raises(StillGoing) as info:
        lifecycle.wait(asks, timeout=5, every=2.0, again=lambda going: f"again {' '.join(going)}",
                       clock=clock, sleep=clock.sleep)
    assert info.value.exit_code == ExitCode.CONNECTION_LOST == 75
    # each as last seen: whether it is waiting for the scheduler or running is the user's next question
    assert "2 of 3 run(s) still going: b (RUNNING), c (QUEUED)" in info.value.message
    assert info.value.hint.endswith("again b c")
    assert lifecycle._as_seen({"state": "QUEUED", "reason": "Resources"}) == "QUEUED: Resources"  # a scheduler's why
    assert clock.now == 5.0  # the last sleep is cut to the deadline
    assert [st["state"] for st in info.value.statuses] == ["FINISHED", "RUNNING", "QUEUED"]  # as last seen


def test_ctrl_c_while_waiting_leaves_the_runs_going_with_75_and_the_command_to_wait_again():
    from thrust_remote.core.errors import Detached

    def ctrl_c(_s: float) -> None:
        raise KeyboardInterrupt

    asks = _asks({"a": ["FINISHED"], "b": ["RUNNING"], "c": ["QUEUED"]})
    with pytest.raises(Detached) as info:
        lifecycle.wait(asks, again=lambda going: f"again {' '.join(going)}", sleep=ctrl_c)
    assert info.value.exit_code == ExitCode.CONNECTION_LOST == 75  # as a detach: not a success, not a failure
    assert "2 of 3 run(s) still going: b, c" in info.value.message
    assert info.value.hint == "they go on; wait again with: again b c"


def test_a_host_that_stops_answering_is_asked_again_but_one_that_never_answered_is_an_error():
    clock, troubles = Clock(), []
    answers = iter([{"run_id": "a", "state": "RUNNING"}, UnreachableError("no route"),
                    ConnectionLostError("lost"), {"run_id": "a", "state": "FINISHED", "exit_code": 0}])

    def ask():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    got = lifecycle.wait([("a", ask)], every=2.0, on_trouble=lambda r, exc: troubles.append((r, exc.message)),
                         clock=clock, sleep=clock.sleep)
    assert got[0]["state"] == "FINISHED" and troubles == [("a", "no route"), ("a", "lost")]

    def down():
        raise UnreachableError("no route")

    with pytest.raises(UnreachableError):  # never answered: a wrong host is said at once, not waited out
        lifecycle.wait([("b", down)], every=2.0, clock=clock, sleep=clock.sleep)


# ------------------------------------------------------------------------------------------ over SSH

JOBS = """\
jobs:
  gated:
    command: [sh, -c, 'while [ ! -e "$THRUST_RUN_DIR/go" ]; do sleep 0.1; done']
  fails:
    command: [sh, -c, exit 3]
"""


@pytest.fixture(scope="module")
def gated(sshd, tmp_path_factory) -> tuple[Path, Path]:
    workdir = remote_tempdir(sshd) / "wait"
    return new_project(tmp_path_factory.mktemp("wait") / "project", sshd, workdir, jobs=JOBS), workdir


def _detach(cli, proj: Path, job: str) -> str:
    result = cli("train", job, "--detach", cwd=proj)
    assert result.returncode == 0, result.stderr
    return re.search(r"launching run (\S+)", result.stderr).group(1)


@pytest.mark.slow
def test_wait_blocks_until_every_run_has_ended_and_exits_as_train_would(cli, gated, tmp_path):
    proj, workdir = gated
    going, failing = _detach(cli, proj, "gated"), _detach(cli, proj, "fails")
    early = cli("wait", going, failing, "--timeout", "1", cwd=proj)
    assert early.returncode == 75, early.stderr
    assert f"still going: {going}" in early.stderr and f"thrust-remote wait {going}" in early.stderr
    as_json = cli("wait", going, "--timeout", "0", "--json", cwd=proj)
    assert as_json.returncode == 75 and json.loads(as_json.stdout)[0]["state"] == "RUNNING"  # how it was last seen
    told = tmp_path / "wait.err"
    with told.open("w") as err_file:
        waiting = subprocess.Popen([EXE, "wait", going, failing, "--json"], cwd=proj, text=True,
                                   stdout=subprocess.PIPE, stderr=err_file)
        try:
            # the failed run is told as soon as it is seen ended, while the gated one still holds wait
            wait_until(lambda: f"{failing}: FAILED (exit code 3)" in told.read_text(), 60, "wait to tell FAILED")
            assert waiting.poll() is None
            (workdir / ".thrust" / "runs" / going / "go").touch()
            out, _ = waiting.communicate(timeout=60)
        finally:
            waiting.kill()
    err = told.read_text()
    assert waiting.returncode == 3, err  # `fails` did not finish: its code, as train gives it
    statuses = json.loads(out)
    assert [(s["run_id"], s["state"]) for s in statuses] == [(going, "FINISHED"), (failing, "FAILED")]
    assert f"{going}: FINISHED (exit code 0)" in err
    assert f"{failing}: FAILED (exit code 3); its log: thrust-remote logs {failing} --host sandbox" in err
    alone = cli("wait", going, cwd=proj)
    assert alone.returncode == 0 and f"{going}: FINISHED" in alone.stderr
    # a command job's follow ends with a word, FINISHED too: train's own end line (issue 53, item 14)
    followed = cli("logs", going, "--follow", cwd=proj)
    assert followed.returncode == 0 and f"FINISHED: run {going} on sandbox, done in" in followed.stderr, followed.stderr
    unknown = cli("wait", going, "gated-20200101-000000-abcd", cwd=proj)
    assert unknown.returncode == ExitCode.USAGE and "Traceback" not in unknown.stderr
