"""Runs remember their host (the local index), `runs --all`, and concurrent runs of one job.

The first half needs no SSH: the index file, host resolution, the agent's launch-time collision
checks (real agent, real processes) and `--gpus N` picking free GPUs on a real nvidia-smi capture.
The second half is end to end over a real sshd: a project whose default host is `local` and whose
runs go to `sandbox`, so only the index can send `status RUN_ID` to the right host.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import FAKE_JOB, FAKE_LONG, REPO, clone_repo, commit, git, remote_tempdir, run_tree, wait_until

from envcheck.nvsmi import summarize
from thrust_remote.backends.direct import choose_gpus
from thrust_remote.core.config import HostConfig, JobConfig, load_config
from thrust_remote.core.errors import ExitCode, ThrustError, UnknownHostError
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import vocab
from thrust_remote.runs import control, index

# one worker runs this module's tests, in order: they share two running runs and one project, and the
# later ones stop or change them
pytestmark = pytest.mark.xdist_group("test_run_index")

NVSMI = REPO / "tests" / "data" / "nvidia_smi"


def _entry(run_id: str = "cartpole-20261123-101010-ab12", host: str = "sandbox") -> index.IndexEntry:
    return index.IndexEntry(run_id=run_id, host=host, job="cartpole", commit="c0ffee", started_at=index.now(),
                            run_dir=f"/w/.thrust/runs/{run_id}", config=None)


# ---------------------------------------------------------------------------------------- the index

def test_index_entry_is_one_private_file_per_run_written_whole(tmp_path):
    path = index.record(tmp_path, _entry())
    assert path == tmp_path / ".thrust" / "index" / "cartpole-20261123-101010-ab12.json"
    assert (path.stat().st_mode & 0o077) == 0
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    data = json.loads(path.read_text())
    assert set(data) == {"run_id", "host", "job", "commit", "started_at", "run_dir", "config", "nodes", "sets",
                         "params", "patch_sha256", "resumed_from"}
    assert data["nodes"] == []  # one host: no nodes (a run over several hosts lists them, node 0 first)
    assert index.lookup(tmp_path, "cartpole-20261123-101010-ab12") == _entry()
    several = index.record(tmp_path, replace(_entry(), run_id="r2", nodes=("a", "b")))
    assert json.loads(several.read_text())["nodes"] == ["a", "b"]
    assert index.lookup(tmp_path, "r2").nodes == ("a", "b")
    # what `resume` needs comes back as it went in: the --set words, the parameters, the patch, the chain
    resumed = replace(_entry(), run_id="r3", sets=("lr=0.1",), params={"hidden": 32}, patch_sha256="ab" * 32,
                      resumed_from="r2")
    index.record(tmp_path, resumed)
    index.record_patch(tmp_path, "r3", b"diff --git a/x b/x\n")
    assert index.lookup(tmp_path, "r3") == resumed
    assert index.read_patch(tmp_path, "r3") == b"diff --git a/x b/x\n" and index.read_patch(tmp_path, "r2") is None
    assert (tmp_path / ".thrust" / "index" / "r3.patch").stat().st_mode & 0o077 == 0


def test_index_lookup_of_unknown_or_damaged_entries_is_none(tmp_path):
    assert index.lookup(tmp_path, "nope") is None
    index.record(tmp_path, _entry("r1"))
    (tmp_path / ".thrust" / "index" / "r1.json").write_text("{not json")
    assert index.lookup(tmp_path, "r1") is None
    with pytest.raises(ValueError, match="not valid"):
        index.record(tmp_path, _entry("../escape"))


def _config(tmp_path: Path, hosts: str = "  sandbox:\n    address: me@127.0.0.1:2222\n") -> object:
    path = tmp_path / "thrust.yaml"
    path.write_text(f"default_host: local\nhosts:\n{hosts}")
    return load_config(path, environ={})


def test_resolve_host_explicit_wins_then_the_index_then_the_default(tmp_path):
    config = _config(tmp_path)
    index.record(config.root, _entry("r1", host="sandbox"))
    assert index.resolve_host(config, "r1", "local") == "local"  # --host still wins
    assert index.resolve_host(config, "r1", None) == "sandbox"
    assert index.resolve_host(config, "r2", None) is None  # not indexed: the default host, as before


def test_an_indexed_host_the_config_lacks_is_68_naming_the_config_that_had_it(tmp_path):
    config = _config(tmp_path)
    entry = index.IndexEntry(**{**_entry("r1", host="gone").as_json(), "config": "/elsewhere/thrust.yaml"})
    index.record(config.root, entry)
    with pytest.raises(UnknownHostError) as info:
        index.resolve_host(config, "r1", None)
    assert info.value.exit_code == ExitCode.UNKNOWN_HOST
    assert "--config /elsewhere/thrust.yaml" in (info.value.hint or "")


# ---------------------------------------------------------------- the agent: what collides, what not

def _session(tmp_path: Path) -> HostSession:
    return HostSession(LocalRunner(), HostConfig(name="local", python=sys.executable), HostPaths(str(tmp_path)))


def _start(session: HostSession, run_id: str, gpus: list[int], claim: bool = True) -> dict:
    return control.launch(session, run_id=run_id, job="cartpole", argv=["sleep", "30"], cwd=str(session.paths.workdir),
                       env={}, meta={"gpus": gpus, "commit": "c0ffee"}, claim_gpus=gpus if claim else ())


def test_runs_of_one_job_run_side_by_side_and_only_taken_gpus_are_refused(tmp_path):
    session = _session(tmp_path)
    try:
        _start(session, "a", [0])
        _start(session, "b", [])  # same job, same commit: no per-job lock any more
        assert [control.status(session, r)["state"] for r in ("a", "b")] == ["RUNNING", "RUNNING"]
        assert control.status(session, "a")["gpus"] == [0]
        with pytest.raises(ThrustError) as info:
            _start(session, "c", [1, 0])
        assert "GPU 0 on local is taken by running run a" in info.value.message
        assert "thrust-remote stop a --host local" in (info.value.hint or "")
        assert "--allow-shared-gpus" in (info.value.hint or "")
        assert not (tmp_path / ".thrust" / "runs" / "c").exists()
        _start(session, "d", [1])  # another GPU: fine
        _start(session, "e", [0], claim=False)  # shared on purpose: fine
        assert control.gpus_taken(session) == {0: "a", 1: "d"}
        with pytest.raises(ThrustError, match="run a is already running"):
            _start(session, "a", [])  # the same run dir twice would mix two jobs in one log
        for run in ("a", "e"):
            control.stop(session, run, grace=2)
        _start(session, "c", [0])  # GPU 0 is free again once its runs ended
        assert control.status(session, "c")["state"] == "RUNNING"
    finally:
        for run in ("a", "b", "c", "d", "e"):
            if (tmp_path / ".thrust" / "runs" / run).exists():
                control.stop(session, run, grace=2)


def _facts(name: str) -> dict:
    listing = NVSMI / f"{name}.list"
    return {"nvidia_smi": summarize((NVSMI / f"{name}.csv").read_text(), 0,
                                    listing.read_text() if listing.exists() else "")}


def test_gpus_count_picks_among_gpus_no_running_run_holds():
    host = HostConfig(name="gpu", address="gpu-box")
    request = vocab.TrainRequest(job=JobConfig(name="snake"), host=host, gpus="2")
    facts = _facts("a100_four_gpus")
    assert choose_gpus(request, facts, lambda: {}) == [0, 2]  # nothing taken: the least busy two
    assert 0 not in choose_gpus(request, facts, lambda: {0: "snake-a"})
    request.gpus = "4"
    with pytest.raises(ThrustError) as info:
        choose_gpus(request, facts, lambda: {0: "snake-a", 2: "snake-b"})
    assert "2 GPU(s) free" in info.value.message and "GPU 0: snake-a" in info.value.message
    assert "thrust-remote stop snake-a --host gpu" in (info.value.hint or "")
    request.gpus = "0,2"  # a list is taken as given: the host's launch refuses what is held
    assert choose_gpus(request, facts, lambda: {0: "snake-a"}) == [0, 2]


# ------------------------------------------------------------------------------ over a real sshd

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def silent_port():
    """A port that accepts TCP and then says nothing: an SSH host that hangs before its banner."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


@pytest.fixture(scope="module")
def workdir(sshd) -> Path:
    """The sandbox host's workdir (tests look into it only to check what happened there)."""
    return remote_tempdir(sshd) / "thrust"


@pytest.fixture(scope="module")
def project(tmp_path_factory, sshd, silent_port, workdir) -> Path:
    """A clone whose default host is `local`; `sandbox` is the sshd, `down` refuses, `silent` hangs."""
    proj = clone_repo(tmp_path_factory.mktemp("index") / "project")
    extra = "".join(
        f"  {name}:\n    address: {sshd.user}@127.0.0.1:{port}\n    known_hosts: {sshd.known_hosts}\n"
        f"    identity: {sshd.client_key}\n    connect_timeout: 60\n"
        for name, port in (("down", _closed_port()), ("silent", silent_port))
    )
    sshd.thrust_yaml(proj / "thrust.yaml", workdir=str(workdir), hosts_extra=extra, rest="jobs:\n" + FAKE_JOB)
    text = (proj / "thrust.yaml").read_text().replace("default_host: sandbox", "default_host: local", 1)
    (proj / "thrust.yaml").write_text(text)
    commit(proj, "thrust.yaml for the test hosts", "thrust.yaml")
    return proj


@pytest.fixture(scope="module")
def two_runs(project, sshd):
    """Two detached runs of the same job and commit on `sandbox`, stopped at the end."""
    import shutil

    exe = shutil.which("thrust-remote", path=str(Path(sys.executable).parent))
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    ids = []
    try:
        for _ in range(2):
            res = subprocess.run([exe, "train", "fake", "--host", "sandbox", *FAKE_LONG, "--detach", "--json"],
                                 cwd=project, capture_output=True, text=True, env=env, timeout=300)
            assert res.returncode == 0, res.stderr
            ids.append(json.loads(res.stdout)["run_id"])
        yield ids
    finally:
        for run_id in ids:
            subprocess.run([exe, "stop", run_id, "--host", "sandbox", "--grace", "2"], cwd=project,
                           capture_output=True, env=env, timeout=120)


def _wait(cli, project: Path, run_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
    """The run's status once its state is one of `states` (a status call is a CLI call: wait_until paces it)."""
    def reached() -> dict | None:
        res = cli("status", run_id, "--json", cwd=project)  # no --host: the index says where
        assert res.returncode == 0, res.stderr
        st = json.loads(res.stdout)
        return st if st["state"] in states else None

    return wait_until(reached, timeout, f"run {run_id} to be {' or '.join(states)}", interval=0.3)


@pytest.mark.slow
def test_two_detached_runs_of_the_same_job_and_commit_both_run(cli, project, two_runs, workdir):
    first, second = two_runs
    assert first != second
    states = [_wait(cli, project, r, ("RUNNING",)) for r in two_runs]
    assert [s["state"] for s in states] == ["RUNNING", "RUNNING"]
    assert states[0]["commit"] == states[1]["commit"]
    for run_id in two_runs:
        run_json = json.loads((workdir / ".thrust" / "runs" / run_id / "run.json").read_text())
        assert run_json["run_id"] == run_id  # each its own run dir


@pytest.mark.slow
def test_status_logs_and_the_index_find_the_host_without_host(cli, project, two_runs, workdir):
    run_id = two_runs[0]
    entry = json.loads((project / ".thrust" / "index" / f"{run_id}.json").read_text())
    assert entry["host"] == "sandbox" and entry["job"] == "fake"
    assert entry["commit"] == git(project, "rev-parse", "HEAD")
    assert entry["run_dir"] == str(workdir / ".thrust" / "runs" / run_id)
    assert entry["config"] == str((project / "thrust.yaml").resolve())
    status = cli("status", run_id, cwd=project)  # the default host is `local`: only the index knows
    assert status.returncode == 0, status.stderr
    assert "RUNNING" in status.stdout
    assert cli("logs", run_id, cwd=project).returncode == 0
    # --host still wins: on `local` there is no such run
    wrong = cli("status", run_id, "--host", "local", cwd=project)
    assert wrong.returncode == ExitCode.USAGE and "no run" in wrong.stderr  # 1 is for a failed job
    # an id the index does not know: the default host, as before, and a hint to look everywhere
    unknown = cli("status", "cartpole-19990101-000000-beef", cwd=project)
    assert unknown.returncode == ExitCode.USAGE
    assert "on local" in unknown.stderr and "thrust-remote runs --all" in unknown.stderr


@pytest.mark.slow
def test_runs_all_lists_every_host_in_parallel_and_names_the_unreachable(cli, project, two_runs):
    started = time.monotonic()
    # 10 s: the sandbox must answer in time on a loaded 2-core machine; the silent host never does.
    # The --json and the piped listing side by side: each waits out the silent host's 10 s
    with ThreadPoolExecutor(2) as pool:
        plain_asked = pool.submit(cli, "runs", "--all", "--timeout", "10", cwd=project, env={"COLUMNS": "40"})
        res = cli("runs", "--all", "--timeout", "10", "--json", cwd=project)
        elapsed = time.monotonic() - started
        plain = plain_asked.result()
    assert res.returncode == 0, res.stderr  # one host answered: that is success
    rows = json.loads(res.stdout)
    assert {r["run_id"] for r in rows if r.get("host") == "sandbox"} >= set(two_runs)
    errors = {r["host"]: r["error"] for r in rows if "error" in r}
    assert set(errors) == {"down", "silent"}
    assert "no answer within 10 s" in errors["silent"]  # its connect_timeout (60 s) never came into it
    assert elapsed < 45, elapsed  # bounded by --timeout, not by the silent host's 60 s
    # piped (no terminal): every value whole, whatever the width
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert lines[0].split() == ["host", "job", "state", "exit", "started", "ended", "commit", "tree", "run"]
    assert "…" not in plain.stdout
    for run_id in two_runs:
        assert any(line.startswith("sandbox") and line.endswith(run_id) for line in lines), plain.stdout
    assert any(line.startswith("down") and "UNREACHABLE" in line for line in lines), plain.stdout
    # without --all: the default host only, as before
    local = cli("runs", "--json", cwd=project)
    assert local.returncode == 0 and json.loads(local.stdout) == []
    # ... and says which host it asked: an empty answer from `local` is not "you have no runs"
    plain_local = cli("runs", cwd=project)
    assert plain_local.returncode == 0 and plain_local.stdout == ""
    assert "no runs on local (the default host; --host H for another, --all for every host)" in plain_local.stderr
    named = cli("runs", "--host", "sandbox", cwd=project)
    assert "runs on sandbox" in named.stderr and all(r in named.stdout for r in two_runs)


@pytest.mark.slow
def test_changed_code_under_running_runs_runs_beside_them_in_a_tree_of_its_own(cli, project, two_runs, workdir):
    """Once refused ("would change their code under them"): each run has a tree of its own, so a run of
    new code starts beside the running ones, whose trees stay at their commit."""
    before = {r: git(run_tree(workdir, r), "rev-parse", "HEAD") for r in two_runs}
    (project / "CHANGED.md").write_text("new code\n")
    git(project, "add", "CHANGED.md")
    git(project, "commit", "-q", "-m", "a change")
    res = cli("train", "fake", "--host", "sandbox", *FAKE_LONG, "--detach", "--json", cwd=project)
    assert res.returncode == 0, res.stderr
    new = json.loads(res.stdout)["run_id"]
    try:
        assert git(run_tree(workdir, new), "rev-parse", "HEAD") == git(project, "rev-parse", "HEAD")
        assert (run_tree(workdir, new) / "CHANGED.md").exists()
        for run_id, head in before.items():  # the running runs' trees are as they were
            assert git(run_tree(workdir, run_id), "rev-parse", "HEAD") == head
            assert not (run_tree(workdir, run_id) / "CHANGED.md").exists()
            assert _wait(cli, project, run_id, ("RUNNING",))["state"] == "RUNNING"
    finally:
        cli("stop", new, "--grace", "2", cwd=project)


@pytest.mark.slow
def test_stop_without_host_finds_the_run(cli, project, two_runs):
    for run_id in two_runs:
        res = cli("stop", run_id, "--grace", "2", cwd=project)
        assert res.returncode == 0, res.stderr
        assert _wait(cli, project, run_id, ("STOPPED",))["state"] == "STOPPED"


@pytest.mark.parametrize("width", [200, 80, 60])
def test_runs_on_a_narrow_terminal_drops_columns_whole_never_the_state(width):
    import io

    from rich.console import Console

    from thrust_remote.cli.runs import COLUMNS, _print_table

    rows = [("ppo", "FINISHED", "0", "2026-11-25T08:23:05Z", "2026-11-25T08:25:05Z", "3f2a9c1b7d0e", "12.3 MB",
             "ppo-20261125-082305-4cbb"),
            ("ppo", "FAILED", "2", "2026-11-25T08:30:00Z", "2026-11-25T08:30:04Z", "3f2a9c1b7d0e", "-",
             "ppo-20261125-083000-77aa")]
    out = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
    _print_table(COLUMNS, rows, out=out)
    text = out.file.getvalue()
    assert all(len(line) <= width for line in text.splitlines())
    for row in rows:
        assert row[1] in text and row[-1] in text  # the state and the run id, whole
    assert "…" not in text
    assert ("3f2a9c1b7d0e" in text) is (width == 200)  # the commit goes first when room is short


def test_runs_all_on_a_narrow_terminal_lists_each_hosts_runs_under_its_name():
    """`runs --all` where even the host column does not fit: a table per host under the host's name
    (it had dropped the column, leaving runs with no word of where they are)."""
    import io

    from rich.console import Console

    from thrust_remote.cli.runs import COLUMNS, _print_hosts_table

    rows = [("gpu-a", "ppo", "RUNNING", "", "2026-11-25T08:23:05Z", "", "3f2a9c1b7d0e", "1.0 kB",
             "ppo-20261125-082305-4cbb"),
            ("gpu-b", "ppo", "FAILED", "2", "2026-11-25T08:30:00Z", "2026-11-25T08:30:04Z", "3f2a9c1b7d0e", "-",
             "ppo-20261125-083000-77aa")]
    for width, grouped in ((200, False), (40, True)):
        out = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
        _print_hosts_table(("host", *COLUMNS), rows, ["gpu-c: connection refused"], out=out)
        lines = out.file.getvalue().splitlines()
        assert all(len(line) <= width for line in lines)
        at = {name: next(i for i, line in enumerate(lines) if name in line)
              for name in ("gpu-a", "gpu-b", "ppo-20261125-082305-4cbb", "ppo-20261125-083000-77aa")}
        if grouped:  # each host's name heads its own runs
            assert lines[at["gpu-a"]].strip() == "gpu-a" and lines[at["gpu-b"]].strip() == "gpu-b"
            assert at["gpu-a"] < at["ppo-20261125-082305-4cbb"] < at["gpu-b"] < at["ppo-20261125-083000-77aa"]
        else:  # one table, the host in each row
            assert at["gpu-a"] == at["ppo-20261125-082305-4cbb"] and at["gpu-b"] == at["ppo-20261125-083000-77aa"]
        assert "RUNNING" in lines[at["ppo-20261125-082305-4cbb"]] and lines[-1] == "gpu-c: connection refused"
