"""Runs that outlive their host (docs/architecture.md, "Checkpoints and resume"): a RUNNING run's newest
checkpoint fetched, its host lost (its sshd and everything it started killed: SSHServer.stop), then
`resume --host other` continuing from the pulled checkpoint at the run's own code; a job of your own
with `resume:`; `--retry` resuming on the second host when the first dies while followed, with pulls
during the follow; a pull cut by SIGKILL. Every host is a real sshd; every project a new one, not this
repository. The retry chain's decisions are also tested alone, with no SSH (Chain's callables).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import _start_sshd
from helpers import EXE, Clock, commit, git, git_init, run_tree, wait_until

from thrust_remote.core.config import parse_config_text
from thrust_remote.core.errors import ConfigError, ConnectionLostError, ExitCode
from thrust_remote.run import resume
from thrust_remote.run.vocab import Launched, TrainOutcome

CARTPOLE = ("{env: cartpole, total-steps: 5000000, num-envs: 8, target-return: 0, checkpoint-interval: 0.3, "
            "log-interval: 0.2}")


# ------------------------------------------------------------------------------------------ no SSH

def test_the_new_job_keys_parse_and_a_wrong_one_names_its_line():
    config = parse_config_text(
        "hosts:\n  a: {address: a.example}\n  b: {address: b.example}\n"
        "jobs:\n  own:\n    script: train.py\n    checkpoints: ckpt/*.pt\n"
        "    resume: [--resume-from, '{checkpoint}']\n    sync_every: 30\n    retry: {max: 2, hosts: [b]}\n")
    job = config.jobs["own"]
    assert (job.checkpoints, job.resume, job.sync_every) == ("ckpt/*.pt", ("--resume-from", "{checkpoint}"), 30.0)
    assert job.retry is not None
    assert job.retry.max == 2 and job.retry.on == ("host-lost", "lost") and job.retry.hosts == ("b",)
    own = "    script: t.py\n    checkpoints: ckpt/*.pt\n    resume: [--resume-from, '{checkpoint}']\n"
    bad = {
        "    script: t.py\n    checkpoints: c/*\n    resume: [--resume-from, x]\n": ":8: jobs.own.resume: expected the "
                                                                                 "checkpoint's place",
        own + "    sync_every: -1\n": ":9: jobs.own.sync_every: expected seconds between pulls",
        own + "    retry: {max: 1, hosts: [c]}\n": ":9: jobs.own.retry.hosts: 'c' is not a host",
        own + "    retry: {max: 1, on: [reboot]}\n": ":9: jobs.own.retry.on: 'reboot' is not one of",
        own + "    retry: {on: [lost]}\n": ":9: jobs.own.retry.max: missing",
        # a job of your own that cannot continue from a checkpoint cannot be retried: said at load, not at hour three
        "    script: t.py\n    retry: {max: 1}\n": ":7: jobs.own.retry: needs `checkpoints:` and `resume:` too",
        "    script: t.py\n    resume: [--resume-from, '{checkpoint}']\n": ":7: jobs.own.resume: needs `checkpoints:`",
    }
    for lines, message in bad.items():
        text = "hosts:\n  a: {address: a.example}\n  b: {address: b.example}\njobs:\n  own:\n" + lines
        with pytest.raises(ConfigError) as info:
            parse_config_text(text, Path("thrust.yaml"))
        assert message in str(info.value), (lines, str(info.value))
    trainer = parse_config_text("jobs:\n  cp:\n    args: {env: cartpole}\n    retry: {max: 1, grace: 5}\n")
    assert resume.policy_for(trainer.jobs["cp"], None) == resume.RetryPolicy(1, ("host-lost", "lost"), (), 5.0)
    assert resume.policy_for(trainer.jobs["cp"], 0) is None  # --retry 0 turns the job's retry off


def _outcome(run_id: str, host: str, state: str) -> TrainOutcome:
    launched = Launched(run_id, f"/w/{run_id}", 1, host, "cp", "c0ffee", None, None, False, {})  # type: ignore[arg-type]
    return TrainOutcome(launched, {"run_id": run_id, "state": state}, None, 0 if state == "FINISHED" else 1, {})


def _lost(run_id: str, host: str) -> ConnectionLostError:
    exc = ConnectionLostError(f"connection to {host} lost")
    exc.run_id, exc.host = run_id, host
    return exc


class _Told:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, message: str) -> None:
        self.lines.append(message)

    warn = step


def test_a_lost_host_resumes_on_the_next_retry_host_that_answers_and_the_chain_is_recorded():
    calls: list[tuple[str, object]] = []
    up = {"a": False, "b": True}

    def attempt(run_id: str, hosts: list[str]) -> TrainOutcome:
        calls.append(("attempt", (run_id, hosts)))
        return _outcome("r2", hosts[0], "FINISHED")

    def first() -> TrainOutcome:
        raise _lost("r1", "a")

    clock = Clock()
    told = _Told()
    chain = resume.Chain(resume.RetryPolicy(2, ("host-lost", "lost"), ("b",), grace=20.0), told, attempt=attempt,
                         follow=lambda *a: pytest.fail("not a reattach"),
                         answers=lambda host, run_id=None: {} if up[host] else None, hosts_of=lambda r: ["a"],
                         sleep=clock.sleep, clock=clock)
    got = chain.run(first)
    assert clock.now == 20.0  # a silent host gets the grace (asked every GRACE_POLL_S) before its run moves
    assert calls == [("attempt", ("r1", ["b"]))]
    assert got.attempts == [{"run_id": "r1", "host": "a", "state": "UNREACHABLE"},
                            {"run_id": "r2", "host": "b", "state": "FINISHED"}]
    said = " ".join(told.lines)  # moved off a host that may only have lost its link: the stop command
    assert "if run r1 still goes on on a" in said and "thrust-remote stop r1 --host a" in said


def test_a_host_that_answers_again_within_the_grace_with_the_run_going_is_followed_not_resumed():
    """Only the link dropped: the host answers on the third ask and the run goes on there. Following it
    again is right; a resume elsewhere would train a second copy."""
    followed, clock = [], Clock()
    asks = iter([None, None, {"state": "RUNNING"}])
    chain = resume.Chain(resume.RetryPolicy(1), _Told(), attempt=lambda *a: pytest.fail("no resume"),
                         follow=lambda run_id, host: followed.append((run_id, host)) or _outcome(run_id, host,
                                                                                                  "FINISHED"),
                         answers=lambda host, run_id=None: next(asks), hosts_of=lambda r: ["a"],
                         sleep=clock.sleep, clock=clock)
    got = chain.run(lambda: (_ for _ in ()).throw(_lost("r1", "a")))
    assert followed == [("r1", "a")] and got.status["state"] == "FINISHED"
    assert clock.now == 2 * resume.GRACE_POLL_S


def test_a_failed_run_is_not_retried_unless_asked_and_retries_stop_at_max():
    told = _Told()
    no = resume.Chain(resume.RetryPolicy(3), told, attempt=lambda *a: pytest.fail("failed is not in `on`"),
                      follow=lambda *a: None, answers=lambda *a, **k: {}, hosts_of=lambda r: ["a"])
    assert no.run(lambda: _outcome("r1", "a", "FAILED")).status["state"] == "FAILED"
    tries = []

    def attempt(run_id: str, hosts: list[str]) -> TrainOutcome:
        tries.append(run_id)
        return _outcome(f"r{len(tries) + 1}", "a", "LOST")

    capped = resume.Chain(resume.RetryPolicy(2, ("lost",)), told, attempt=attempt, follow=lambda *a: None,
                          answers=lambda *a, **k: {}, hosts_of=lambda r: ["a"])
    got = capped.run(lambda: _outcome("r1", "a", "LOST"))
    assert tries == ["r1", "r2"] and got.launched.run_id == "r3" and got.status["state"] == "LOST"
    assert len(got.attempts) == 3 and "retry 2 of 2" in " ".join(told.lines)
    with pytest.raises(ConnectionLostError):  # a lost host not in `on`: the 75 as without retry
        resume.Chain(resume.RetryPolicy(1, ("lost",)), told, attempt=attempt, follow=lambda *a: None,
                     answers=lambda *a, **k: None, hosts_of=lambda r: ["a"]).run(
            lambda: (_ for _ in ()).throw(_lost("r1", "a")))


# ------------------------------------------------------------------------------------------ real hosts

@pytest.fixture(scope="module")
def host_b(tmp_path_factory):
    server = _start_sshd(tmp_path_factory.mktemp("host-b"))
    yield server
    server.stop()


@pytest.fixture
def host_a(tmp_path):
    server = _start_sshd(tmp_path / "host-a")
    yield server
    server.stop()


def _host_entry(server, name: str) -> str:
    hc = server.host_config(name)
    return (f"  {name}:\n    address: {hc.address}\n    workdir: {hc.workdir}\n    python: {hc.python}\n"
            f"    identity: {hc.identity}\n    known_hosts: {hc.known_hosts}\n    connect_timeout: 5\n")


def _project(path: Path, host_a, host_b, jobs: str, files: dict[str, str] | None = None) -> Path:
    path.mkdir(parents=True)
    for name, text in (files or {}).items():
        (path / name).write_text(text)
    host_a.thrust_yaml(path / "thrust.yaml", name="a", hosts_extra=_host_entry(host_b, "b"), rest=f"jobs:\n{jobs}")
    git_init(path)
    commit(path, "a project of its own")
    return path


def _cli(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    return subprocess.run([EXE, *args], cwd=project, capture_output=True, text=True, env=env, timeout=timeout)


def _pulled(project: Path, run_id: str) -> dict | None:
    try:
        record = json.loads((project / ".thrust" / "fetched" / run_id / "checkpoints.json").read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("newest") else None


def _step(name: str) -> int:
    return int(name.removeprefix("ckpt-").removesuffix(".pt"))


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


# ~15-20 s quiet: a real training long enough to be fetched while it runs, its host killed, then the
# resumed run on the other host trained on from the pulled checkpoint to its end.
@pytest.mark.e2e  # the built-in trainer, for real
@pytest.mark.slow
def test_a_running_run_fetched_then_its_host_lost_resumes_on_another_host_from_the_pulled_checkpoint(
        tmp_path, host_a, host_b):
    project = _project(tmp_path / "proj", host_a, host_b, f"  cp:\n    args: {CARTPOLE}\n",
                       files={"notes.txt": "first\n"})
    (project / "notes.txt").write_text("first, and an uncommitted change\n")  # what runs is HEAD + this patch
    started = _cli(project, "train", "cp", "--host", "a", "--detach", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]

    host_dir = Path(host_a.host_config().workdir) / ".thrust" / "runs" / run_id / "checkpoints"

    def fetched() -> tuple[dict, bytes] | None:
        got = _cli(project, "fetch", run_id, "--json")
        assert got.returncode == 0, got.stderr
        answer = json.loads(got.stdout)
        if not (answer["checkpoint"] and answer["checkpoint"]["newest"]):
            return None
        try:  # the trainer keeps its newest 3: on a busy machine this one may be gone already
            return answer, (host_dir / answer["checkpoint"]["newest"]).read_bytes()
        except FileNotFoundError:
            return None  # fetched again: a newer one

    answer, on_host = wait_until(fetched, 180, "a checkpoint of the RUNNING run fetched")
    assert answer["state"] == "RUNNING" and answer["model"] is None and not answer["placed"]
    assert not (project / "web").exists()  # a model is placed only from a FINISHED run
    newest = answer["checkpoint"]["newest"]
    local = project / ".thrust" / "fetched" / run_id / "checkpoints" / newest
    assert hashlib.sha256(local.read_bytes()).hexdigest() == hashlib.sha256(on_host).hexdigest()

    refused = _cli(project, "resume", run_id, "--host", "b")
    assert refused.returncode == 64 and "still RUNNING on a" in refused.stderr and "stop" in refused.stderr

    host_a.stop()  # the host is gone: sshd, the supervisor and the trainer with it
    (project / "notes.txt").write_text("the laptop moved on\n")
    commit(project, "later work")  # HEAD moves; the resumed run still runs the run's own code
    kept = local.read_bytes()
    local.write_bytes(kept + b"x")  # a pulled copy that is not what came: never resumed from
    bad = _cli(project, "resume", run_id, "--host", "b")
    assert bad.returncode == 74 and "does not match the sha256" in bad.stderr and "Traceback" not in bad.stderr
    local.unlink()
    gone = _cli(project, "resume", run_id, "--host", "b")
    assert gone.returncode == 64 and "is gone" in gone.stderr and "Traceback" not in gone.stderr
    local.write_bytes(kept)

    step = _step(newest)
    done = _cli(project, "resume", run_id, "--host", "b", "--set", f"total-steps={step + 2048}", "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["state"] == "FINISHED" and out["resumed_from"] == run_id and out["host"] == "b"
    assert "a, where run" in done.stderr and "does not answer" in done.stderr
    assert f"resuming at run {run_id}'s code" in done.stderr
    new_dir = Path(host_b.host_config().workdir) / ".thrust" / "runs" / out["run_id"]
    assert _metrics(new_dir)[0]["step"] > step  # the step count goes on from the checkpoint
    meta = json.loads((new_dir / "run.json").read_text())
    entry = json.loads((project / ".thrust" / "index" / f"{run_id}.json").read_text())
    assert meta["commit"] == entry["commit"] != git(project, "rev-parse", "HEAD").strip()
    assert meta["patch_sha256"] == entry["patch_sha256"] and entry["patch_sha256"]
    assert meta["resumed_from"] == run_id
    status = json.loads(_cli(project, "status", out["run_id"], "--json").stdout)
    assert status["resumed_from"] == run_id
    old = _cli(project, "status", run_id)  # its host is gone: the hint names the run that went on
    assert old.returncode == ExitCode.UNAVAILABLE, old.stderr
    assert f"run {run_id} was resumed as {out['run_id']} on b: thrust-remote status {out['run_id']}" in old.stderr
    listed = _cli(project, "runs", "--host", "b")
    assert run_id in listed.stdout.splitlines()[-1] and "resumed_from" in listed.stdout.splitlines()[0]
    cfg = project / "thrust.yaml"  # the dead host taken out of thrust.yaml: still pointed to the new run
    text = cfg.read_text().replace("default_host: a\n", "default_host: b\n")
    cfg.write_text(text.replace("\n  a:\n", "\n  a-old:\n"))
    old = _cli(project, "status", run_id)
    assert old.returncode == ExitCode.UNKNOWN_HOST, old.stderr
    assert f"run {run_id} was resumed as {out['run_id']} on b: thrust-remote status {out['run_id']}" in old.stderr


# ~18-22 s quiet per follower: a real training long enough for a checkpoint to be pulled while it is
# followed, a host killed, the 2 s grace, then the resumed run on b to its end.
@pytest.mark.e2e  # the built-in trainer, for real
@pytest.mark.slow
@pytest.mark.parametrize("follower", ["train", "watch"])
def test_retry_resumes_a_followed_run_on_the_next_host_when_its_own_dies(tmp_path, host_a, host_b, follower):
    """`train` attached, or `watch` of a run started with --detach (a machine left on to mind it): the
    same chain. The job's retry gives the silent host 2 s (grace) before its run moves to b."""
    project = _project(tmp_path / "proj", host_a, host_b,
                       f"  cp:\n    args: {CARTPOLE}\n    retry: {{max: 1, hosts: [b], grace: 2}}\n")
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    if follower == "train":
        argv = ["train", "cp", "--host", "a", "--sync-every", "1", "--json", "--set", "total-steps=100000"]
    else:
        started = _cli(project, "train", "cp", "--host", "a", "--detach", "--json", "--set", "total-steps=100000")
        assert started.returncode == 0, started.stderr
        argv = ["watch", json.loads(started.stdout)["run_id"], "--sync-every", "1", "--json"]
    follow = subprocess.Popen([EXE, *argv], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env)
    try:
        index = project / ".thrust" / "index"
        run_id = wait_until(lambda: next((p.stem for p in index.glob("*.json")), None) if index.is_dir() else None,
                            240, "the run in the index")
        record = wait_until(lambda: _pulled(project, run_id), 120, "a checkpoint pulled while followed")
        host_a.stop()
        out, err = follow.communicate(timeout=400)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    got = json.loads(out)
    assert [a["state"] for a in got["attempts"]] == ["UNREACHABLE", "FINISHED"]
    assert got["attempts"][0] == {"run_id": run_id, "host": "a", "state": "UNREACHABLE"}
    assert got["resumed_from"] == run_id and got["host"] == "b" and got["run_id"] == got["attempts"][1]["run_id"]
    assert f"retry: run {run_id} resumes from checkpoint" in err and "on b" in err
    new_dir = Path(host_b.host_config().workdir) / ".thrust" / "runs" / got["run_id"]
    first_step = _metrics(new_dir)[0]["step"]
    assert first_step > _step(record["newest"]) > 0  # it went on from what was pulled, not from 0
    assert got["total_steps"] >= 100000  # the run's own --set came along


OWN = '''\
import argparse, json, os, sys, time
p = argparse.ArgumentParser()
p.add_argument("--resume-from")
p.add_argument("--big", type=int, default=0)
a = p.parse_args()
step = 0
if a.resume_from:
    step = json.load(open(a.resume_from))["step"]
    print(f"resumed from {a.resume_from} at step {step}", flush=True)
os.makedirs("ckpt", exist_ok=True)
if a.big:  # one large checkpoint, written whole, then renamed
    block = os.urandom(1 << 20)
    with open("ckpt/.big.tmp", "wb") as f:
        for _ in range(a.big):
            f.write(block)
    os.replace("ckpt/.big.tmp", "ckpt/zz-big.bin")
while True:
    step += 1
    if step % 10 == 0:  # a checkpoint every half second, written whole, then renamed
        with open("ckpt/.tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace("ckpt/.tmp", "ckpt/state.json")
    print(f'THRUST_METRICS {{"step": {step}}}', flush=True)
    time.sleep(0.05)
'''


@pytest.mark.slow
def test_a_job_of_your_own_resumes_through_its_template_and_one_without_it_is_refused(tmp_path, sshd, remote_dir):
    from helpers import new_project

    jobs = ("jobs:\n  own:\n    script: train.py\n    checkpoints: ckpt/*.json\n"
            "    resume: [--resume-from, '{checkpoint}']\n"
            "  plain:\n    script: train.py\n    checkpoints: ckpt/*.json\n")
    project = new_project(tmp_path / "proj", sshd, remote_dir / "w", files={"train.py": OWN}, jobs=jobs)
    started = _cli(project, "train", "own", "--detach", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    wait_until(lambda: json.loads(_cli(project, "fetch", run_id, "--json").stdout)["checkpoint"]["newest"], 120,
               "the job's checkpoint fetched")
    assert _cli(project, "stop", run_id).returncode == 0
    again = _cli(project, "resume", run_id, "--detach", "--json")
    assert again.returncode == 0, again.stderr
    new = json.loads(again.stdout)["run_id"]
    on_host = run_tree(remote_dir / "w", run_id) / "ckpt" / "state.json"
    placed = remote_dir / "w" / ".thrust" / "runs" / new / "resume" / "state.json"

    def said() -> str | None:
        log = _cli(project, "logs", new).stdout
        return log if "resumed from" in log else None

    log = wait_until(said, 120, "the resumed job's first line")
    # its own host answered: the run's own file, linked into the new run's directory (no upload; the old
    # tree may be reclaimed while the new run starts)
    assert f"resumed from {placed}" in log and placed.stat().st_ino == on_host.stat().st_ino
    assert int(log.split("at step ")[1].split()[0]) > 0
    _cli(project, "stop", new)
    old = _cli(project, "status", run_id)  # the stopped run says where its work went on
    assert old.returncode == 0 and f"continued by {new} on sandbox: thrust-remote status {new}" in old.stdout
    assert json.loads(_cli(project, "status", run_id, "--json").stdout)["continued_by"] == [
        {"run_id": new, "host": "sandbox"}]

    plain = json.loads(_cli(project, "train", "plain", "--detach", "--json").stdout)["run_id"]
    _cli(project, "stop", plain)
    refused = _cli(project, "resume", plain)
    assert refused.returncode == 64 and "`resume:`" in refused.stderr and "jobs.plain" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_a_pull_killed_mid_transfer_leaves_nothing_under_the_final_name_and_the_next_one_completes(
        tmp_path, sshd, remote_dir):
    from helpers import new_project

    jobs = "jobs:\n  big:\n    script: train.py\n    args: [--big, '300']\n    checkpoints: ckpt/zz-*.bin\n"
    project = new_project(tmp_path / "proj", sshd, remote_dir / "w", files={"train.py": OWN}, jobs=jobs)
    run_id = json.loads(_cli(project, "train", "big", "--detach", "--json").stdout)["run_id"]
    host_file = run_tree(remote_dir / "w", run_id) / "ckpt" / "zz-big.bin"
    wait_until(lambda: _cli(project, "logs", run_id).stdout.count("THRUST_METRICS") or None, 120,
               "the big checkpoint written")
    dest = project / ".thrust" / "fetched" / run_id / "checkpoints"
    env = {**os.environ}
    env.pop("THRUST_CONFIG", None)
    cut = subprocess.Popen([EXE, "fetch", run_id], cwd=project, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: dest.is_dir() and any(dest.glob(".*.part")), 120, "the pull under way", interval=0.005)
        cut.send_signal(signal.SIGKILL)
        cut.wait(10)
    finally:
        cut.kill()
    assert not (dest / "zz-big.bin").exists()  # nothing partial under the final name
    done = _cli(project, "fetch", run_id, "--json")
    assert done.returncode == 0, done.stderr
    got = dest / "zz-big.bin"
    assert got.stat().st_size == host_file.stat().st_size == 300 << 20
    assert not list(dest.glob(".*.part"))  # the killed pull's part went with the next one (its pid is gone)
    assert hashlib.sha256(got.read_bytes()).hexdigest() == hashlib.sha256(host_file.read_bytes()).hexdigest()
    _cli(project, "stop", run_id)
