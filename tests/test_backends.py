"""The same behaviour on both backends (issue 52): a run on a plain SSH box (`direct`) and on a Slurm cluster
(`slurm`), each test written once and run against both (tests/backend_hosts.py: a real sshd; a real Slurm
cluster reached through its login sshd). Launch, follow, stop, fetch, resume, a run over two nodes and
optimize, through the installed CLI as a user runs it. Jobs are tiny `command:` jobs (or the fake trainer,
tests/fake_train.py) held by a file the test writes, never a sleep.

Where Slurm adds to what a direct host says (a QUEUED before RUNNING, a scheduler job id), the test
asserts the contract both keep and says what Slurm adds beside it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import backend_hosts
import pytest
from backend_hosts import BackendHost
from helpers import wait_until
from slurm_cluster import launched_run, run_status

# one worker runs the module: its cluster, login sshd and projects are the module's, made once per backend
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("test_backends")]


@pytest.fixture(scope="module", params=["direct", "slurm"])
def backend_host(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendHost]:
    root = tmp_path_factory.mktemp(f"backend-{request.param}")
    if request.param == "direct":
        with backend_hosts.direct(request.getfixturevalue("sshd"), root) as host:
            yield host
    else:
        with backend_hosts.slurm(root) as host:
            yield host


def _status(cli, host: BackendHost, run_id: str) -> dict:
    host.fresh()
    return run_status(cli, host.project, run_id)


def _started(cli, host: BackendHost, *args: str) -> str:
    """`train ARGS --detach`: its run id (exit 0)."""
    done = cli("train", *args, "--detach", cwd=host.project)
    assert done.returncode == 0, done.stdout + done.stderr + host.describe()
    return launched_run(done.stderr)


def _log(host: BackendHost, run_id: str) -> str:
    log = host.run_dir(run_id) / "log"
    return log.read_text() if log.exists() else ""


def _ended(cli, host: BackendHost, run_id: str) -> dict:
    """The run's status once it is no longer QUEUED or RUNNING."""
    return wait_until(lambda: (s := _status(cli, host, run_id))["state"] not in ("QUEUED", "RUNNING") and s, 60,
                      f"run {run_id} to end\n{host.describe()}", interval=0.3)


def test_launch_detached_reads_running_then_finished(cli, backend_host):
    host = backend_host
    run_id = _started(cli, host, "gated")
    # Slurm says QUEUED (pending, with its reason) until the allocation starts; a direct host starts at once
    assert _status(cli, host, run_id)["state"] in ("QUEUED", "RUNNING")
    wait_until(lambda: "started" in _log(host, run_id), 60, "the job's first line")
    running = _status(cli, host, run_id)
    assert running["state"] == "RUNNING" and running["pid"], running
    said = cli("status", run_id, cwd=host.project)
    assert said.returncode == 0 and f"{run_id}: RUNNING" in said.stdout, said.stdout + said.stderr
    (host.run_dir(run_id) / "go").touch()
    done = cli("wait", run_id, "--timeout", "60", cwd=host.project)
    assert done.returncode == 0, done.stdout + done.stderr
    st = _status(cli, host, run_id)
    assert (st["state"], st["exit_code"], st["job"]) == ("FINISHED", 0, "gated"), st
    # Slurm adds its job id (scheduler_job); a direct host has none
    assert bool(st.get("scheduler_job")) == (host.name == "slurm"), st
    shown = cli("logs", run_id, cwd=host.project)
    assert shown.returncode == 0 and "started" in shown.stdout and "done" in shown.stdout, shown.stdout


def test_follow_attached_train_prints_the_jobs_lines_and_brings_the_model_and_artifacts(cli, backend_host):
    host = backend_host
    placed = host.project / "web" / "public" / "fake.onnx"
    placed.unlink(missing_ok=True)
    done = cli("train", "fake", "--set", "seconds=0.3", cwd=host.project)
    assert done.returncode == 0, done.stdout + done.stderr + host.describe()
    run_id = launched_run(done.stderr)
    assert "fake training for 0.3 s" in done.stdout + done.stderr, done.stdout + done.stderr
    assert placed.is_file()  # fetched, verified and placed: the run FINISHED
    fetched = host.project / ".thrust" / "fetched" / run_id
    assert (fetched / "artifacts").is_dir() and any((fetched / "artifacts").rglob("metrics.jsonl")), \
        sorted(p.relative_to(fetched) for p in fetched.rglob("*"))
    assert _status(cli, host, run_id)["state"] == "FINISHED"


def test_stop_ends_a_running_run_stopped_and_a_second_stop_says_not_running(cli, backend_host):
    host = backend_host
    run_id = _started(cli, host, "gated")
    wait_until(lambda: "started" in _log(host, run_id), 60, "the job's first line")
    # Slurm's stop is scancel; the supervisor passes the TERM on and records the end, as a direct host's does
    stopped = cli("stop", run_id, cwd=host.project)
    assert (stopped.returncode, stopped.stdout) == (0, f"{run_id}: stopped (STOPPED)\n"), stopped.stderr
    st = _ended(cli, host, run_id)
    assert (st["state"], st["reason"], st["exit_code"]) == ("STOPPED", "user", 143), st
    said = cli("status", run_id, cwd=host.project).stdout
    assert f"{run_id}: STOPPED (exit code 143)  job=gated" in said and "[user" not in said, said
    again = cli("stop", run_id, cwd=host.project)
    assert (again.returncode, again.stdout) == (0, f"{run_id}: not running (STOPPED)\n"), again.stderr
    assert not (host.run_dir(run_id) / "go").exists() and "done" not in _log(host, run_id)  # it never passed its gate
    for command in ("stop", "fetch", "resume"):  # a run the host does not have: 64, naming where it looked
        nosuch = cli(command, "gated-nosuch", cwd=host.project)
        assert nosuch.returncode == 64 and "error: no run 'gated-nosuch' on sandbox" in nosuch.stderr, \
            (command, nosuch.stderr)


def test_fetch_brings_a_detached_runs_model_and_artifacts(cli, backend_host):
    host = backend_host
    placed = host.project / "web" / "public" / "fake.onnx"  # fetched, verified and placed: the run FINISHED
    placed.unlink(missing_ok=True)
    run_id = _started(cli, host, "fake", "--set", "seconds=0.3")
    assert _ended(cli, host, run_id)["state"] == "FINISHED"  # not `wait`: it pulls the artifacts itself
    fetched = host.project / ".thrust" / "fetched" / run_id
    assert not fetched.exists()  # detached: nothing came home yet
    got = cli("fetch", run_id, "--json", cwd=host.project)
    assert got.returncode == 0, got.stdout + got.stderr
    out = json.loads(got.stdout)
    assert out["run_id"] == run_id and out["state"] == "FINISHED" and out["model"] and out["sha256"], out
    assert any((fetched / "artifacts").rglob("metrics.jsonl")), sorted(fetched.rglob("*"))
    assert (out["model"], out["placed"]) == (str(placed), True) and placed.is_file(), out


def test_resume_continues_a_stopped_run_from_its_checkpoint(cli, backend_host):
    host = backend_host
    first = _started(cli, host, "ckpt")
    wait_until(lambda: "checkpoint at step 7" in _log(host, first), 60, "the job's checkpoint")
    assert cli("stop", first, cwd=host.project).returncode == 0
    assert _ended(cli, host, first)["state"] == "STOPPED"
    resumed = cli("resume", first, cwd=host.project)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr + host.describe()
    second = launched_run(resumed.stderr)
    assert second != first
    st = _ended(cli, host, second)
    assert (st["state"], st["resumed_from"]) == ("FINISHED", first), st
    assert "resumed from step 7" in _log(host, second)


def test_a_run_over_two_nodes_runs_a_rank_on_each(cli, backend_host):
    host = backend_host
    if host.two_nodes is None:
        pytest.skip(host.why_not_two)
    done = cli("train", "ranks", *host.two_nodes, "--no-fetch", cwd=host.project)
    run_id = launched_run(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr + host.describe()
    ranks = {p.name: p.read_text().strip() for node in (0, 1) for p in host.node_run_dir(node, run_id).glob("rank-*")}
    assert set(ranks) == {"rank-0-of-2", "rank-1-of-2"}, ranks
    st = _status(cli, host, run_id)
    assert st["state"] == "FINISHED", st
    # on Slurm both ranks ran in the run's one job (the SLURM_JOB_ID each saw); a direct host has no job id
    assert set(ranks.values()) == {st.get("scheduler_job") or ""}, (ranks, st)
    assert [(n["node"], n["state"]) for n in st["nodes"]] == [(0, "FINISHED"), (1, "FINISHED")], st["nodes"]


def test_optimize_runs_two_trials_to_completion(cli, backend_host):
    host = backend_host
    # Slurm runs each trial as a job of its own (scheduler_job); a direct host as a run of its own
    result = cli("optimize", "words", "--trials", "2", "--seed", "1", "--json", cwd=host.project, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr + host.describe()
    out = json.loads(result.stdout)
    assert out["counts"]["done"] == 2, out
    assert [t["state"] for t in out["trials"]] == ["COMPLETE", "COMPLETE"], out["trials"]
    for trial in out["trials"]:
        assert trial["value"] == float(trial["params"]["lr"]), trial  # the objective read from the job's line
        st = _status(cli, host, trial["run_id"])
        assert (st["state"], st["job"]) == ("FINISHED", "words"), st
        assert bool(st.get("scheduler_job")) == (host.name == "slurm"), st
    assert out["best"]["value"] == max(t["value"] for t in out["trials"]), out["best"]


# ------------------------------------------------------------------------------------------ max_duration
# A job's `max_duration:` (here `train --max-duration`): its own supervisor stops it at that age on every
# kind of host, TERM first (the job says it got it: where a real one writes its last checkpoint), and the
# run ends STOPPED [max-duration], never "timeout" (which a retry and a cluster read as "continue me").

def test_max_duration_stops_a_run_at_its_age_term_first(cli, backend_host):
    host = backend_host
    run_id = _started(cli, host, "ckpt", "--max-duration", "2")
    st = _ended(cli, host, run_id)
    assert (st["state"], st["reason"], st["exit_code"]) == ("STOPPED", "max-duration", 143), st
    assert st["reason_detail"] == "it reached its max_duration of 2s", st
    assert "stopped at step 7" in _log(host, run_id)  # its TERM handler ran: it had its chance to checkpoint
    said = cli("status", run_id, cwd=host.project).stdout
    assert f"{run_id}: STOPPED (exit code 143) [max-duration: it reached its max_duration of 2s]" in said, said
    listed = cli("runs", cwd=host.project).stdout  # piped: plain columns
    assert any(run_id in line and "STOPPED [max-duration]" in line for line in listed.splitlines()), listed
    waited = cli("wait", run_id, "--timeout", "30", cwd=host.project)
    assert waited.returncode == 143 and "[max-duration: it reached its max_duration of 2s]" in waited.stderr, \
        waited.stdout + waited.stderr


def test_max_duration_stops_every_node_of_a_run_over_two(cli, backend_host):
    host = backend_host
    if host.two_nodes is None:
        pytest.skip(host.why_not_two)
    # 20 s: torchrun's rendezvous over two nodes starts the ranks within it even on a 2-core machine busy
    # with other suites (10 s was seen to end the run before either rank had started)
    done = cli("train", "ranks", "--set", "hold", *host.two_nodes, "--max-duration", "20", "--no-fetch",
               cwd=host.project, timeout=120)
    run_id = launched_run(done.stderr)
    assert "[max-duration: it reached its max_duration of 20s]" in done.stdout + done.stderr, done.stdout + done.stderr
    st = _status(cli, host, run_id)
    assert st["state"] == "STOPPED", st
    assert [(n["node"], n["state"]) for n in st["nodes"]] == [(0, "STOPPED"), (1, "STOPPED")], st["nodes"]
    # each node's rank got its TERM from its own node's supervisor (torchrun's rendezvous may give a
    # node either rank: the ranks are counted over both logs)
    logs = [(host.node_run_dir(node, run_id) / "log").read_text() for node in (0, 1)]
    termed = [{r for r in (0, 1) if f"rank {r} got TERM" in log} for log in logs]
    assert sorted(r for t in termed for r in t) == [0, 1] and all(termed), (logs, st)
