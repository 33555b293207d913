"""`notify:`: a command, a webhook and the desktop told when a followed run ends, each run once, a failing
notifier only a warning, the webhook's URL never printed. The webhook is a real HTTP server this test
starts on loopback; the runs are real runs on the `local` host (the same pipeline as over SSH)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import EXE, commit, git_init, wait_until

from thrust_remote.core.config import load_config
from thrust_remote.core.errors import ConfigError

SECRET = "T000/B000/not-for-your-eyes"


class Hook:
    """A loopback HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.gets: list[str] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                hook.bodies.append({"path": self.path, **json.loads(self.rfile.read(length))})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hook.gets.append(self.path)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.close()


class SlowHook:
    """A loopback server that takes a POST whole, then answers one byte every 2 s (each read is quick,
    the answer never ends) for at most `limit_s`; `asked` is set when a request has arrived. `status`
    and `headers` are what it answers (a 302 is answered at once)."""

    def __init__(self, *, status: str = "200 OK", headers: str = "", dribble: bool = True,
                 limit_s: float = 60.0) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/services/{SECRET}"
        self.answer = f"HTTP/1.1 {status}\r\n{headers}Content-Length: 2\r\n\r\nok".encode()
        self.dribble, self.limit_s = dribble, limit_s
        self.asked, self.closed = threading.Event(), threading.Event()
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(4096)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1)) if b"ength" in head else 0
            while len(body) < length:
                body += conn.recv(4096)
            self.requests.append(head + b"\r\n\r\n" + body)
            self.asked.set()
            if not self.dribble:
                conn.sendall(self.answer)
                return
            until = time.monotonic() + self.limit_s
            for byte in self.answer:
                if self.closed.wait(2.0) or time.monotonic() > until:
                    return
                with contextlib.suppress(OSError):
                    conn.sendall(bytes([byte]))

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (a close alone would not)
        self.listener.close()


CONFIG = """\
notify:
  command: [sh, -c, 'env | grep ^THRUST_ | sort >> "$0"', {told}]
  webhook: $TEST_HOOK
jobs:
  quick:
    command: [sh, -c, 'echo hi; exit "$0"', "{code}"]
  own:
    command: [sh, -c, 'echo own']
    notify:
      command: [sh, -c, 'echo "own $THRUST_RUN_ID" >> "$0"', {told}]
"""

HOOK_ONLY = "notify:\n  webhook: $TEST_HOOK\njobs:\n  quick:\n    command: [sh, -c, 'true']\n"


def _project(path: Path, told: Path, code: int = 0) -> Path:
    git_init(path)
    (path / "thrust.yaml").write_text(CONFIG.format(told=told, code=code))
    commit(path, "a project that wants to know")
    return path


def _run_id(stderr: str) -> str:
    return re.search(r"following (\S+)", stderr).group(1)


@pytest.mark.slow
def test_a_run_that_ends_tells_the_command_and_the_webhook_once(cli, hook, tmp_path):
    told = tmp_path / "told.txt"
    proj = _project(tmp_path / "p", told, code=4)
    env = {"TEST_HOOK": hook.url}
    trained = cli("train", "quick", "--host", "local", cwd=proj, env=env)
    assert trained.returncode == 4, trained.stderr
    run_id = _run_id(trained.stderr)
    seen = dict(line.split("=", 1) for line in told.read_text().splitlines())
    assert seen == {"THRUST_RUN_ID": run_id, "THRUST_RUN_STATE": "FAILED", "THRUST_EXIT_CODE": "4",
                    "THRUST_HOST": "local", "THRUST_JOB": "quick", "THRUST_RUN_REASON": ""}
    assert len(hook.bodies) == 1
    body = hook.bodies[0]
    assert body["path"].endswith(SECRET) and body["run_id"] == run_id and body["state"] == "FAILED"
    assert body["exit_code"] == 4 and body["text"] == f"thrust-remote: quick run {run_id} on local ended FAILED " \
                                                      "(exit code 4)"
    # following it again (a reattach, a wait) tells nobody twice
    again = cli("logs", run_id, "--follow", "--host", "local", cwd=proj, env=env)
    waited = cli("wait", run_id, "--host", "local", cwd=proj, env=env)
    assert again.returncode == 4 and waited.returncode == 4
    assert len(hook.bodies) == 1 and len(told.read_text().splitlines()) == 6
    for out in (trained, again, waited):
        assert SECRET not in out.stdout + out.stderr


@pytest.mark.slow
def test_a_run_only_waited_for_is_told_and_a_jobs_own_notify_replaces_the_top_level(cli, hook, tmp_path):
    told = tmp_path / "told.txt"
    proj = _project(tmp_path / "p", told)
    env = {"TEST_HOOK": hook.url}
    started = cli("train", "quick", "--host", "local", "--detach", cwd=proj, env=env)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"launching run (\S+)", started.stderr).group(1)
    assert hook.bodies == []  # detached: nobody followed it to its end yet
    waited = cli("wait", run_id, "--host", "local", cwd=proj, env=env)
    assert waited.returncode == 0, waited.stderr
    assert [b["run_id"] for b in hook.bodies] == [run_id] and hook.bodies[0]["state"] == "FINISHED"
    own = cli("train", "own", "--host", "local", cwd=proj, env=env)
    assert own.returncode == 0, own.stderr
    assert told.read_text().splitlines()[-1] == f"own {_run_id(own.stderr)}"
    assert len(hook.bodies) == 1  # the job's own notify has no webhook


@pytest.mark.slow
def test_a_notifier_that_fails_is_a_warning_and_never_shows_the_url(cli, tmp_path):
    proj = _project(tmp_path / "p", tmp_path / "no-such-dir" / "told.txt")  # the command fails: no such dir
    # a closed port: nothing listens there
    trained = cli("train", "quick", "--host", "local", cwd=proj, env={"TEST_HOOK": f"http://127.0.0.1:9/{SECRET}"})
    assert trained.returncode == 0, trained.stderr  # the run finished: that is the exit status
    warnings = [line for line in trained.stderr.splitlines() if line.startswith("warning:")]
    assert any("notify command 'sh' exited" in w for w in warnings), warnings
    assert any("notify webhook: not delivered" in w for w in warnings), warnings
    assert SECRET not in trained.stderr + trained.stdout
    unset = cli("train", "quick", "--host", "local", cwd=proj, env={"TEST_HOOK": ""})
    assert unset.returncode == 0 and "$TEST_HOOK is not set in this environment" in unset.stderr


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("notify:\n  webhook: ftp://example.com/" + SECRET + "\n", 2, "expected an http(s):// URL, or $NAME"),
        # what urllib or http.client would only refuse after the run, as a crash that skipped the fetch
        ("notify:\n  webhook: http://hooks.example:abc/" + SECRET + "\n", 2, "its port is not a number"),
        ("notify:\n  webhook: 'http://[::1/" + SECRET + "'\n", 2, "its [IPv6 address] is not valid"),
        ('notify:\n  webhook: "http://hooks.example/' + SECRET + '\\x01"\n', 2, "a space or a control character"),
        ("jobs:\n  j:\n    command: [x]\n    notify:\n      webhook: http://u:" + SECRET + "@h:99999/x\n", 5,
         "jobs.j.notify.webhook: not a usable URL: its port"),
        ("notify:\n  command: notify-me now\n", 2, "expected a list"),
        ("notify:\n  sms: yes\n", 2, "unknown key"),
        ("jobs:\n  j:\n    command: [x]\n    notify:\n      desktop: maybe\n", 5, "jobs.j.notify.desktop"),
    ],
)
def test_a_bad_notify_is_78_with_file_and_line_and_never_echoes_the_url(tmp_path, text, line, words):
    path = tmp_path / "thrust.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.message.startswith(f"{path}:{line}: ") and words in info.value.message
    assert SECRET not in info.value.message


@pytest.mark.slow
def test_desktop_uses_notify_send_where_it_is(cli, tmp_path):
    # notify-send is not on this machine: a stand-in of the same name on PATH keeps the argv it was given
    bin_dir, got = tmp_path / "bin", tmp_path / "desktop.txt"
    bin_dir.mkdir()
    (bin_dir / "notify-send").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {got}\n')
    (bin_dir / "notify-send").chmod(0o755)
    proj = tmp_path / "p"
    git_init(proj)
    (proj / "thrust.yaml").write_text("notify:\n  desktop: true\njobs:\n  quick:\n    command: [sh, -c, 'true']\n")
    commit(proj, "desktop")
    trained = cli("train", "quick", "--host", "local", cwd=proj, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert trained.returncode == 0, trained.stderr
    title, text = got.read_text().splitlines()
    assert title == "thrust-remote" and text == f"thrust-remote: quick run {_run_id(trained.stderr)} on local ended " \
                                                "FINISHED (exit code 0)"


@pytest.mark.slow
def test_an_optimize_study_that_ends_is_told_with_its_name(cli, tmp_path):
    told = tmp_path / "told.txt"
    proj = tmp_path / "p"
    git_init(proj)
    (proj / "score.sh").write_text('for w in "$@"; do case "$w" in lr=*) lr="${w#lr=}";; esac; done\n'
                                   'echo "THRUST_METRICS {\\"step\\": 1, \\"score\\": $lr}"\n')
    (proj / "thrust.yaml").write_text(f"""\
notify:
  command: [sh, -c, 'env | grep ^THRUST_ | sort >> "$0"', {told}]
jobs:
  words:
    command: [sh, score.sh]
    objective: {{metric: score, mode: max}}
search:
  words: {{lr: {{choices: [0.1, 0.3]}}}}
""")
    commit(proj, "a study")
    result = cli("optimize", "words", "--trials", "2", "--seed", "2", "--host", "local", "--study", "notified",
                 "--json", cwd=proj, timeout=300)
    assert result.returncode == 0, result.stderr
    seen = dict(line.split("=", 1) for line in told.read_text().splitlines())
    # one message for the study, none per trial (nobody followed a trial as a run)
    assert seen == {"THRUST_RUN_ID": "notified", "THRUST_RUN_STATE": "FINISHED", "THRUST_EXIT_CODE": "0",
                    "THRUST_HOST": "local", "THRUST_JOB": "optimize words", "THRUST_RUN_REASON": ""}
    assert len(told.read_text().splitlines()) == 6


def test_the_job_spec_sent_to_a_host_never_carries_notify(tmp_path):
    from thrust_remote.host.jobspec import job_spec

    path = tmp_path / "thrust.yaml"
    path.write_text(f"jobs:\n  j:\n    command: [x]\n    notify:\n      webhook: https://hooks.example/{SECRET}\n")
    spec = job_spec(load_config(path, environ={}).job("j"))
    assert "notify" not in spec and SECRET not in json.dumps(spec)


@pytest.mark.slow
def test_a_relative_notify_command_is_the_projects_wherever_train_is_typed(cli, tmp_path):
    told = tmp_path / "told.txt"
    proj = git_init(tmp_path / "p")
    (proj / "tell.sh").write_text(f'#!/bin/sh\necho "told $THRUST_RUN_ID" >> {told}\n')
    (proj / "tell.sh").chmod(0o755)
    (proj / "sub").mkdir()
    (proj / "sub" / "keep.txt").write_text("a folder of the project\n")
    (proj / "thrust.yaml").write_text("notify:\n  command: [./tell.sh]\n"
                                      "jobs:\n  quick:\n    command: [sh, -c, 'true']\n")
    commit(proj, "a notify script of the project's")
    trained = cli("train", "quick", "--host", "local", cwd=proj / "sub")
    assert trained.returncode == 0, trained.stderr
    assert "warning" not in trained.stderr
    assert told.read_text() == f"told {_run_id(trained.stderr)}\n"


# over 15 s: the notification's own deadline (15 s for all its notifiers together) is what it checks
@pytest.mark.slow
def test_a_webhook_that_dribbles_its_answer_holds_train_no_longer_than_the_notifications_deadline(
        cli, tmp_path, monkeypatch):
    """The documented deadline is 15 s; the test runs `train` in-process at 3 s (the same code path)."""
    from thrust_remote.runs import notify

    assert notify.TIMEOUT_S == 15.0
    monkeypatch.setattr(notify, "TIMEOUT_S", 3.0)
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text("notify:\n  webhook: $TEST_HOOK\njobs:\n  quick:\n"
                                      "    command: [sh, -c, 'echo made > out.txt']\n    artifacts: [out.txt]\n")
    commit(proj, "a project whose webhook answers a byte every 2 s")
    slow = SlowHook()
    try:
        started = time.monotonic()
        trained = cli("train", "quick", "--host", "local", "--json", cwd=proj, env={"TEST_HOOK": slow.url})
        took = time.monotonic() - started
    finally:
        slow.close()
    assert trained.returncode == 0, trained.stderr
    assert slow.asked.is_set() and took < 3 + 10, took  # the run itself takes well under a second
    assert "notify webhook: no answer within the notification's 3 s" in trained.stderr
    out = json.loads(trained.stdout)  # then the fetch and --json, as with no webhook
    assert out["artifacts"]["files"] == 1, out
    assert SECRET not in trained.stderr + trained.stdout


@pytest.mark.slow
def test_ctrl_c_while_a_runs_end_is_told_says_it_ended_and_the_next_wait_tells_it_once(cli, hook, tmp_path):
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(HOOK_ONLY)
    commit(proj, "a project that wants to know")
    started = cli("train", "quick", "--host", "local", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"launching run (\S+)", started.stderr).group(1)
    slow = SlowHook()
    try:
        proc = subprocess.Popen([EXE, "wait", run_id, "--host", "local"], cwd=proj, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NO_COLOR": "1", "TEST_HOOK": slow.url})
        try:
            wait_until(slow.asked.is_set, 60, "the webhook's POST")
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
    finally:
        slow.close()
    # the run finished: nothing goes on to wait for; what was cut is its notification, never marked told
    assert proc.returncode == 130, err
    assert f"({run_id} ended FINISHED), before its notification was done" in err, err
    assert f"tell it with: thrust-remote wait {run_id} --host local" in err and "still going" not in err
    assert not (proj / ".thrust" / "index" / f"{run_id}.notified").exists()
    for _ in range(2):  # the next follower tells it, and only that one
        waited = cli("wait", run_id, "--host", "local", cwd=proj, env={"TEST_HOOK": hook.url})
        assert waited.returncode == 0, waited.stderr
    assert [b["run_id"] for b in hook.bodies] == [run_id]
    assert sorted(p.name for p in (proj / ".thrust" / "index").iterdir()) == [f"{run_id}.json", f"{run_id}.notified"]


HOLD_CLAIM = """import sys
from pathlib import Path
from thrust_remote.runs import notify
with notify.claim(Path(sys.argv[1]), sys.argv[2]) as ours:
    print("claimed", ours, flush=True)
    sys.stdin.readline()
"""


def _claimed(root: Path, run_id: str) -> bool:
    from thrust_remote.runs import notify

    with notify.claim(root, run_id) as ours:
        return ours  # the block ends normally: told, when it was ours


def test_one_follower_tells_a_runs_end_and_a_claim_whose_owner_died_is_taken_over(tmp_path):
    import sys

    def holder(run_id: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(tmp_path), run_id], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "claimed True\n"
        return proc

    first = holder("r1")
    second: list[bool] = []
    other = threading.Thread(target=lambda: second.append(_claimed(tmp_path, "r1")))
    other.start()  # a second follower meanwhile: it waits for the claim, then finds the end told
    first.communicate("done\n", timeout=30)
    other.join(30)
    assert second == [False]
    dying = holder("r2")
    dying.kill()  # Ctrl-C or a crash mid-send: its claim goes with it, the end not marked told
    dying.wait()
    assert _claimed(tmp_path, "r2") is True
    assert _claimed(tmp_path, "r2") is False


@pytest.mark.slow
def test_a_webhook_that_redirects_is_a_warning_and_the_post_is_not_sent_on_as_a_get(cli, hook, tmp_path):
    target = hook.url.replace(SECRET, "moved")
    mover = SlowHook(status="302 Found", headers=f"Location: {target}\r\n", dribble=False)
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(HOOK_ONLY)
    commit(proj, "a webhook that moved")
    try:
        trained = cli("train", "quick", "--host", "local", cwd=proj, env={"TEST_HOOK": mover.url})
    finally:
        mover.close()
    assert trained.returncode == 0, trained.stderr
    assert len(mover.requests) == 1 and mover.requests[0].startswith(b"POST ")
    assert hook.gets == [] and hook.bodies == []  # urllib's way: a GET without the body, told to nobody
    assert "notify webhook: the server answered 302 Found (a redirect: not followed" in trained.stderr
    assert SECRET not in trained.stderr + trained.stdout and "moved" not in trained.stderr


@pytest.mark.slow
def test_a_webhook_variable_that_is_no_url_is_a_warning_and_the_run_is_fetched(cli, tmp_path):
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text("notify:\n  webhook: $TEST_HOOK\njobs:\n  quick:\n"
                                      "    command: [sh, -c, 'echo made > out.txt']\n    artifacts: [out.txt]\n")
    commit(proj, "a webhook read from the environment")
    for value, words in ((f"http://127.0.0.1:abc/{SECRET}", "its port is not a number"),
                         (f"http://127.0.0.1/{SECRET}\x01", "it contains a space or a control character"),
                         (f"http://[::1/{SECRET}", "its [IPv6 address] is not valid")):
        trained = cli("train", "quick", "--host", "local", "--json", cwd=proj, env={"TEST_HOOK": value})
        assert trained.returncode == 0, trained.stderr
        assert f"notify webhook: the value of $TEST_HOOK is not a usable URL ({words}" in trained.stderr
        assert json.loads(trained.stdout)["artifacts"]["files"] == 1
        assert SECRET not in trained.stderr + trained.stdout and "Traceback" not in trained.stderr


@pytest.mark.slow
def test_a_notify_command_that_leaves_a_child_behind_is_done_when_it_exits(cli, tmp_path):
    told, child = tmp_path / "told.txt", tmp_path / "child.pid"
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(
        f"notify:\n  command: [sh, -c, '(exec sleep 120) & echo $! > {child}; echo told > {told}']\n"
        "jobs:\n  quick:\n    command: [sh, -c, 'true']\n")
    commit(proj, "a notify command that starts something in the background")
    try:
        started = time.monotonic()
        trained = cli("train", "quick", "--host", "local", cwd=proj)
        took = time.monotonic() - started
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(child.read_text()), signal.SIGKILL)
    assert trained.returncode == 0, trained.stderr
    assert told.read_text() == "told\n" and "warning" not in trained.stderr, trained.stderr
    assert took < 10, took  # not the 15 s of a notifier taken for hung
