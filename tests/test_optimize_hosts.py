"""`thrust-remote optimize JOB --host a --host b`: one study over several hosts (docs/optimize.md,
"Several hosts"). Real sshd: two host entries on the sshd fixture with their own `workdir:` are two
hosts as far as the host side is concerned (own checkout, own runs, own lease); a host entry whose port
is closed is a host that cannot be reached; a second private sshd killed mid-study is a host lost while
its trial runs. Trials are runs of tests/fake_train.py (its return is the searched parameter), one slot
per host: the subject is the scheduling over hosts, not the training.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import SSHServer, _start_sshd
from helpers import FAKE_JOB, FAKE_SEARCH, clone_repo, remote_tempdir

# one worker runs this module's tests, in order: its tests share a clone and two hosts where studies and runs accumulate
pytestmark = pytest.mark.xdist_group("test_optimize_hosts")

VENV_BIN = Path(sys.executable).parent
EXE = str(VENV_BIN / "thrust-remote")

SEARCH = "jobs:\n" + FAKE_JOB + FAKE_SEARCH
SMALL = ["--set", "seconds=0.3", "--pruner", "none"]


def host_entry(server: SSHServer, name: str, workdir: str, port: int | None = None) -> str:
    hc = server.host_config(name)
    address = hc.address if port is None else f"{server.user}@127.0.0.1:{port}"
    return (f"  {name}:\n    address: {address}\n    workdir: {workdir}\n    python: {hc.python}\n"
            f"    identity: {hc.identity}\n    known_hosts: {hc.known_hosts}\n    connect_timeout: 5\n")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


def optimize(project: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([EXE, "optimize", "fake", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})


def runs_in(workdir: Path, study: str) -> list[str]:
    return sorted(p.name for p in (workdir / ".thrust" / "runs").glob(f"{study}-t*"))


@pytest.fixture(scope="module")
def two_hosts(sshd, tmp_path_factory):
    """A clone of this repository as the project; hosts a and b (same sshd, own workdirs), the group
    `pair: [a, b]`, and `dead` (a closed port) in the group `half: [a, dead]`."""
    base = tmp_path_factory.mktemp("opt-hosts")
    project = clone_repo(base / "project", plain=True)
    work = {n: remote_tempdir(sshd, f"opt-{n}-") for n in "ab"}
    (project / "thrust.yaml").write_text(
        "default_host: a\nhosts:\n" + host_entry(sshd, "a", str(work["a"])) + host_entry(sshd, "b", str(work["b"]))
        + host_entry(sshd, "dead", str(work["a"]), port=closed_port())
        + "groups:\n  pair: [a, b]\n  half: [a, dead]\n" + SEARCH)
    return project, work


@pytest.mark.slow
def test_one_study_over_two_hosts(two_hosts):
    project, work = two_hosts
    result = optimize(project, "--host", "a", "--host", "b", "--trials", "4", "--parallel", "1",
                      "--study", "both", *SMALL, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["counts"]["done"] == 4 and out["counts"]["FAIL"] == 0
    # trials landed on both hosts, N in total, and the summary says how many each
    assert set(out["hosts"]) == {"a", "b"} and sum(out["hosts"].values()) == 4
    assert out["hosts"]["a"] >= 1 and out["hosts"]["b"] >= 1, out["hosts"]
    assert sorted((s["host"], s["name"]) for s in out["slots"]) == [("a", "cpu0"), ("b", "cpu0")]
    for name in "ab":
        ran = [t for t in out["trials"] if t["host"] == name]
        assert len(ran) == out["hosts"][name]
        assert runs_in(work[name], "both") == sorted(t["run_id"] for t in ran)  # each run on its own host
    # the study is one SQLite file on the driver; every host's lease was released, no study DB there
    db = project / ".thrust" / "studies" / "both.db"
    assert out["storage"] == f"sqlite:///{db}" and db.exists()
    for name in "ab":
        studies = work[name] / ".thrust" / "studies"
        assert not (studies / "both.db").exists() and not (studies / "both.driver.json").exists()
    # the best params file names the host of the best trial
    best = out["best"]
    assert best["host"] in ("a", "b")
    text = Path(out["best_params_file"]).read_text()
    assert f"--params both-best.yaml --host {best['host']}" in text and f"host: {best['host']}" in text


@pytest.mark.slow
def test_a_group_with_an_unreachable_host_runs_on_the_others(two_hosts):
    """`--host half` = a and dead (nothing listens on dead's port): a warning names dead, the study
    finishes on a, and the text summary says dead was lost."""
    import optuna

    project, work = two_hosts
    journal = project.parent / "half-journal.log"  # Optuna's journal storage, for several drivers
    result = optimize(project, "--host", "half", "--trials", "2", "--parallel", "1", "--study", "half", *SMALL,
                      "--storage", f"journal:{journal}")
    assert result.returncode == 0, result.stderr
    assert "host dead cannot be reached and takes no trials" in result.stderr
    assert "host dead was lost" in result.stdout and "trials per host (complete + pruned): a 2, dead 0" in result.stdout
    assert "--host a" in result.stdout  # the train hint names the best trial's host
    assert "study half (" in result.stdout and "2 of 2 trials done (2 complete, 0 pruned), in " in result.stdout
    assert len(runs_in(work["a"], "half")) == 2
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    study = optuna.load_study(study_name="half", storage=storage)
    assert sorted(t.state.name for t in study.trials) == ["COMPLETE", "COMPLETE"]
    assert not (project / ".thrust" / "studies" / "half.db").exists()


def test_a_host_named_twice_is_refused(two_hosts):
    project, _work = two_hosts
    result = optimize(project, "--host", "pair", "--host", "b", "--trials", "2", *SMALL)
    assert result.returncode == 64, result.stderr
    assert "'b' is named twice" in result.stderr


@pytest.mark.slow
def test_killed_driver_over_two_hosts_resumes_to_n(two_hosts):
    """SIGKILL the driver while both hosts run a trial; the rerun adopts or retries them: N in total,
    one run per trial on each host, nothing duplicated."""
    project, work = two_hosts
    argv = [EXE, "optimize", "fake", "--host", "pair", "--trials", "4", "--parallel", "1", "--study", "again",
            "--set", "seconds=2", "--pruner", "none", "--json"]
    env = {**os.environ, "NO_COLOR": "1"}
    first = subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(runs_in(work[n], "again") for n in "ab"):
        time.sleep(0.1)
    first.send_signal(signal.SIGKILL)  # no cleanup: the study says RUNNING, the runs go on
    first.wait(timeout=10)
    assert all(runs_in(work[n], "again") for n in "ab"), first.stderr.read().decode() if first.stderr else ""
    second = subprocess.run(argv, cwd=project, capture_output=True, text=True, timeout=240, env=env)
    assert second.returncode == 0, second.stderr
    out = json.loads(second.stdout)
    assert out["counts"]["done"] == 4 and sum(out["hosts"].values()) == 4
    run_ids = [t["run_id"] for t in out["trials"] if t["run_id"]]
    assert len(run_ids) == len(set(run_ids))
    for name in "ab":  # every run on a host belongs to exactly one trial that names that host
        assert runs_in(work[name], "again") == sorted(t["run_id"] for t in out["trials"] if t["host"] == name)
    assert all("interrupted" in t["note"] for t in out["trials"] if t["state"] == "FAIL")


@pytest.fixture
def second_sshd():
    """A private sshd of its own (a host whose death leaves the fixture's sshd alone)."""
    server = _start_sshd(Path(tempfile.mkdtemp(prefix="thrust-sshd2-")))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.slow
def test_a_host_lost_mid_study_loses_only_its_running_trial(sshd, two_hosts, second_sshd):
    """Kill host c's sshd (and with it c's trial) while c runs a trial: that trial is FAIL
    (interrupted) and its parameters run again on a; the study reaches N on a; c is named as lost."""
    project, work = two_hosts
    work_c = remote_tempdir(second_sshd, "opt-c-")
    config = project / "lost.yaml"
    with (project / ".git" / "info" / "exclude").open("a") as fh:
        fh.write("lost.yaml\n")  # not part of the code the hosts run
    config.write_text("default_host: a\nhosts:\n" + host_entry(sshd, "a", str(work["a"]))
                      + host_entry(second_sshd, "c", str(work_c)) + SEARCH)
    argv = [EXE, "--config", str(config), "optimize", "fake", "--host", "c", "--host", "a", "--trials", "4",
            "--parallel", "1", "--study", "lost", "--set", "seconds=2", "--pruner", "none", "--json"]
    proc = subprocess.Popen(argv, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "NO_COLOR": "1"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not list((work_c / ".thrust" / "runs").glob("lost-t*/metrics.jsonl")):
            time.sleep(0.1)
        assert list((work_c / ".thrust" / "runs").glob("lost-t*/metrics.jsonl")), "no trial started on c"
        second_sshd.stop()  # sshd, its sessions and c's trial: gone
        stdout, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr.decode()
    out = json.loads(stdout)
    assert out["counts"]["done"] == 4
    assert "c" in out["lost_hosts"] and "lost host c" in stderr.decode()
    lost = [t for t in out["trials"] if t["host"] == "c" and t["state"] == "FAIL"]
    assert lost and all("host c lost" in t["note"] for t in lost)
    # the lost trial's parameters ran again, on a
    retried = [t for t in out["trials"] if t["host"] == "a" and t["params"] == lost[0]["params"]]
    assert retried and retried[0]["state"] == "COMPLETE"
    assert sum(out["hosts"].values()) == 4
