"""A host shared with other accounts (docs/architecture.md, "Security"), over a real sshd with real
non-root accounts: what thrust-remote makes there is its account's alone (another account can neither
read a job's settings nor list the runs, nor hold the launch lock that would block the owner's
launches), and a first sync never takes over a directory that is not a thrust-remote workdir, the
account's home least of all."""

from __future__ import annotations

import json
import os
import re

from helpers import as_account, new_project, throwaway_account

from thrust_remote.core.errors import ExitCode

SECRET = "tok-4c1d9e"  # a job's `env:` value, committed in its thrust.yaml as a user might
JOBS = f"""\
jobs:
  quick:
    kind: command
    command: [sh, -c, 'echo "$API_TOKEN" | wc -c > "$THRUST_RUN_DIR/seen"']
    env: {{API_TOKEN: {SECRET}}}
"""


def _as(sshd, account: str, workdir: str, tmp_path, name: str = "project"):
    """A project whose host `sandbox` is this sshd as `account`, its workdir `workdir`, python the system's."""
    proj = new_project(tmp_path / name, sshd, tmp_path / "unused", jobs=JOBS, python="/usr/bin/python3")
    cfg = proj / "thrust.yaml"
    text = re.sub(r"address: \w+@", f"address: {account}@", cfg.read_text())
    cfg.write_text(re.sub(r"workdir: .*", f"workdir: {workdir}", text, count=1))
    return proj


def test_another_account_can_neither_read_the_settings_nor_list_the_runs_nor_hold_the_lock(cli, sshd, tmp_path):
    with throwaway_account(sshd) as (owner, home), throwaway_account(sshd) as (other, _):
        workdir = home / "thrust"
        proj = _as(sshd, owner, str(workdir), tmp_path)
        trained = cli("train", "quick", "--json", cwd=proj)
        assert trained.returncode == 0, trained.stderr
        run_id = json.loads(trained.stdout)["run_id"]
        tree = workdir / ".thrust" / "trees" / run_id
        assert (workdir / ".thrust" / "runs" / run_id / "seen").read_text().strip() == str(len(SECRET) + 1)
        for path in (workdir, workdir / ".thrust"):
            assert path.stat().st_mode & 0o077 == 0, oct(path.stat().st_mode)
        refused = as_account(other, "cat", str(tree / "thrust.yaml"))
        assert refused.returncode != 0 and "Permission denied" in refused.stderr and SECRET not in refused.stdout
        listed = as_account(other, "ls", str(workdir / ".thrust" / "runs"))
        assert listed.returncode != 0 and run_id not in listed.stdout
        lock = workdir / ".thrust" / "locks" / "launch.lock"
        held = as_account(other, "flock", "-n", str(lock), "true")  # a lock it cannot open it cannot hold
        assert held.returncode != 0 and "Permission denied" in held.stderr, held.stderr
        again = cli("train", "quick", "--detach", cwd=proj)  # the owner's launches go on
        assert again.returncode == 0, again.stderr


def test_a_first_sync_refuses_a_directory_with_files_and_the_home_itself(cli, sshd, tmp_path):
    with throwaway_account(sshd) as (owner, home):
        existing = home / "existing"
        existing.mkdir()
        (existing / "f.txt").write_text("PRECIOUS user data\n")
        proj = _as(sshd, owner, str(existing), tmp_path)
        res = cli("train", "quick", cwd=proj)
        assert res.returncode == ExitCode.UNAVAILABLE, res.stderr
        assert f"{existing} on sandbox is not empty (1 entries: f.txt) and is not a thrust-remote workdir" in res.stderr
        assert (existing / "f.txt").read_text() == "PRECIOUS user data\n" and not (existing / ".git").exists()
        proj = _as(sshd, owner, '"~"', tmp_path, "home-project")  # quoted: a bare ~ is YAML's null
        res = cli("train", "quick", cwd=proj)
        assert res.returncode == ExitCode.UNAVAILABLE and "is the account's home directory" in res.stderr
        assert "e.g. ~/thrust" in res.stderr and not (home / ".git").exists()


def test_a_launch_lock_held_past_the_wait_is_an_answer_naming_its_holder(tmp_path):
    """A holder that never lets go (a process stopped while it held the lock): the launch gives up after
    its wait with the holder's pid and name from the kernel's lock table, never a silent timeout."""
    import signal
    import subprocess
    import time

    from helpers import wait_until

    from thrust_remote.agent import supervisor
    from thrust_remote.core.config import HostConfig
    from thrust_remote.runs.control import _lock_busy

    lock = tmp_path / "launch.lock"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"], start_new_session=True)
    try:
        wait_until(lambda: lock.exists() and supervisor.lock_within(os.open(lock, os.O_RDONLY), 0) is False, 10,
                   "the holder's lock")
        fd = os.open(lock, os.O_RDWR)
        started = time.monotonic()
        assert supervisor.lock_within(fd, 0.3) is False and time.monotonic() - started < 5
        named = supervisor._lock_holder(fd)
        assert named is not None and named.endswith(("(sleep)", "(flock)")), named  # flock passes it to sleep
        error = _lock_busy({"lock": str(lock), "holder": named, "seconds": 45}, "r1", HostConfig("gpu", address="x"))
        assert error.exit_code == ExitCode.UNAVAILABLE and f"held for 45 s by process {named}" in error.message
        assert f"exec --host gpu -- ps -o pid,stat,etime,args -p {named.split()[0]})" in error.hint
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and the sleep it handed the lock to
        holder.wait()
    assert supervisor.lock_within(fd, 5) is True  # the holder gone: the lock is the launch's again


def test_asking_whether_a_launch_started_while_its_lock_is_held_names_the_holder_and_withdraws_nothing(
        tmp_path, monkeypatch, capsys):
    """`launch-outcome` (a launch that never answered, asked again) waits for the launch lock as a launch
    does: a holder that never lets go (the stalled launch itself) is named, and the run is not withdrawn:
    whether it started cannot be told yet."""
    import argparse
    import json
    import signal
    import subprocess

    from helpers import wait_until

    from thrust_remote.agent import supervisor
    from thrust_remote.agent.protocol import WITHDRAWN

    lock, run_dir = tmp_path / "launch.lock", tmp_path / "runs" / "r1"
    holder = subprocess.Popen(["flock", str(lock), "sleep", "60"], start_new_session=True)
    try:
        wait_until(lambda: lock.exists() and subprocess.run(["flock", "-n", str(lock), "true"]).returncode != 0, 10,
                   "the holder's lock")
        monkeypatch.setattr(supervisor, "LOCK_WAIT_S", 0.3)
        code = supervisor.cmd_launch_outcome(argparse.Namespace(run_dir=str(run_dir), lock=str(lock)))
        answer = json.loads(capsys.readouterr().out)
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert code == 0 and answer["error"] == "lock-busy" and answer["launched"] is None
    assert answer["holder"].endswith(("(sleep)", "(flock)")), answer
    assert not (run_dir / WITHDRAWN).exists()
    code = supervisor.cmd_launch_outcome(argparse.Namespace(run_dir=str(run_dir), lock=str(lock)))
    assert json.loads(capsys.readouterr().out)["launched"] is False and (run_dir / WITHDRAWN).exists()
