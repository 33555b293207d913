"""A host account whose start-up files print to stdout for every command (an `echo` in ~/.bashrc, a
banner from a login script), over a real sshd. Such words come before a command's own output; they
must not break doctor, a train whose steps are commands of their own (THRUST_AGENT_LINK=0), or `logs`
(whose bytes are the log and whose offsets say where a reattach goes on).

The account is simulated with sshd's ForceCommand: a small script prints a line, then runs the command
the client asked for, as a shell does after its rc file (SFTP, which a login shell never wraps, goes
to the sftp server untouched)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import _start_sshd
from helpers import new_project, remote_tempdir

NOISE = "hello-from-rc"
JOBS = """\
jobs:
  talk:
    command: [sh, -c, 'for i in 1 2 3; do echo "line $i"; done']
"""


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    root = tmp_path_factory.mktemp("noisy-sshd")
    script = root / "noisy.sh"
    script.write_text("#!/bin/sh\n"
                      'if [ "$SSH_ORIGINAL_COMMAND" = internal-sftp ]; then exec /usr/lib/openssh/sftp-server; fi\n'
                      f"echo {NOISE}\n"
                      'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n')
    script.chmod(0o755)
    server = _start_sshd(root / "sshd", extra_config=f"ForceCommand {script}\n")
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.ssh  # its own sshd: an account that prints on every command
@pytest.mark.slow
@pytest.mark.parametrize("link", ["1", "0"])
def test_an_account_that_prints_on_every_command_still_trains_checks_and_logs_exactly(cli, noisy, tmp_path, link):
    env = {"THRUST_AGENT_LINK": link}
    workdir = remote_tempdir(noisy) / "w"
    proj = new_project(tmp_path / "project", noisy, workdir, jobs=JOBS)
    doctor = cli("doctor", "--json", cwd=proj, env=env)
    assert doctor.returncode in (0, 1), doctor.stderr  # a report, whatever its verdict
    assert json.loads(doctor.stdout)["checks"]
    train = cli("train", "talk", cwd=proj, env=env)
    assert train.returncode == 0, train.stderr
    assert NOISE not in train.stdout + train.stderr
    run_id = re.search(r"launching run (\S+)", train.stderr).group(1)
    log = (workdir / ".thrust" / "runs" / run_id / "log").read_bytes()
    whole = cli("logs", run_id, cwd=proj, env=env)
    assert whole.returncode == 0 and whole.stdout.encode() == log  # the log, and only the log
    skip = len(b"line 1\n")
    tail = cli("logs", run_id, "--offset", str(skip), cwd=proj, env=env)
    assert tail.stdout.encode() == log[skip:]


def test_a_report_after_a_start_up_files_line_is_still_the_report():
    from thrust_remote.host.report import _report_doc

    report = json.dumps({"host": "h", "checks": [{"id": "python", "status": "ok"}]})
    assert _report_doc(f"{NOISE}\n{report}\n") == json.loads(report)
    assert _report_doc("Welcome!\nnot json at all\n") is None
    assert _report_doc("") is None
