"""Issue 12, "Wrong directions": `~` in `python:` means the host's home for every command; a wrong
`python:` is 69 with doctor's hint; hints name the same --host and --config; a closed port's hint is
valid ssh; no key to offer is 77 with the keys tried; doctor finds torch in the user's venvs; and
`--config` elsewhere leaves the project where the command runs. Real sshd (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import EXE, FAKE_FAST, FAKE_JOB, FAKE_LONG, FAST, clone_repo, git

from thrust_remote.core.config import HostConfig, load_config, parse_config_text
from thrust_remote.core.errors import UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.doctor.cluster import user_fix as cluster_fix
from thrust_remote.host.report import Check, Report, with_config
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import resolve_python
from thrust_remote.run import arguments, resume


def _venv_with_our_packages(path: Path) -> Path:
    """A real venv whose python sees this test's site-packages (torch, numpy, onnx...) through a .pth
    file: `--system-site-packages` would not, since this python is itself a venv's (the system site of
    a venv made from it is the base python's, not this venv's)."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next((path / "lib").glob("python3*/site-packages"))
    (site / "thrust_test_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin" / "python"


@pytest.fixture
def home_venv() -> Iterator[str]:
    """A venv under the real home of the sshd test user (the account is this one), as `~/...`.
    The directory is hidden so doctor's `~/*/venv` search of other tests running now never sees it."""
    home = Path.home()
    top = Path(tempfile.mkdtemp(prefix=".thrust-test-", dir=home))
    try:
        _venv_with_our_packages(top / "venv")
        yield f"~/{top.relative_to(home)}/venv/bin/python"
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _with_python(cfg: Path, sshd, python: str) -> Path:
    text = cfg.read_text()
    assert f"python: {sshd.host_config().python}" in text
    cfg.write_text(text.replace(f"python: {sshd.host_config().python}", f"python: {python}"))
    return cfg


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A clone of this repository at its HEAD: the laptop's project."""
    return clone_repo(tmp_path / "project")


# ------------------------------------------------------------------------------------------ hints


def test_command_hint_carries_host_and_config() -> None:
    host = HostConfig(name="gpu", address="u@h", config_path="/cfg dir/thrust.yaml")
    assert command_hint("stop", "snake-1", host=host) == \
        "thrust-remote --config '/cfg dir/thrust.yaml' stop snake-1 --host gpu"
    assert command_hint("runs", host="gpu") == "thrust-remote runs --host gpu"
    assert command_hint("play") == "thrust-remote play"


def test_a_hint_for_exec_puts_the_host_before_the_remote_words() -> None:
    """After `--` every word is the remote command's: `--host H` there ran `ps -ef --host H` on the
    default host."""
    words = shlex.split(command_hint("exec", "--", "ps", "-o", "pid,args", "-p", "42", host="gpu"))
    cut = words.index("--")
    assert words[cut - 2:cut] == ["--host", "gpu"]
    assert words[cut + 1:] == ["ps", "-o", "pid,args", "-p", "42"]


def test_envcheck_fixes_that_are_commands_get_the_config() -> None:
    report = Report("gpu", {}, [Check("build-rs-no-as-needed", "t", "warn", "d",
                                      "thrust-remote doctor --job x --fix --host gpu   # adds ..."),
                                Check("git", "t", "fail", "d", "sudo apt-get install -y git")])
    fixed = with_config(report, "/p/thrust.yaml")
    assert fixed.checks[0].fix == "thrust-remote --config /p/thrust.yaml doctor --job x --fix --host gpu   # adds ..."
    assert fixed.checks[1].fix == "sudo apt-get install -y git"


def test_host_fixes_that_name_the_config_file_name_the_one_given() -> None:
    """envcheck and the Slurm checks run on the host and write "in thrust.yaml"; under --config the user
    edits another file, and the fix says that one. Without --config the fix is as the host wrote it."""
    said = "set `python: ~/proj/.venv/bin/python` under hosts.gpu in thrust.yaml"
    report = Report("gpu", {}, [Check("ssh-python", "t", "fail", "d", said)])
    assert with_config(report, "/p/other.yaml").checks[0].fix == said.replace("thrust.yaml", "/p/other.yaml")
    assert with_config(Report("gpu", {}, [Check("ssh-python", "t", "fail", "d", said)]), None).checks[0].fix == said
    host = HostConfig(name="c", address="u@h", config_path="/p/other.yaml")
    slurm = "fix the host's account:, partition:, time: or sbatch: (qos...) in thrust.yaml as Slurm says"
    assert cluster_fix(slurm, host) == slurm.replace("thrust.yaml", "/p/other.yaml")
    assert cluster_fix(slurm, HostConfig(name="c", address="u@h")) == slurm



def test_a_jobs_hints_name_the_config_file_given(tmp_path: Path) -> None:
    """A job's own fixes (how it resumes, a word of a several-word flag) name the file the job was read
    from under --config, and thrust.yaml when it was found by search."""
    body = ("jobs:\n  plain:\n    script: t.py\n    checkpoints: ck/*.pt\n"
            "  zoo:\n    script: t.py\n    args: {hyperparams: [n_envs:4]}\n")
    (tmp_path / "other.yaml").write_text(body)
    (tmp_path / "thrust.yaml").write_text(body)
    given = load_config(tmp_path / "other.yaml", environ={})
    with pytest.raises(UsageError) as resumed:
        resume.template_of(given.job("plain"))
    assert f"under jobs.plain in {tmp_path / 'other.yaml'}" in resumed.value.hint
    with pytest.raises(UsageError) as word:
        arguments.job_arguments(given.job("zoo"), arguments.parse_sets(["hyperparams.gamma=0.9"]), {})
    assert f"add it to that list in {tmp_path / 'other.yaml'}," in word.value.hint
    searched = parse_config_text(body, tmp_path / "thrust.yaml")
    with pytest.raises(UsageError) as plain:
        resume.template_of(searched.job("plain"))
    assert "under jobs.plain in thrust.yaml" in plain.value.hint


# ------------------------------------------------------------------------------------------ `~` in python:


def test_python_paths_resolve_on_the_host_like_ssh_would(sshd, tmp_path: Path) -> None:
    runner = sshd.runner()
    try:
        home = str(Path.home())  # the sshd account is this one
        for python, want in (("~/v/bin/python", f"{home}/v/bin/python"), ("v/bin/python", f"{home}/v/bin/python"),
                             ("python3", "python3"), ("/opt/py/bin/python", "/opt/py/bin/python")):
            assert resolve_python(runner, sshd.host_config(python=python)) == want
    finally:
        runner.close()
    # the local host: `~` is this account's home, a relative path is the project's
    (tmp_path / "thrust.yaml").write_text("hosts:\n  local:\n    python: .venv/bin/python\n")
    config = load_config(tmp_path / "thrust.yaml", environ={})
    local = LocalRunner(name="local")
    assert resolve_python(local, config.host("local"), config) == str(config.root / ".venv" / "bin" / "python")
    tilde = replace(config.host("local"), python="~/x/bin/python")
    assert resolve_python(local, tilde, config) == str(Path.home() / "x" / "bin" / "python")


@pytest.mark.slow
def test_tilde_python_is_the_hosts_home_for_every_command(cli, sshd, remote_dir, project, home_venv) -> None:
    cfg = _with_python(sshd.thrust_yaml(project / "thrust.yaml", workdir=str(remote_dir / "thrust"),
                                        rest="jobs:\n" + FAKE_JOB), sshd, home_venv)
    git(project, "add", "thrust.yaml")
    git(project, "commit", "-q", "-m", "thrust.yaml")
    train = cli("train", "fake", *FAKE_FAST, cwd=project)
    assert train.returncode == 0, train.stderr
    run_id = re.search(r"(?:launching run|following) (fake[\w.-]+)", train.stderr).group(1)
    run = json.loads((remote_dir / "thrust" / ".thrust" / "runs" / run_id / "run.json").read_text())
    expanded = str(Path.home()) + home_venv[1:]
    # the job runs in its venv on the host, made from `python:` expanded there (never a literal '~/...')
    venv = Path(run["argv"][0]).parent.parent
    assert venv.parent == remote_dir / "thrust" / ".thrust" / "venvs"
    assert json.loads((venv / ".thrust-venv.json").read_text())["base"] == expanded
    commands = (["runs"], ["status", run_id], ["logs", run_id], ["stop", run_id], ["fetch", run_id],
                ["doctor", "--json"])
    # one after another in this process: threads would each start a console-script process (~0.5 s of
    # imports and a connect each), which cost more CPU than running them side by side saved
    procs = [cli("--config", str(cfg), *args, "--host", "sandbox", cwd=project) for args in commands]
    for args, proc in zip(commands, procs, strict=True):
        assert proc.returncode == 0, (args, proc.stderr)
    assert run_id in cli("runs", "--json", cwd=project).stdout


def _bad_pythons(tmp: Path) -> dict[str, tuple[str, str]]:
    not_exec = tmp / "python-not-executable"
    not_exec.write_text("#!/bin/sh\n")
    not_exec.chmod(0o644)
    return {
        "missing": ("~/.thrust-no-such-dir/bin/python", "does not exist"),
        "not-executable": (str(not_exec), "not executable"),
        "not-python": ("/bin/true", "not a Python interpreter"),
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["missing", "not-executable", "not-python"])
def test_wrong_python_is_69_with_a_hint_listing_its_pythons_on_every_command(cli, sshd, remote_dir, project,
                                                                            tmp_path, kind) -> None:
    python, words = _bad_pythons(tmp_path)[kind]
    cfg = _with_python(sshd.thrust_yaml(tmp_path / "thrust.yaml", workdir=str(remote_dir / "thrust")), sshd, python)
    # a run directory on the host, so status/logs/stop/fetch get as far as running the agent
    (remote_dir / "thrust" / ".thrust" / "runs" / "cartpole-x1").mkdir(parents=True)
    # no python with torch there to offer: the hint is an exec that lists the host's pythons, with this config
    hint = f"thrust-remote --config {cfg.resolve()} exec --host sandbox -- sh -c 'which -a python3 python;"
    commands = (["runs"], ["status", "cartpole-x1"], ["logs", "cartpole-x1"], ["stop", "cartpole-x1"],
                ["fetch", "cartpole-x1"], ["doctor"], ["train", "cartpole", *FAST])
    # in this process, one after another (see the test above)
    procs = [cli("--config", str(cfg), *args, "--host", "sandbox", cwd=project) for args in commands]
    for args, proc in zip(commands, procs, strict=True):
        assert proc.returncode == 69, (args, proc.stderr)
        if kind != "missing" or args[0] == "runs":  # a missing one keeps payload's own "not found" wording
            assert words in proc.stderr or "not found" in proc.stderr, (args, proc.stderr)
        assert hint in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert f"under hosts.sandbox in {cfg.resolve()}" in proc.stderr, (args, proc.stderr)  # the file named


@pytest.mark.slow
def test_other_code_runs_beside_a_running_run_and_its_hint_names_host_and_config(cli, sshd, remote_dir, project,
                                                                                 tmp_path) -> None:
    """A config given elsewhere: a second run of new code starts beside a running one (each its own
    tree; it was once refused), and the command `train --detach` prints works as printed from where the
    user stands, with that --config and the host."""
    cfg = sshd.thrust_yaml(tmp_path / "elsewhere.yaml", workdir=str(remote_dir / "thrust"), rest="jobs:\n" + FAKE_JOB)
    first = cli("--config", str(cfg), "train", "fake", "--detach", *FAKE_LONG, cwd=project)
    assert first.returncode == 0, first.stderr
    run_id = re.search(r"run (fake[\w.-]+) started on sandbox", first.stdout).group(1)
    (project / "NOTES.txt").write_text("a change\n")
    git(project, "add", "NOTES.txt")
    git(project, "commit", "-q", "-m", "notes")
    second = cli("--config", str(cfg), "train", "fake", "--detach", *FAKE_LONG, cwd=project)
    assert second.returncode == 0, second.stderr
    follow = re.search(r"follow it with: (thrust-remote .*)", second.stdout).group(1)
    assert follow.startswith(f"thrust-remote --config {cfg.resolve()} logs fake-") and "--host sandbox" in follow
    other = shlex.split(follow)[4]
    for run in (run_id, other):
        assert json.loads(cli("--config", str(cfg), "status", run, "--json", cwd=project).stdout)["state"] == "RUNNING"
    stopped = cli("--config", str(cfg), "stop", other, "--host", "sandbox", cwd=project)
    assert stopped.returncode == 0, stopped.stderr
    done = subprocess.run([EXE, *shlex.split(follow)[1:], "--no-fetch"], cwd=project, capture_output=True, text=True,
                          timeout=120)
    assert "STOPPED" in done.stdout + done.stderr, done.stderr
    assert cli("--config", str(cfg), "stop", run_id, "--host", "sandbox", cwd=project).returncode == 0


# ------------------------------------------------------------------------------------------ connecting


def test_closed_port_hint_is_a_valid_ssh_command(cli, tmp_path: Path) -> None:
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text("hosts:\n  dead:\n    address: someone@127.0.0.1:1\n    connect_timeout: 3\n")
    proc = cli("--config", str(cfg), "doctor", "--host", "dead")
    assert proc.returncode == 69, proc.stderr
    # the reason in words, not paramiko's "[Errno None] Unable to connect to port 1 on 127.0.0.1"
    assert "error: cannot connect to dead (127.0.0.1:1): connection refused" in proc.stderr, proc.stderr
    assert "Errno" not in proc.stderr
    assert "try: ssh -v -p 1 someone@127.0.0.1" in proc.stderr
    command = shlex.split(proc.stderr.split("try: ", 1)[1].splitlines()[0])
    # ssh itself parses it: -G prints the configuration it would use and connects nowhere
    parsed = subprocess.run([command[0], "-G", *command[1:]], capture_output=True, text=True, timeout=30)
    assert parsed.returncode == 0, parsed.stderr
    assert "port 1" in parsed.stdout.splitlines() and "user someone" in parsed.stdout.splitlines()


def test_no_key_to_offer_is_77_naming_the_keys_tried(sshd, tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(f"hosts:\n  box:\n    address: {sshd.address}\n    known_hosts: {sshd.known_hosts}\n"
                   "    connect_timeout: 5\n")
    env = {k: v for k, v in os.environ.items() if k not in ("SSH_AUTH_SOCK", "THRUST_CONFIG")}
    proc = subprocess.run([EXE, "--config", str(cfg), "runs", "--host", "box"], capture_output=True, text=True,
                          env={**env, "HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}, timeout=60)
    assert proc.returncode == 77, proc.stderr
    assert "no key to offer" in proc.stderr
    assert f"{home}/.ssh/id_ed25519 (missing)" in proc.stderr and f"{home}/.ssh/id_rsa (missing)" in proc.stderr
    assert "identity: ~/.ssh/KEY" in proc.stderr and "IdentityFile" in proc.stderr


# ------------------------------------------------------------------------------------------ doctor finds torch


def test_doctor_finds_torch_in_a_venv_under_home(cli, tmp_path: Path) -> None:
    """A real run: the configured python has no torch; a project venv under $HOME has it."""
    home = tmp_path / "home"
    _venv_with_our_packages(home / "proj" / ".venv")
    bare = tmp_path / "bare"
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", str(bare)], check=True)
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(f"hosts:\n  local:\n    python: {bare}/bin/python\n    workdir: {tmp_path}\n")
    proc = cli("--config", str(cfg), "doctor", "--json", env={"HOME": str(home)})
    assert proc.returncode == 1, proc.stderr
    rows = {c["id"]: c for c in json.loads(proc.stdout)["checks"]}
    assert rows["ssh-python"]["status"] == "fail"
    # the file named by --config: the one to edit
    assert rows["ssh-python"]["fix"] == f"set `python: ~/proj/.venv/bin/python` under hosts.local in {cfg.resolve()}"
    assert "~/proj/.venv/bin/python" in rows["torch-import"]["fix"]
    # and that line works: `~` is this account's home (here $HOME) for doctor as for every command
    cfg.write_text(f"hosts:\n  local:\n    python: ~/proj/.venv/bin/python\n    workdir: {tmp_path}\n")
    again = cli("--config", str(cfg), "doctor", "--json", env={"HOME": str(home)})
    rows = {c["id"]: c for c in json.loads(again.stdout)["checks"]}
    assert rows["torch-import"]["status"] == "ok" and rows["ssh-python"]["status"] == "ok", again.stderr


# ------------------------------------------------------------------------------------------ --config elsewhere


@pytest.mark.slow
def test_config_elsewhere_configures_the_project_you_stand_in(cli, project, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cfg = elsewhere / "thrust.yaml"
    cfg.write_text("default_host: local\njobs:\n" + FAKE_JOB)
    sub = project / "trainer"
    proc = cli("--config", str(cfg), "train", "fake", *FAKE_FAST, cwd=sub)
    assert proc.returncode == 0, proc.stderr
    assert (project / "web" / "public" / "fake.onnx").is_file()
    assert not (elsewhere / "web").exists()
