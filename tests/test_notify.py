"""`notify:`: a command, a webhook and the desktop told when a followed run ends, each run once, a failing
notifier only a warning, the webhook's URL never printed. The webhook is a real HTTP server this test
starts on loopback; the runs are real runs on the `local` host (the same pipeline as over SSH)."""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import commit, git_init

from thrust_remote.core.config import load_config
from thrust_remote.core.errors import ConfigError

SECRET = "T000/B000/not-for-your-eyes"


class Hook:
    """A loopback HTTP server that keeps every JSON body POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                length = int(self.headers.get("Content-Length") or 0)
                hook.bodies.append({"path": self.path, **json.loads(self.rfile.read(length))})
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

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
    from thrust_remote.run.buildenv import job_spec

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
