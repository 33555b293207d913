"""Pure parts of the train pipeline: GPU selection from real nvidia-smi captures, --set / --params
handling, the argv the host runs, and the supervisor's state rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thrust_remote.agent import supervisor as supervise
from thrust_remote.core.config import HostConfig, JobConfig
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.run import arguments, jobs

REPO_PATH = os.pathsep.join([str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])
HOST = HostConfig(name="gpu", address="gpu-box", python="python3")


# select_gpus's tests moved with it to tests/test_gpus.py


def test_sets_params_and_job_args_merge_last_wins(tmp_path):
    job = JobConfig(name="snake", args={"env": "snake", "total-steps": 100, "tensorboard": False})
    params = tmp_path / "best.yaml"
    params.write_text("params:\n  learning-rate: 0.001\n  total-steps: 200\n")
    args = arguments.job_arguments(job, arguments.parse_sets(["total-steps=300"]), arguments.load_params(params))
    # the trainer's switches take a value: a false overrides its env's preset instead of vanishing
    assert args == ["--env", "snake", "--total-steps", "300", "--tensorboard", "false", "--learning-rate", "0.001"]
    flipped = arguments.job_arguments(job, arguments.parse_sets(["tensorboard", "compile=false"]), {})
    assert flipped == ["--env", "snake", "--total-steps", "100", "--tensorboard", "true", "--compile", "false"]


def test_set_takes_bare_flags_as_the_args_mapping_does():
    job = JobConfig(name="own", kind="python", script="train.py", args={"lr": 0.1})
    sets = arguments.parse_sets(["no-cuda", "text=true", "verbose=False", "name=true-ish"])
    assert arguments.job_arguments(job, sets, {}) == ["--lr", "0.1", "--no-cuda", "--text", "--name", "true-ish"]


@pytest.mark.parametrize("item", ["=1", "bad key=1", "-x=1", "a;b=1", "a;b"])
def test_bad_set_items_are_usage_errors(item):
    with pytest.raises(UsageError):
        arguments.parse_sets([item])


def test_params_file_must_be_a_mapping_of_names(tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError):
        arguments.load_params(bad)
    bad.write_text("'a;b': 1\n")
    with pytest.raises(ConfigError):
        arguments.load_params(bad)


def test_python_argv_uses_torchrun_standalone_for_several_processes():
    def python_argv(args: list[str], run_dir: str, nproc: int) -> list[str]:  # the built-in trainer's
        return jobs.job_argv(JobConfig(name="trainer"), HOST.python, args, run_dir=run_dir, nproc=nproc, export=True)

    one = python_argv(["--env", "snake"], "/w/.thrust/runs/r", 1)
    assert one[:4] == ["python3", "-u", "-m", "trainer.train"]
    assert one[-4:] == ["--run-dir", "/w/.thrust/runs/r", "--export", "/w/.thrust/runs/r/model.onnx"]
    many = python_argv(["--env", "snake"], "/w/.thrust/runs/r", 4)
    assert "--standalone" in many
    assert "--nproc-per-node=4" in many


def _launch(tmp_path: Path, argv: list[str], job: str = "j") -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "thrust_remote.agent", "launch", "--run-dir", str(tmp_path / "runs" / "r1"), "--cwd",
         str(tmp_path), "--lock", str(tmp_path / "locks" / f"{job}.lock"), "--marker", "m1", "--", *argv],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": REPO_PATH},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_supervisor_records_exit_code_and_states(tmp_path):
    answer = _launch(tmp_path, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    run_dir = tmp_path / "runs" / "r1"
    deadline = time.monotonic() + 10
    while supervise.run_state(str(run_dir))["state"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.05)
    st = supervise.run_state(str(run_dir))
    assert st["state"] == "FAILED"
    assert st["exit_code"] == 3
    assert st["pid"] == answer["pid"]
    # one append-only file for both streams, in the order they were written
    assert (run_dir / "log").read_text().splitlines() == ["out", "err"]


def test_supervisor_state_is_lost_when_the_pid_was_recycled(tmp_path):
    run_dir = tmp_path / "runs" / "r9"
    run_dir.mkdir(parents=True)
    # our own pid and start time, but the marker is not in our command line or environment
    with open(f"/proc/{os.getpid()}/stat") as fh:
        start = fh.read().rsplit(")", 1)[1].split()[19]
    meta = {"run_id": "r9", "pid": os.getpid(), "pid_start": start, "supervisor_pid": os.getpid(),
            "supervisor_start": start, "marker": "not-in-my-cmdline"}
    (run_dir / "run.json").write_text(json.dumps(meta))
    assert supervise.run_state(str(run_dir))["state"] == "LOST"
    # the right marker but another start time: a recycled pid, not ours either
    meta.update(pid_start="1", supervisor_start="1", marker="pytest")
    (run_dir / "run.json").write_text(json.dumps(meta))
    assert supervise.run_state(str(run_dir))["state"] == "LOST"


def test_a_run_that_ends_while_its_state_is_read_is_finished_not_lost(tmp_path, monkeypatch):
    """The supervisor writes the exit code, then exits. A status that read no exit code and then found
    the supervisor gone (it ended in between) must read the code again: a node of a run over two hosts
    was reported LOST this way while it had finished, and the whole run FAILED."""
    run_dir = tmp_path / "runs" / "r10"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": "r10", "pid": 2 ** 22 + 7, "supervisor_pid": 2 ** 22 + 7,
                                                  "supervisor_start": "1", "marker": "m-r10"}))
    looked = []

    def supervisor_ends_as_we_look(meta, run_dir_):
        looked.append(run_dir_)
        (run_dir / "exit_code").write_text(json.dumps({"exit_code": 0, "ended_at": "2026-11-29T00:00:00Z",
                                                       "ended_ts": 1.0}))
        return False

    monkeypatch.setattr(supervise, "_supervisor_alive", supervisor_ends_as_we_look)
    st = supervise.run_state(str(run_dir))
    assert looked and (st["state"], st["exit_code"]) == ("FINISHED", 0)
    (run_dir / "exit_code").unlink()
    monkeypatch.setattr(supervise, "_supervisor_alive", lambda meta, run_dir_: False)
    assert supervise.run_state(str(run_dir))["state"] == "LOST"  # gone without a code: lost, as before


def test_env_values_never_reach_a_command_line_and_run_files_are_private(tmp_path):
    from thrust_remote.host.runner import LocalRunner
    from thrust_remote.host.session import HostSession
    from thrust_remote.runs import control

    host = HostConfig(name="local", python=sys.executable)
    paths = control.HostPaths(str(tmp_path))
    session = HostSession(LocalRunner(), host, paths)
    answer = control.launch(session, run_id="r-secret", job="j", argv=["sh", "-c",
                         'printf "%s" "$API_TOKEN" > token; sleep 3'], cwd=str(tmp_path),
                         env={"API_TOKEN": "hunter2-secret"}, meta={"env_keys": ["API_TOKEN"]})
    run_dir = Path(paths.run("r-secret"))
    meta = json.loads((run_dir / "run.json").read_text())
    cmdlines = []
    for pid in (meta["supervisor_pid"], answer["pid"]):
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdlines.append(fh.read())
    assert all(b"hunter2-secret" not in c for c in cmdlines)
    assert "hunter2-secret" not in (run_dir / "run.json").read_text()
    assert (run_dir.stat().st_mode & 0o077) == 0
    assert ((run_dir / "run.json").stat().st_mode & 0o077) == 0
    deadline = time.monotonic() + 10
    while not (tmp_path / "token").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / "token").read_text() == "hunter2-secret"  # the job itself got the value
    control.stop(session, "r-secret", grace=2)


def test_the_stages_a_train_runs_are_named_data():
    """`train` runs every stage; --detach ends with the launch; --no-fetch leaves the fetch out; the
    stage names are the keys of train --json's timings."""
    from thrust_remote.run.lifecycle import stages_of
    from thrust_remote.run.vocab import Stage, TrainRequest

    job = JobConfig(name="cartpole")
    assert [str(s) for s in stages_of(TrainRequest(job=job, host=HOST))] == [
        "sync", "preflight", "setup", "launch", "follow", "fetch"]
    assert stages_of(TrainRequest(job=job, host=HOST, detach=True))[-1] is Stage.LAUNCH
    assert Stage.FETCH not in stages_of(TrainRequest(job=job, host=HOST, fetch=False))
    assert json.dumps({Stage.SYNC: 0.25}) == '{"sync": 0.25}'


class _EndsInOneBurst:
    """A process (runner.drive's interface) whose whole output arrives with its end, after the loop's
    read: what an SSH channel gives when data, EOF, exit status and close come in one burst. The loop's
    own logic, not SSH (tests/test_ssh_runner.py runs commands over a real sshd)."""

    host_enforces_timeout = True

    def __init__(self) -> None:
        self.reads = 0
        self.ended = False

    def read(self, wait: float) -> list[tuple[str, bytes]]:
        self.reads += 1
        if not self.ended:
            self.ended = True  # the burst lands after this read returned
            return []
        return [("out", b"\x1ethrust-log\x1e\nline 1\n"), ("err", b"")] if self.reads == 2 else []

    def exit_code(self) -> int | None:
        return 0 if self.ended else None

    def alive(self) -> bool:
        return True

    def kill(self) -> None:
        pass

    def lost(self) -> None:
        pass


def test_output_that_arrives_with_the_end_of_a_command_is_kept() -> None:
    from thrust_remote.host.runner import drive

    got: list[bytes] = []
    result = drive(_EndsInOneBurst(), ["agent", "logs"], name="h", started=time.monotonic(), timeout=10,
                   stream=None, on_bytes=lambda which, data: got.append(data) if which == "out" else None,
                   liveness_timeout=None)
    assert result.exit_code == 0 and b"".join(got) == b"\x1ethrust-log\x1e\nline 1\n"
