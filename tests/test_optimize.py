"""`thrust-remote optimize`: studies on the sshd fixture and the local host. A study of the real trainer
(CartPole, CPU, trials of a few thousand env steps) over ssh, with pruning; where the subject is the
driver (GPU slots, a killed driver resumed, Ctrl-C, `--stop`), the trials are runs of tests/fake_train.py
(job `fake`, its return the searched parameter).

What each test builds: a git clone of this repository as the project (the host syncs its commit), a
thrust.yaml with a small search space, and, for GPU slots on a CPU machine, an `nvidia-smi` on PATH
that prints a captured 4×A100 listing (tests/data/nvidia_smi), so the host *reports* GPUs while
torch still trains on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import FAKE_JOB, REPO, clone_repo, remote_tempdir, wait_until

from thrust_remote import optimize as core

VENV_BIN = Path(sys.executable).parent
SMI_DATA = REPO / "tests" / "data" / "nvidia_smi"

SEARCH = """\
search:
  cartpole:
    learning-rate: {low: 1.0e-4, high: 3.0e-2, log: true}
    num-envs: {choices: [4, 8]}
    num-steps: {choices: [16, 32]}
"""
# Tiny trials: 4096 steps, no early stop on solving, so every trial reaches every rung.
SMALL = ["--set", "total-steps=4096", "--set", "target-return=0"]
AGGRESSIVE = ["--pruner", "median", "--prune-startup", "1", "--prune-warmup", "0"]
# job `fake` and its search beside the trainer's (tests/fake_train.py: its return is the parameter)
FAKE = "jobs:\n" + FAKE_JOB + SEARCH + "  fake:\n    return: {low: 0.0, high: 100.0}\n"

# one worker runs this module's tests, in order: later tests read the study an earlier one ran over ssh
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("test_optimize")]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this repository (~0.5 s): the trainer is there, and a host can sync its commit."""
    return clone_repo(tmp_path_factory.mktemp("optimize") / "project", plain=True)


def local_project(base: Path, name: str, extra: str = "", *, fake: bool = False) -> Path:
    """A local-host project: its own directory (own .thrust) whose trainer comes from the clone; `fake`:
    with job `fake` (tests/ from the clone too) and its search."""
    root = base / name
    root.mkdir()
    (root / "trainer").symlink_to(REPO / "trainer", target_is_directory=True)
    if fake:
        (root / "tests").symlink_to(REPO / "tests", target_is_directory=True)
    (root / "thrust.yaml").write_text((FAKE if fake else SEARCH) + extra)
    return root


def fake_nvidia_smi(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do [ "$a" = "-L" ] && exec cat {SMI_DATA}/a100_four_gpus.list; done\n'
        f"exec cat {SMI_DATA}/a100_four_gpus.csv\n"
    )
    smi.chmod(0o755)
    return directory


def summary(result: subprocess.CompletedProcess) -> dict:
    assert result.stdout.strip(), result.stderr
    return json.loads(result.stdout)


def run_json(workdir: Path, run_id: str) -> dict:
    return json.loads((workdir / ".thrust" / "runs" / run_id / "run.json").read_text())


def assert_slots_never_overlap(trials: list[dict]) -> None:
    by_slot: dict[str, list[tuple[float, float]]] = {}
    for t in trials:
        if t["launched_at"] is not None:
            by_slot.setdefault(t["slot"], []).append((t["launched_at"], t["ended_at"]))
    for slot, spans in by_slot.items():
        spans.sort()
        for (_a0, a1), (b0, _b1) in zip(spans, spans[1:], strict=False):
            assert a1 is not None and a1 <= b0, f"two trials overlapped on {slot}: {spans}"


# ------------------------------------------------------------------------------------------- fast checks

def test_trainer_flag_list_matches_the_trainer():
    from trainer.train import build_parser

    flags = {opt[2:] for action in build_parser()._actions for opt in action.option_strings if opt.startswith("--")}
    flags.discard("help")
    assert flags == set(core.TRAINER_FLAGS)


def test_builtin_spaces_are_valid_and_cover_the_issue_list():
    from thrust_remote.core.config import builtin_jobs, parse_config_text

    config = parse_config_text("")
    for name in ("snake", "cartpole"):
        space = core.search_space(config, builtin_jobs()[name], {})
        assert {"learning-rate", "num-envs", "num-steps", "num-minibatches", "update-epochs", "clip-coef",
                "ent-coef", "gamma", "gae-lambda", "hidden"} <= set(space)
        assert set(core.distributions(space)) == set(space)
    # --set removes a parameter from the space
    assert "gamma" not in core.search_space(config, builtin_jobs()["cartpole"], {"gamma": "0.9"})

def test_the_summary_counts_the_trials_done_toward_the_target_and_failed_ones_apart(monkeypatch):
    """`--trials N` counts complete + pruned trials; a failed one is said apart, never as part of N."""
    import io

    from rich.console import Console

    from thrust_remote.cli import optimize as optimize_cli
    from thrust_remote.optimize.summary import Summary

    screen = Console(file=io.StringIO(), width=200, color_system=None)
    monkeypatch.setattr(optimize_cli, "console", screen)
    summary = Summary(study="s1", storage="sqlite:///s.db", job="cartpole", host="h", metric="return_mean",
                      trials_target=2, counts={"COMPLETE": 2, "PRUNED": 0, "FAIL": 1}, best=None, importances=None,
                      importance_note=None, best_params_file=None, slots=[], trials=[], wall_s=12.0, stopped=None)
    optimize_cli.render_summary(summary)
    first = screen.file.getvalue().splitlines()[0]
    assert first == ("study s1 (sqlite:///s.db): 2 of 2 trials done (2 complete, 0 pruned); 1 failed, not counted, "
                     "in 12.0 s")



def test_unknown_search_parameter_is_a_config_error(cli, tmp_path):
    (tmp_path / "thrust.yaml").write_text("search:\n  cartpole:\n    learning_rat: {low: 0.1, high: 0.2}\n")
    result = cli("optimize", "cartpole", "--trials", "2", cwd=tmp_path)
    assert result.returncode == 78, result.stderr
    assert "learning_rat" in result.stderr and "not a trainer flag" in result.stderr
    assert not (tmp_path / ".thrust").exists()  # refused before touching any host


# ------------------------------------------------------------------------------------- studies on hosts

def test_bad_gpu_index_is_refused_before_any_trial(cli, tmp_path):
    root = local_project(tmp_path, "cpu-host")
    result = cli("optimize", "cartpole", "--trials", "2", "--gpus", "5", *SMALL, cwd=root)
    assert result.returncode == 64, result.stderr
    assert "--gpus 5" in result.stderr and "has GPUs [none]" in result.stderr
    assert not (root / ".thrust" / "runs").exists() or not list((root / ".thrust" / "runs").iterdir())

    # another project (its own .thrust: the host's cached envcheck report is per workdir)
    root = local_project(tmp_path, "gpu-host")
    smi = fake_nvidia_smi(tmp_path / "smi")
    env = {"PATH": f"{smi}:{os.environ['PATH']}"}
    result = cli("optimize", "cartpole", "--trials", "2", "--gpus", "1,7", *SMALL, cwd=root, env=env)
    assert result.returncode == 64, result.stderr
    assert "has GPUs [0, 1, 2, 3]" in result.stderr and "[7]" in result.stderr
    assert not (root / ".thrust" / "runs").exists() or not list((root / ".thrust" / "runs").iterdir())


def test_gpu_slots_each_trial_sees_its_own_cuda_visible_devices(cli, tmp_path):
    root = local_project(tmp_path, "gpu-host", fake=True)
    smi = fake_nvidia_smi(tmp_path / "smi")
    env = {"PATH": f"{smi}:{os.environ['PATH']}"}
    result = cli("optimize", "fake", "--trials", "4", "--gpus", "1,3", "--pruner", "none", "--set", "seconds=0.3",
                 "--json", cwd=root, env=env)
    assert result.returncode == 0, result.stderr
    out = summary(result)
    assert [s["cuda_visible_devices"] for s in out["slots"]] == ["1", "3"]
    assert out["counts"]["done"] == 4
    seen = set()
    for t in out["trials"]:
        meta = run_json(root, t["run_id"])
        assert meta["env"]["CUDA_VISIBLE_DEVICES"] == t["cuda_visible_devices"] == t["slot"].removeprefix("gpu")
        assert meta["slot"] == t["slot"] and meta["trial"] == t["number"]
        seen.add(meta["env"]["CUDA_VISIBLE_DEVICES"])
    assert seen == {"1", "3"}
    assert_slots_never_overlap(out["trials"])


def test_failing_trials_stop_the_study_with_the_reason(cli, tmp_path):
    root = local_project(tmp_path, "failing")
    result = cli("optimize", "cartpole", "--trials", "4", "--parallel", "2", "--set", "update-epochs=x",
                 *SMALL, "--json", cwd=root)
    assert result.returncode == 1, result.stderr
    out = summary(result)
    assert out["stopped"] == "failures" and out["best"] is None and out["counts"]["done"] == 0
    assert 3 <= out["counts"]["FAIL"] <= 4  # three in a row stop new launches; one may be running
    # the reason shown is the trainer's own last line: it names the flag and the bad value
    assert all("--update-epochs" in t["note"] and "'x'" in t["note"] for t in out["trials"])


@pytest.fixture(scope="module")
def ssh_study(sshd, project, tmp_path_factory):
    """6 trials, 2 parallel, an aggressive median pruner, on the sshd host (study SQLite on the host)."""
    workdir = remote_tempdir(sshd, "opt-remote")
    sshd.thrust_yaml(project / "thrust.yaml", workdir=str(workdir), rest=SEARCH)
    exe = str(VENV_BIN / "thrust-remote")
    started = time.monotonic()
    result = subprocess.run([exe, "optimize", "cartpole", "--trials", "6", "--parallel", "2", "--study", "ssh6",
                             *AGGRESSIVE, *SMALL, "--seed", "3", "--json"],
                            cwd=project, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_COLOR": "1"})
    return result, workdir, time.monotonic() - started


@pytest.mark.e2e  # real trials of the built-in trainer
def test_study_over_ssh_completes_prunes_and_lives_on_the_host(ssh_study, project):
    import optuna

    result, workdir, _wall = ssh_study
    assert result.returncode == 0, result.stderr
    out = summary(result)
    assert out["counts"]["done"] == 6 and out["counts"]["COMPLETE"] >= 1
    assert out["counts"]["PRUNED"] >= 1, "the aggressive pruner pruned nothing"
    assert [s["cuda_visible_devices"] for s in out["slots"]] == ["", ""]
    for t in out["trials"]:
        meta = run_json(workdir, t["run_id"])
        assert meta["env"]["CUDA_VISIBLE_DEVICES"] == ""  # a CPU slot: no GPU visible
        assert meta["slot"] == t["slot"] and meta["env"]["THRUST_TRIAL"] == str(t["number"])
        assert "--export" not in meta["argv"]
        # one training per trial and slot, whatever the preset's --candidates and --snapshots
        assert meta["argv"][meta["argv"].index("--candidates") + 1] == "1"
        assert meta["argv"][meta["argv"].index("--snapshots") + 1] == "1"
    assert {t["slot"] for t in out["trials"]} == {"cpu0", "cpu1"}
    assert_slots_never_overlap(out["trials"])
    # pruned trials were stopped on the host, not left running
    for t in out["trials"]:
        assert (workdir / ".thrust" / "runs" / t["run_id"] / "exit_code").exists()
    # the authoritative study is the host's SQLite file; optuna (and optuna-dashboard) can open it
    db = workdir / ".thrust" / "studies" / "ssh6.db"
    study = optuna.load_study(study_name="ssh6", storage=f"sqlite:///{db}")
    states = sorted(t.state.name for t in study.trials)
    assert states.count("COMPLETE") + states.count("PRUNED") == 6 and "RUNNING" not in states
    assert out["best"]["value"] == study.best_value
    assert not (workdir / ".thrust" / "studies" / "ssh6.driver.json").exists()  # lease released


@pytest.mark.e2e  # real trials of the built-in trainer
def test_best_params_file_round_trips_into_train(ssh_study, project, cli):
    result, workdir, _wall = ssh_study
    out = summary(result)
    best_file = Path(out["best_params_file"])
    assert best_file == project / "ssh6-best.yaml"
    from thrust_remote.run.arguments import load_params

    params = load_params(best_file)
    assert params["total-steps"] == 4096 and set(out["best"]["params"]) <= set(params)
    started = cli("train", "cartpole", "--params", str(best_file), "--detach", "--json", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    argv = run_json(workdir, run_id)["argv"]
    for key, value in out["best"]["params"].items():
        i = argv.index(f"--{key}")
        assert argv[i + 1] == str(value)
    assert argv[argv.index("--total-steps") + 1] == "4096"
    stop = cli("stop", run_id, cwd=project)
    assert stop.returncode == 0, stop.stderr


def test_killed_driver_is_resumed_to_n_trials_without_duplicates(sshd, tmp_path):
    project = clone_repo(tmp_path / "project", plain=True)
    workdir = remote_tempdir(sshd, "opt-resume")
    sshd.thrust_yaml(project / "thrust.yaml", workdir=str(workdir), rest=FAKE)
    exe = str(VENV_BIN / "thrust-remote")
    argv = [exe, "optimize", "fake", "--trials", "5", "--parallel", "2",
            "--study", "resume", "--pruner", "none", "--set", "seconds=1.5", "--json"]
    env = {**os.environ, "NO_COLOR": "1"}
    first = subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    runs_dir = workdir / ".thrust" / "runs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(runs_dir.glob("resume-t*"))) < 3:
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)  # no cleanup at all: the study and the runs are left as they are
    first.wait(timeout=10)
    assert len(list(runs_dir.glob("resume-t*"))) >= 3, first.stderr.read().decode() if first.stderr else ""

    second = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=300, env=env)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["counts"]["done"] == 5
    numbers = [t["number"] for t in out["trials"]]
    assert len(numbers) == len(set(numbers))
    done = [t for t in out["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
    assert len(done) == 5
    # one run per trial: an adopted run is not launched again, a retried one gets a new trial number
    run_ids = [t["run_id"] for t in out["trials"] if t["run_id"]]
    assert len(run_ids) == len(set(run_ids))
    assert sorted(p.name for p in runs_dir.glob("resume-t*")) == sorted(run_ids)
    for t in out["trials"]:
        if t["state"] == "FAIL":
            assert "interrupted" in t["note"]
    assert_slots_never_overlap([t for t in out["trials"] if t["state"] != "FAIL"])


def test_ctrl_c_twice_stops_every_trial(tmp_path):
    root = local_project(tmp_path, "ctrl-c", fake=True)
    exe = str(VENV_BIN / "thrust-remote")
    err = tmp_path / "driver.stderr"  # a file, not a pipe: the test reads it while the driver runs
    with err.open("wb") as err_file:
        proc = subprocess.Popen([exe, "optimize", "fake", "--trials", "4", "--parallel", "2", "--pruner", "none",
                                 "--set", "seconds=3600", "--json"],
                                cwd=root, stdout=subprocess.PIPE, stderr=err_file,
                                env={**os.environ, "NO_COLOR": "1"})
    runs_dir = root / ".thrust" / "runs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(runs_dir.glob("*/metrics.jsonl"))) < 2:
        time.sleep(0.1)
    # a second driver of the same study on the same host is refused (it would adopt the first's trials)
    second = subprocess.run([exe, "optimize", "fake", "--trials", "4", "--parallel", "2"], cwd=root,
                            capture_output=True, text=True, timeout=120)
    assert second.returncode == 1 and "already being driven" in second.stderr, second.stderr
    proc.send_signal(signal.SIGINT)
    # the second press must come after the first was handled (drain), or they are not two presses
    wait_until(lambda: b"Ctrl-C: no new trials" in err.read_bytes(), 30, "the driver to take the first Ctrl-C")
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    stderr = err.read_bytes()
    assert proc.returncode == 130, stderr.decode()
    out = json.loads(stdout)
    assert out["stopped"] == "aborted"
    for run in runs_dir.iterdir():
        assert (run / "exit_code").exists(), f"{run.name} still running"
        assert (run / "stopped").exists()
    assert all(t["state"] == "FAIL" and "retried" in t["note"] for t in out["trials"])


@pytest.mark.parametrize("how", ["optimize --stop", "stop RUN"])
def test_stop_command_stops_a_running_study(cli, tmp_path, how):
    root = local_project(tmp_path, "stop-cmd", fake=True)
    exe = str(VENV_BIN / "thrust-remote")
    proc = subprocess.Popen([exe, "optimize", "fake", "--trials", "4", "--parallel", "2", "--pruner", "none",
                             "--set", "seconds=3600", "--json"],
                            cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "NO_COLOR": "1"})
    runs_dir = root / ".thrust" / "runs"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(runs_dir.glob("*/metrics.jsonl"))) < 1:
        time.sleep(0.1)
    if how == "optimize --stop":
        stop = cli("optimize", "fake", "--stop", "--json", cwd=root)
        assert stop.returncode == 0, stop.stderr
        assert json.loads(stop.stdout)["stopped"]
    else:  # `thrust-remote stop` on one trial stops the whole study
        one = sorted(p.parent.name for p in runs_dir.glob("*/metrics.jsonl"))[0]
        stop = cli("stop", one, cwd=root)
        assert stop.returncode == 0, stop.stderr
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    out = json.loads(stdout)
    assert out["stopped"] == "aborted" and out["counts"]["done"] == 0
    for run in runs_dir.iterdir():
        assert (run / "exit_code").exists(), f"{run.name} still running"


def test_study_lease_is_compare_and_swap(tmp_path):
    """A driver that lost its lease can neither renew it, nor push over the study, nor release the
    new driver's lease."""
    from thrust_remote.core.config import HostConfig
    from thrust_remote.core.errors import ThrustError
    from thrust_remote.host.runner import LocalRunner
    from thrust_remote.host.session import HostSession
    from thrust_remote.optimize import StudyStore

    session = HostSession.open(LocalRunner(), HostConfig("local", workdir=str(tmp_path / "work")))
    lease = str(tmp_path / "study.driver.json")
    remote = str(tmp_path / "host" / "study.db")
    a = StudyStore(f"sqlite:///{tmp_path / 'a.db'}", session=session, lease=lease, remote_db=remote,
                   local_db=tmp_path / "a.db")
    a.acquire()
    b = StudyStore(f"sqlite:///{tmp_path / 'b.db'}", session=session, lease=lease, remote_db=remote,
                   local_db=tmp_path / "b.db")
    a.heartbeat(force=True)  # while it is ours, renewing works
    # b takes over (as after a >60 s silence of a, from another machine): a must notice, not overwrite
    Path(lease).write_text(b._body())
    with pytest.raises(ThrustError, match="lost the study lease"):
        a.heartbeat(force=True)
    import sqlite3

    sqlite3.connect(tmp_path / "a.db").close()
    with pytest.raises(ThrustError, match="lost the study lease"):
        a.push()
    a.release()
    assert b._token in Path(lease).read_text()  # b's lease survives a's release
    b.release()
    assert not Path(lease).exists()
