"""What a new user read and tripped over (issue 12, "Runs and output"): switches shown as taking a
`<bool>`, play's help, init's hint wrapped mid-command, the untracked-files warning about the tool's own
files, and the trainer's early stop that said nothing. (The chart's ticks: tests/js/plot.test.mjs.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXE, git, git_init

from thrust_remote.cli.main import app
from thrust_remote.core.config import HostConfig
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run.sync import local_state, sync

COMMANDS = [info.name for info in app.registered_commands]


# ----------------------------------------------------------------------------------------- help

@pytest.mark.parametrize("command", [[], *([name] for name in COMMANDS)], ids=lambda c: " ".join(c) or "top")
def test_help_shows_switches_as_flags_not_as_taking_a_bool(cli, command):
    result = cli(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "<bool>" not in result.stdout
    help_line = next(line for line in result.stdout.splitlines() if "--help" in line)
    assert re.search(r"--help\s+-h\s+Show this message", help_line), help_line


def test_switches_are_still_listed_and_still_refuse_a_value(cli):
    result = cli("train", "--help")
    for switch in ("--detach", "--no-fetch", "--json"):
        line = next(x for x in result.stdout.splitlines() if switch + " " in x)
        assert not re.search(re.escape(switch) + r"\s+<", line), line
    assert "<str>" in result.stdout  # options that take a value keep their type
    refused = cli("hosts", "--json=yes")
    assert refused.returncode == 64
    assert "does not take a value" in refused.stderr


def test_a_bad_command_line_is_an_error_and_a_hint_like_every_other_error(cli):
    """Not click's `Usage:`/`Error:` blocks: `error:` with what is wrong, `hint:` with the usage line."""
    typo = cli("train", "cartpole", "--gpu", "2")
    assert typo.returncode == 64
    assert typo.stderr.splitlines() == [
        "error: No such option: --gpu (Possible options: --gpus)",
        "hint: usage: thrust-remote train [OPTIONS] {JOB}; thrust-remote train -h shows its options"]
    missing = cli("wait")
    assert missing.returncode == 64 and missing.stderr.startswith("error: Missing argument 'RUN...'.")
    assert "Usage:" not in missing.stderr + typo.stderr and "Traceback" not in missing.stderr


def test_a_global_option_after_the_command_gets_the_command_that_works(cli, tmp_path):
    cfg = tmp_path / "my.yaml"
    cfg.write_text("jobs:\n  quick:\n    command: [sh, -c, 'true']\n")
    wrong = cli("hosts", "--config", str(cfg), cwd=tmp_path)
    assert wrong.returncode == 64 and "No such option: --config" in wrong.stderr
    hinted = wrong.stderr.split("it goes before the command: ", 1)[1].splitlines()[0]
    assert hinted == f"thrust-remote --config {cfg} hosts"
    # the hinted command works as printed
    assert cli(*hinted.split()[1:], cwd=tmp_path).returncode == 0
    # words after `--` are the command's own, never taken for ours
    passed = cli("exec", "--host", "local", "--", "echo", "--config", cwd=tmp_path)
    assert passed.returncode == 0 and passed.stdout.strip() == "--config", passed.stderr


def _quick_project(path: Path) -> Path:
    """A git project whose job `quick` is a command that says hi: a whole train on `local` in seconds."""
    (path / "thrust.yaml").write_text("jobs:\n  quick:\n    command: [sh, -c, 'echo hi']\n")
    git_init(path)
    git(path, "add", "thrust.yaml")
    git(path, "commit", "-q", "-m", "first")
    return path


def test_piped_lines_are_never_folded_whatever_the_width(cli, tmp_path):
    _quick_project(tmp_path)
    trained = cli("train", "quick", "--host", "local", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    run_id = re.search(r"following (\S+)", trained.stderr).group(1)
    narrow = {"COLUMNS": "40"}
    status = cli("status", run_id, "--host", "local", cwd=tmp_path, env=narrow)
    assert status.returncode == 0, status.stderr
    line = status.stdout.splitlines()[0]  # id, state, job, pid, start and commit: one line, however narrow
    assert line.startswith(f"{run_id}: FINISHED (exit code 0)") and line.endswith(git(tmp_path, "rev-parse",
                                                                                     "HEAD")[:12])
    missing = cli("status", "cartpole-20200101-000000-abcd", "--host", "local", cwd=tmp_path, env=narrow)
    assert missing.returncode == 64
    error, hint = missing.stderr.splitlines()[:2]
    assert error.startswith("error: no run ") and error.endswith(f"(looked in {tmp_path}/.thrust/runs)")
    assert hint.endswith("thrust-remote runs --all (or: thrust-remote runs --host local)")


def test_a_reader_that_goes_away_is_sigpipes_141_not_a_failed_job(tmp_path):
    """`train --json | head -0`: the run finished; the answer had nowhere to go. 1 would say the job failed."""
    _quick_project(tmp_path)
    proc = subprocess.Popen([EXE, "train", "quick", "--host", "local", "--json"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before train writes its JSON
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err and "error" not in err
    assert "hi" in err  # the job ran and its log was followed


def test_train_on_local_outside_a_git_project_runs_and_says_what_it_does_not_record(cli, tmp_path):
    (tmp_path / "thrust.yaml").write_text("jobs:\n  quick:\n    command: [sh, -c, 'echo hi']\n")
    result = cli("train", "quick", "--host", "local", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning:"))
    assert f"{tmp_path} is not in a git project" in warning and f"{tmp_path}/.thrust" in warning
    # in a git project the same train says nothing of the kind
    _quick_project(tmp_path)
    again = cli("train", "quick", "--host", "local", cwd=tmp_path)
    assert again.returncode == 0 and "not in a git project" not in again.stderr


def test_a_misspelt_job_or_host_is_64_with_the_near_name(cli, tmp_path):
    job = cli("train", "cartpol", "--host", "local", cwd=tmp_path)
    assert job.returncode == 64 and "unknown job 'cartpol' (did you mean 'cartpole'?)" in job.stderr
    host = cli("train", "cartpole", "--host", "locl", cwd=tmp_path)
    assert host.returncode == 68 and "unknown host 'locl' (did you mean 'local'?)" in host.stderr
    far = cli("train", "zzz", "--host", "local", cwd=tmp_path)
    assert far.returncode == 64 and "did you mean" not in far.stderr
    # the SSH alias a host's address names, typed for the host's own name
    aliased = tmp_path / "aliased.yaml"
    aliased.write_text("hosts:\n  box:\n    address: me@trialbox:2222\n")
    alias = cli("--config", str(aliased), "train", "cartpole", "--host", "trialbox", cwd=tmp_path)
    assert alias.returncode == 68 and "'trialbox' is the address of host 'box': --host box" in alias.stderr
    assert "hint: give that host's name" in alias.stderr and "add it under" not in alias.stderr
    # the hint names the file the user gave, not a thrust.yaml that is not the one read
    cfg = tmp_path / "elsewhere.yaml"
    cfg.write_text("jobs:\n  quick:\n    command: [sh, -c, 'true']\n")
    given = cli("--config", str(cfg), "train", "quik", "--host", "local", cwd=tmp_path)
    assert given.returncode == 64 and "(did you mean 'quick'?)" in given.stderr
    assert f"hint: add it under `jobs:` in {cfg}" in given.stderr


def test_play_help_says_what_play_does_by_default(cli):
    top = " ".join(cli("--help").stdout.split())
    own = " ".join(cli("play", "--help").stdout.split())
    for text in (top, own):
        assert "print its URL" in text
        assert "unless --no-open, also open it in a browser" in text
    assert "Only print the URL; do not open a browser (default: open it)." in own.replace("│ ", "")


# ----------------------------------------------------------------------------------------- init

@pytest.mark.parametrize("columns", ["60", "80"])
def test_init_never_wraps_its_path_or_its_command(cli, tmp_path, columns):
    project = tmp_path / ("a-project-directory-with-a-rather-long-name-" * 2) / "sub"
    project.mkdir(parents=True)
    result = cli("init", cwd=project, env={"COLUMNS": columns})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"wrote {project / 'thrust.yaml'}" in lines, lines
    assert "  thrust-remote doctor --host NAME" in lines, lines


# ------------------------------------------------------------------------------ untracked warning

def _untracked_warnings(repo: Path, host: Path) -> list[str]:
    session = HostSession(LocalRunner(), HostConfig(name="local", python=sys.executable), HostPaths(str(host)))
    return [w for w in sync(session, local_state(repo)).warnings if "untracked" in w]


def test_untracked_warning_skips_the_tools_own_files_and_says_how_to_silence_it(tmp_path):
    repo = tmp_path / "laptop"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "one")
    (repo / "thrust.yaml").write_text("default_host: local\n")
    (repo / ".thrust" / "runs").mkdir(parents=True)
    (repo / ".thrust" / "runs" / "index.json").write_text("{}\n")
    assert _untracked_warnings(repo, tmp_path / "host") == []

    (repo / "scratch.txt").write_text("notes\n")
    (warning,) = _untracked_warnings(repo, tmp_path / "host")
    assert "1 untracked file was not sent: scratch.txt" in warning
    assert "thrust.yaml" not in warning
    assert ".thrust" not in warning
    assert "`git add` it to send it, or list it in .gitignore to silence this" in warning

    # a model a fetch placed under web/public/ (its .onnx, manifest and metrics) is this tool's output
    kept = repo / ".thrust" / "fetched" / "cartpole-20260101-000000-ab12"
    kept.mkdir(parents=True)
    (kept / "model.onnx").write_bytes(b"onnx")
    (kept / "fetch.json").write_text(json.dumps({"run_id": kept.name, "target": "web/public/cartpole.onnx"}))
    (repo / "web" / "public").mkdir(parents=True)
    for name in ("cartpole.onnx", "cartpole.json", "cartpole.metrics.jsonl"):
        (repo / "web" / "public" / name).write_text("x")
    (warning,) = _untracked_warnings(repo, tmp_path / "host")
    assert "1 untracked file was not sent: scratch.txt" in warning
    # optimize's best params (its first line says whose it is) are too; a file of that name of yours is not
    (repo / "ppo-best.yaml").write_text("# best trial of study ppo (thrust-remote optimize)\nparams: {}\n")
    (repo / "mine-best.yaml").write_text("params: {}\n")
    (warning,) = _untracked_warnings(repo, tmp_path / "host")
    assert "2 untracked files were not sent: mine-best.yaml, scratch.txt" in warning
    assert "`git add` them to send them, or list them in .gitignore" in warning


# ------------------------------------------------------------------------------------ early stop

@pytest.mark.e2e  # the trainer, for real
def test_trainer_says_solved_stopping_early_in_a_plain_line(tmp_path):
    # a target an untrained policy already reaches: the first evaluation solves it
    result = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--env", "cartpole", "--target-return", "5", "--eval-every", "1",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    solved = [i for i, line in enumerate(lines) if line.startswith("solved:")]
    assert len(solved) == 1, lines
    line = lines[solved[0]]
    assert re.fullmatch(r"solved: eval return \d+\.\d >= 5 at step 256 of 100,096, stopping early", line), line
    assert lines[-1].startswith("THRUST_DONE ")
    assert solved[0] < len(lines) - 1


@pytest.mark.e2e  # the trainer, for real
def test_trainer_says_nothing_of_solving_when_it_runs_to_the_end(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "trainer.train", "--env", "cartpole", "--total-steps", "512", "--target-return", "0",
         "--run-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=180, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stdout.splitlines() if line.startswith("solved")]


# ------------------------------------------------------------------------------------ CUDA flags

@pytest.mark.parametrize(("kind", "args", "asks"), [
    ("trainer", ["--device", "cuda"], True),
    ("trainer", ["--device=cuda:1"], True),
    ("trainer", ["--device", "cpu", "--tag", "cuda"], False),
    ("python", ["--cuda", "false"], False),  # your own flags are your own: this turns CUDA off
    ("python", ["--device", "cuda"], False),
    ("command", ["cuda"], False),
    ("cargo", ["--cuda"], True),
])
def test_only_flags_whose_meaning_is_known_ask_for_cuda(kind, args, asks):
    from thrust_remote.run.preflight import asks_for_cuda

    assert asks_for_cuda(kind, args) is asks


def test_your_own_scripts_cuda_flags_run_on_a_host_without_a_gpu(cli, tmp_path):
    (tmp_path / "train.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    (tmp_path / "thrust.yaml").write_text("jobs:\n  own:\n    script: train.py\n")
    git_init(tmp_path)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "own")
    # your own flags are your own: `--cuda off` or even `--device cuda` are passed, never refused here
    own = cli("train", "own", "--host", "local", "--set", "cuda=off", "--set", "device=cuda", cwd=tmp_path)
    assert own.returncode == 0, own.stderr
    assert "args ['--cuda', 'off', '--device', 'cuda']" in own.stdout + own.stderr
    import torch

    if not torch.cuda.is_available():  # the built-in trainer's --device cuda is refused where there is none
        builtin = cli("train", "cartpole", "--host", "local", "--set", "device=cuda", cwd=tmp_path)
        assert builtin.returncode == 69 and "asks for CUDA but it is not available" in builtin.stderr


def test_fetch_of_a_run_whose_globs_matched_nothing_names_no_folder_that_is_not_there(cli, tmp_path):
    (tmp_path / "thrust.yaml").write_text("jobs:\n  quiet:\n    command: [sh, -c, 'true']\n    artifacts: [out/**]\n")
    git_init(tmp_path)
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "quiet")
    trained = cli("train", "quiet", "--host", "local", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    run_id = _run_id_of(trained.stderr)
    assert git(tmp_path, "status", "--porcelain") == ""  # .thrust/ ignores itself, even with nothing fetched
    fetched = cli("fetch", run_id, "--host", "local", cwd=tmp_path)
    assert fetched.returncode == 0, fetched.stderr
    assert "'out/**' matches nothing" in fetched.stderr and "nothing fetched" in fetched.stderr
    assert fetched.stdout == ""  # stdout names what is there, for a script: here nothing
    assert not (tmp_path / ".thrust" / "fetched" / run_id).exists()
    # its log is empty: `logs` says so on stderr instead of printing nothing at all
    empty = cli("logs", run_id, "--host", "local", cwd=tmp_path)
    assert empty.returncode == 0 and empty.stdout == "" and f"run {run_id}: nothing in its log" in empty.stderr
    as_json = json.loads(cli("fetch", run_id, "--host", "local", "--json", cwd=tmp_path).stdout)
    assert as_json["run_id"] == run_id and as_json["model"] is None and as_json["placed"] is False
    assert as_json["artifacts"]["files"] == 0 and "'out/**' matches nothing" in as_json["artifacts"]["warnings"][0]


def _run_id_of(stderr: str) -> str:
    return re.search(r"following (\S+)", stderr).group(1)


def test_a_narrow_table_drops_whole_columns_and_keeps_the_run_id_whole():
    from thrust_remote.cli.runs import COLUMNS, _columns_that_fit

    headers = ("host", *COLUMNS)  # runs --all
    row = ("gpu-box-1", "waiter", "QUEUED (2)", "", "", "", "6a9bc33d24ae", "12.3 MB", "waiter-20261125-111431-6f3a")
    kept = [headers[i] for i in _columns_that_fit(headers, [row], 50)]
    assert "run" in kept and "state" in kept
    assert sum(max(len(headers[i]), len(row[i])) + 3 for i in range(len(headers)) if headers[i] in kept) + 1 <= 50


def test_ctrl_c_while_connecting_says_interrupted_not_a_silent_130(tmp_path):
    """A host that accepts the connection and never speaks: Ctrl-C during the SSH handshake must say
    what happened (typer turns a KeyboardInterrupt into a silent exit 130 on its own)."""
    import os
    import signal
    import socket
    import threading

    from helpers import wait_until

    accepted: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(30)
        port = listener.getsockname()[1]

        def accept_once() -> None:
            accepted.append(listener.accept()[0])  # held open, silent: the handshake waits on it

        threading.Thread(target=accept_once, daemon=True).start()
        (tmp_path / "thrust.yaml").write_text(
            f"hosts:\n  mute:\n    address: u@127.0.0.1:{port}\n    connect_timeout: 30\n")
        proc = subprocess.Popen([EXE, "status", "cartpole-20261127-000000-abcd", "--host", "mute"], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "NO_COLOR": "1"})
        try:
            wait_until(lambda: accepted, 30, "the CLI to connect")
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            for conn in accepted:
                conn.close()
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted: stopped by Ctrl-C", err
