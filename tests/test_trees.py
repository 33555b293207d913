"""One run, one tree (docs/architecture.md, "Trees"), over a real sshd: runs of different commits side by
side in one workdir, queued variants each on its own code, a failed run's files kept apart from a later
run's, `files:` sent once and only what changed, `setup:` once per inputs, `shared:` across runs, the
trees of ended runs reclaimed (`keep:`, `prune`) but never a live run's, and a clear refusal when the
host's disk cannot take a tree. Every project is a test's own, not this repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import EXE, commit, git, new_project, remote_tempdir, wait_until

from thrust_remote.core.errors import ExitCode

# waits for $THRUST_RUN_DIR/go (so a test decides when it ends), having said which code it is; a
# checkpoint of its own beside it, and `fail` makes it end FAILED. seen-version comes last and whole
# (renamed into place): the tests wait for it, then read it and seen-cwd.
RUN_SH = """\
pwd > "$THRUST_RUN_DIR/seen-cwd"
mkdir -p ckpt && cat version.txt > ckpt/state.pt
cat version.txt > "$THRUST_RUN_DIR/.seen-version" && mv "$THRUST_RUN_DIR/.seen-version" "$THRUST_RUN_DIR/seen-version"
while [ ! -e "$THRUST_RUN_DIR/go" ]; do sleep 0.05; done
[ -e "$THRUST_RUN_DIR/fail" ] && exit 3
exit 0
"""
JOBS = """\
jobs:
  gated:
    kind: command
    command: [sh, run.sh]
    checkpoints: ckpt/*.pt
"""


def _project(tmp_path: Path, sshd, workdir: Path, *, jobs: str = JOBS, files: dict | None = None,
             hosts_extra: str = "") -> Path:
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=jobs,
                       files={"run.sh": RUN_SH, "version.txt": "A\n", **(files or {})}, message="version A")
    if hosts_extra:
        cfg = proj / "thrust.yaml"
        cfg.write_text(cfg.read_text().replace("    connect_timeout: 5\n", "    connect_timeout: 5\n" + hosts_extra, 1))
        commit(proj, "host settings", "thrust.yaml")
    return proj


def _detach(cli, proj: Path, job: str = "gated", *args: str) -> dict:
    res = cli("train", job, "--detach", "--json", *args, cwd=proj)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _state(cli, proj: Path, run_id: str) -> dict:
    res = cli("status", run_id, "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _release(run_dir: Path, *, fail: bool = False) -> None:
    if fail:
        (run_dir / "fail").touch()
    (run_dir / "go").touch()


def _version(proj: Path, text: str) -> None:
    (proj / "version.txt").write_text(text)
    commit(proj, f"version {text.strip()}", "version.txt")


def test_runs_of_different_commits_run_side_by_side_each_in_its_own_tree(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = _project(tmp_path, sshd, workdir)
    first = _detach(cli, proj)
    wait_until(lambda: Path(first["run_dir"], "seen-version").exists(), 60, "run A to start")
    _version(proj, "B\n")  # other code while A runs: once refused ("would change their code under them")
    second = _detach(cli, proj)
    wait_until(lambda: Path(second["run_dir"], "seen-version").exists(), 60, "run B to start")
    assert [_state(cli, proj, r["run_id"])["state"] for r in (first, second)] == ["RUNNING", "RUNNING"]
    for run, version in ((first, "A"), (second, "B")):
        run_dir = Path(run["run_dir"])
        assert (run_dir / "seen-version").read_text() == f"{version}\n"
        tree = Path((run_dir / "seen-cwd").read_text().strip())
        assert tree == workdir / ".thrust" / "trees" / run["run_id"]
        assert git(tree, "rev-parse", "HEAD") == json.loads((run_dir / "run.json").read_text())["commit"]
        assert _state(cli, proj, run["run_id"])["tree"] == str(tree)
    # a fetch while both go: the first run's checkpoint is its own, and no "the newest may be theirs"
    fetched = cli("fetch", first["run_id"], "--json", cwd=proj)
    assert fetched.returncode == 0, fetched.stderr
    assert "same checkout" not in fetched.stderr, fetched.stderr
    newest = json.loads(fetched.stdout)["checkpoint"]["newest"]
    assert (proj / ".thrust" / "fetched" / first["run_id"] / "checkpoints" / newest).read_text() == "A\n"
    # one object store: the trees are worktrees of the workdir's repository, no second .git
    assert (workdir / ".git").is_dir() and all((workdir / ".thrust" / "trees" / r["run_id"] / ".git").is_file()
                                                for r in (first, second))
    for run in (first, second):
        _release(Path(run["run_dir"]))
    waited = cli("wait", first["run_id"], second["run_id"], "--timeout", "60", cwd=proj)
    assert waited.returncode == 0, waited.stderr


def test_three_queued_variants_start_in_order_each_on_its_own_code(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = _project(tmp_path, sshd, workdir, hosts_extra="    cpu_slots: 1\n")
    runs = []
    for version in ("A\n", "B\n", "C\n"):
        if runs:
            _version(proj, version)
        runs.append(_detach(cli, proj, "gated", "--queue"))
    assert [_state(cli, proj, r["run_id"])["state"] for r in runs] == ["RUNNING", "QUEUED", "QUEUED"]
    for i, run in enumerate(runs):
        run_dir = Path(run["run_dir"])
        wait_until(lambda d=run_dir: (d / "seen-version").exists(), 60, f"variant {i} to start")
        later = [_state(cli, proj, r["run_id"])["state"] for r in runs[i + 1:]]
        assert set(later) <= {"QUEUED"}, later  # nobody overtook it
        assert (run_dir / "seen-version").read_text() == "ABC"[i] + "\n"  # its own code, not the newest
        _release(run_dir)
    waited = cli("wait", *[r["run_id"] for r in runs], "--timeout", "60", cwd=proj)
    assert waited.returncode == 0, waited.stderr


def test_a_failed_runs_checkpoint_is_its_own_though_a_later_run_wrote_the_same_path(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = _project(tmp_path, sshd, workdir)
    failed = _detach(cli, proj)
    wait_until(lambda: Path(failed["run_dir"], "seen-version").exists(), 60, "the first run to start")
    _release(Path(failed["run_dir"]), fail=True)
    wait_until(lambda: _state(cli, proj, failed["run_id"])["state"] == "FAILED", 60, "the first run to fail")
    _version(proj, "B\n")
    later = _detach(cli, proj)
    wait_until(lambda: Path(later["run_dir"], "seen-version").exists(), 60, "the later run to start")
    _release(Path(later["run_dir"]))
    wait_until(lambda: _state(cli, proj, later["run_id"])["state"] == "FINISHED", 60, "the later run to end")
    fetched = cli("fetch", failed["run_id"], "--json", cwd=proj)
    assert fetched.returncode == 0, fetched.stderr
    assert "newer than this run" not in fetched.stderr  # no time window: the tree is the run's alone
    newest = json.loads(fetched.stdout)["checkpoint"]["newest"]
    assert (proj / ".thrust" / "fetched" / failed["run_id"] / "checkpoints" / newest).read_text() == "A\n"


DATA_JOBS = """\
jobs:
  reader:
    kind: command
    command: [sh, -c, 'cat data/a.txt data/sub/b.txt > "$THRUST_RUN_DIR/seen"']
    files: [data/]
"""


def test_files_go_once_per_host_and_only_a_changed_one_again(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = _project(tmp_path, sshd, workdir, jobs=DATA_JOBS, files={".gitignore": "data/\n"})
    (proj / "data" / "sub").mkdir(parents=True)
    (proj / "data" / "a.txt").write_text("alpha\n")
    (proj / "data" / "sub" / "b.txt").write_text("beta\n")
    first = cli("train", "reader", cwd=proj)
    assert first.returncode == 0, first.stderr
    assert "sending 2 of 2 files: " in first.stderr
    second = cli("train", "reader", cwd=proj)
    assert second.returncode == 0, second.stderr
    assert not re.search(r"sending \d+ of \d+ files:", second.stderr)  # nothing sent
    (proj / "data" / "a.txt").write_text("alpha, changed\n")
    third = cli("train", "reader", cwd=proj)
    assert third.returncode == 0, third.stderr
    assert "sending 1 of 2 files: " in third.stderr
    run_dir = workdir / ".thrust" / "runs" / re.search(r"launching run (\S+)", third.stderr).group(1)
    assert (run_dir / "seen").read_text() == "alpha, changed\nbeta\n"
    tree = Path(json.loads((run_dir / "run.json").read_text())["tree"])
    assert (tree / "data" / "sub" / "b.txt").stat().st_nlink >= 2  # a link to the store: one copy per host
    missing = cli("train", "reader", cwd=proj, env={"THRUST_CONFIG": str(_with_files(proj, "[nope/x.bin]"))})
    assert missing.returncode == ExitCode.CONFIG and "nope/x.bin does not exist" in missing.stderr
    assert re.search(r"other\.yaml:\d+: jobs\.reader\.files", missing.stderr), missing.stderr


def _with_files(proj: Path, files: str) -> Path:
    other = proj.parent / "other.yaml"
    other.write_text((proj / "thrust.yaml").read_text().replace("files: [data/]", f"files: {files}"))
    return other


SETUP_JOBS = """\
jobs:
  prepared:
    kind: command
    command: [sh, -c, 'cat out/prepared.txt shared/count > "$THRUST_RUN_DIR/seen"']
    setup: [sh, prep.sh]
    shared: [shared/]
"""
PREP_SH = """\
echo ran >> "$SETUP_COUNTER"
mkdir -p out shared
echo "prepared by {version}" > out/prepared.txt
n=$(cat shared/count 2>/dev/null || echo 0); echo $((n + 1)) > shared/count
"""


def test_setup_runs_once_per_inputs_and_shared_persists_across_runs(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    counter = remote_tempdir(sshd) / "counter"
    jobs = SETUP_JOBS.replace("    setup:", f"    env: {{SETUP_COUNTER: {counter}}}\n    setup:")
    proj = _project(tmp_path, sshd, workdir, jobs=jobs, files={"prep.sh": PREP_SH.format(version=1)})
    seen = []
    for _ in range(2):
        res = cli("train", "prepared", "--json", cwd=proj)
        assert res.returncode == 0, res.stderr
        seen.append((Path(json.loads(res.stdout)["run_dir"]) / "seen").read_text())
    assert counter.read_text() == "ran\n"  # the second run got the kept outputs
    assert seen == ["prepared by 1\n1\n", "prepared by 1\n1\n"]  # shared/ is the setup's, made once
    (proj / "prep.sh").write_text(PREP_SH.format(version=2))
    commit(proj, "another setup", "prep.sh")
    res = cli("train", "prepared", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    assert counter.read_text() == "ran\nran\n"  # its input changed: it ran again
    assert (Path(json.loads(res.stdout)["run_dir"]) / "seen").read_text() == "prepared by 2\n2\n"
    assert (workdir / ".thrust" / "shared" / "shared" / "count").read_text() == "2\n"  # one directory, kept
    (proj / "prep.sh").write_text("echo 'no data here' >&2\nexit 7\n")
    commit(proj, "a broken setup", "prep.sh")
    broken = cli("train", "prepared", cwd=proj)
    assert broken.returncode == ExitCode.FAILED and "no data here" in broken.stderr, broken.stderr
    assert "nothing was launched" in broken.stderr and "launching run" not in broken.stderr


def test_a_shared_path_the_commit_has_files_under_is_refused(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    jobs = JOBS + "    shared: [ckpt/]\n"
    proj = _project(tmp_path, sshd, workdir, jobs=jobs, files={"ckpt/README": "tracked\n"})
    res = cli("train", "gated", "--detach", cwd=proj)
    assert res.returncode == ExitCode.CONFIG and "ckpt holds files of the commit (ckpt/README)" in res.stderr
    assert re.search(r":\d+: jobs\.gated\.shared", res.stderr), res.stderr


def test_keep_and_prune_reclaim_ended_runs_trees_never_a_running_ones(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = _project(tmp_path, sshd, workdir, hosts_extra="    keep: {runs: 1}\n")
    ended = []
    for _ in range(2):
        run = _detach(cli, proj)
        _release(Path(run["run_dir"]))
        wait_until(lambda r=run: _state(cli, proj, r["run_id"])["state"] == "FINISHED", 60, "a run to end")
        ended.append(run)
    trees = workdir / ".thrust" / "trees"
    running = _detach(cli, proj)  # its launch applies keep: {runs: 1}: the oldest ended tree goes
    assert sorted(p.name for p in trees.iterdir()) == sorted([ended[1]["run_id"], running["run_id"]])
    listed = {r["run_id"]: r for r in json.loads(cli("runs", "--json", cwd=proj).stdout)}
    assert listed[ended[0]["run_id"]]["tree_kept"] is False and listed[running["run_id"]]["tree_kept"] is True
    dry = cli("prune", "--keep", "0", "--dry-run", "--json", cwd=proj)
    assert dry.returncode == 0, dry.stderr
    gone = [t for t in json.loads(dry.stdout)["trees"] if "removed" in t]
    assert [t["runs"] for t in gone] == [[ended[1]["run_id"]]] and (trees / ended[1]["run_id"]).is_dir()
    done = cli("prune", "--keep", "0", cwd=proj)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in trees.iterdir()) == [running["run_id"]]  # the running run's stays
    assert _state(cli, proj, running["run_id"])["state"] == "RUNNING"
    _release(Path(running["run_dir"]))


def test_a_host_whose_disk_cannot_take_a_tree_is_refused_before_the_sync(cli, sshd, tmp_path):
    if sshd.tmpfs is None:
        pytest.skip("no tmpfs of the test's own: mounting needs root (make test runs as root in CI)")
    workdir = Path(subprocess.run(["mktemp", "-d", "-p", str(sshd.tmpfs)], capture_output=True, text=True,
                                  check=True).stdout.strip()) / "w"
    proj = _project(tmp_path, sshd, workdir, files={"big.bin": os.urandom(3 << 20).hex()})  # ~6 MB of code
    free = os.statvfs(sshd.tmpfs).f_bavail * os.statvfs(sshd.tmpfs).f_frsize
    fill = sshd.tmpfs / f"fill-{os.getpid()}"
    try:
        with fill.open("wb") as fh:  # leave ~8 MB: less than the tree and the margin
            os.posix_fallocate(fh.fileno(), 0, max(1, free - (8 << 20)))
        res = cli("train", "gated", "--detach", cwd=proj)
        assert res.returncode == ExitCode.UNAVAILABLE, res.stderr
        assert re.search(r"has \d+ MB free; the run's tree needs about \d+ MB", res.stderr), res.stderr
        assert "thrust-remote prune --host sandbox" in res.stderr
        assert not (workdir / ".git").exists()  # refused before anything was written
    finally:
        fill.unlink(missing_ok=True)
    res = cli("train", "gated", "--detach", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    _release(Path(json.loads(res.stdout)["run_dir"]))


def test_the_local_host_runs_in_the_project_and_runs_its_setup_once(cli, tmp_path):
    proj = tmp_path / "p"
    proj.mkdir()
    (proj / "prep.sh").write_text('echo ran >> count\n')
    (proj / "thrust.yaml").write_text("default_host: local\njobs:\n  j:\n    kind: command\n"
                                      "    command: [sh, -c, 'pwd > where']\n    setup: [sh, prep.sh]\n")
    git(proj, "init", "-q")
    git(proj, "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A")
    git(proj, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "p")
    for _ in range(2):
        res = subprocess.run([EXE, "train", "j"], cwd=proj, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
    assert (proj / "where").read_text().strip() == str(proj.resolve())  # no tree: the project itself
    assert (proj / "count").read_text() == "ran\n"


OWN = """\
import argparse, json, os, time
p = argparse.ArgumentParser()
p.add_argument("--resume-from")
a = p.parse_args()
start = json.load(open(a.resume_from))["step"] if a.resume_from else 0
seen = {"data": open("data/in.txt").read(), "prepared": open("out/prepared.txt").read(), "start": start}
with open(os.path.join(os.environ["THRUST_RUN_DIR"], "seen.json"), "w") as fh:
    json.dump(seen, fh)
os.makedirs("ckpt", exist_ok=True)
step = start
while step < start + (10 if start else 10**6):
    step += 1
    with open("ckpt/.tmp", "w") as fh:
        json.dump({"step": step}, fh)
    os.replace("ckpt/.tmp", "ckpt/state.json")
    print(f'THRUST_METRICS {{"step": {step}}}', flush=True)
    time.sleep(0.05)
"""


@pytest.fixture
def host_a(tmp_path):
    from conftest import _start_sshd

    server = _start_sshd(tmp_path / "host-a")
    yield server
    server.stop()


def test_resume_on_a_fresh_host_brings_its_files_and_runs_its_setup_there(cli, sshd, host_a, tmp_path):
    """A run with `files:` and `setup:` on host a, its checkpoint pulled, then `resume --host b` onto a host
    that has never seen the project: the files go to b, the setup runs on b, the run goes on from the
    checkpoint with both."""
    counter = remote_tempdir(sshd) / "counter"  # every setup's line (a and b are accounts of this machine)
    jobs = ("jobs:\n  own:\n    script: train.py\n    checkpoints: ckpt/*.json\n"
            "    resume: [--resume-from, '{checkpoint}']\n    files: [data/in.txt]\n    setup: [sh, prep.sh]\n"
            f"    env: {{SETUP_COUNTER: {counter}}}\n")
    prep = 'echo ran >> "$SETUP_COUNTER"\nmkdir -p out && echo "prepared on $(hostname)" > out/prepared.txt\n'
    workdir_b = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir_b, jobs=jobs,
                       files={"train.py": OWN, "prep.sh": prep, ".gitignore": "data/\n"})
    (proj / "data").mkdir()
    (proj / "data" / "in.txt").write_text("input, not in git\n")
    a = host_a.host_config("a")
    cfg = proj / "thrust.yaml"
    cfg.write_text(cfg.read_text().replace("default_host: sandbox\n", "default_host: a\n").replace(
        "hosts:\n", f"hosts:\n  a:\n    address: {a.address}\n    workdir: {a.workdir}\n    python: {a.python}\n"
                    f"    identity: {a.identity}\n    known_hosts: {a.known_hosts}\n    connect_timeout: 5\n", 1))
    commit(proj, "two hosts", "thrust.yaml")
    started = _detach(cli, proj, "own")
    run_id = started["run_id"]
    wait_until(lambda: json.loads(cli("fetch", run_id, "--json", cwd=proj).stdout)["checkpoint"]["newest"], 120,
               "a checkpoint of the run on a, pulled")
    assert cli("stop", run_id, cwd=proj).returncode == 0
    assert counter.read_text() == "ran\n"  # on a
    resumed = cli("resume", run_id, "--host", "sandbox", "--json", cwd=proj)
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    assert out["state"] == "FINISHED" and out["host"] == "sandbox"
    seen = json.loads((workdir_b / ".thrust" / "runs" / out["run_id"] / "seen.json").read_text())
    assert seen["data"] == "input, not in git\n" and seen["prepared"].startswith("prepared on")
    assert seen["start"] > 0  # it went on from the pulled checkpoint
    assert counter.read_text() == "ran\nran\n"  # and on b, in the resumed run's tree
