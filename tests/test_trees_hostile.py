"""A run's tree against a hostile commit and against its own reclaiming (issue 51; docs/architecture.md,
"Trees", "Security"), over a real sshd, with a real non-root account where the attack aims at the
account's home:

- a `shared:` path under a symlink the commit tracks is refused, and the host directory the link
  points at is left as it was (it was removed and replaced by a link);
- kept `setup:` outputs are never placed through a symlink a later commit tracks: the setup runs again;
- a run's own `keep:` never removes the tree of the run just launched, before its train fetched it;
- `prune` and another launch's `keep:` never remove a tree still being set up;
- a fetch of a run whose tree was removed says so, and fails when nothing could be fetched;
- a laptop file of mode 000 is stored readable by the account, and a store object the account cannot
  read is sent again, never a dead end.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from pathlib import Path

from helpers import GATED_SETUP, commit, new_project, remote_tempdir, throwaway_account, wait_until

from thrust_remote.core.errors import ExitCode

QUICK = """\
jobs:
  quick:
    kind: command
    command: [sh, -c, 'cat out/note.txt > "$THRUST_RUN_DIR/seen" 2>/dev/null; true']
"""


def _as(sshd, account: str, workdir: Path, tmp_path: Path, jobs: str, files: dict | None = None) -> Path:
    """A project whose host `sandbox` is this sshd as `account` (python the system's), workdir `workdir`."""
    proj = new_project(tmp_path / "project", sshd, tmp_path / "unused", jobs=jobs, python="/usr/bin/python3",
                       files=files)
    cfg = proj / "thrust.yaml"
    text = re.sub(r"address: \w+@", f"address: {account}@", cfg.read_text())
    cfg.write_text(re.sub(r"workdir: .*", f"workdir: {workdir}", text, count=1))
    commit(proj, "the account's host", "thrust.yaml")
    return proj


def _owned(home: Path, rel: str, account: str, text: str | None = None) -> Path:
    """HOME/REL, a directory (or, with `text`, a file) of the account's own, as its home's files are."""
    path = home / rel
    if text is None:
        path.mkdir(parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o644)
    for p in [path, *path.relative_to(home).parents][:-1]:
        os.chown(home / p if p != path else p, *_ids(account))
    return path


def _ids(account: str) -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam(account)
    return entry.pw_uid, entry.pw_gid


def test_a_shared_path_under_a_tracked_symlink_is_refused_and_the_host_directory_stays(cli, sshd, tmp_path):
    with throwaway_account(sshd) as (owner, home):
        cache = _owned(home, "datasets/cache", owner)
        _owned(home, "datasets/cache/precious.bin", owner, "PRECIOUS\n")
        proj = _as(sshd, owner, home / "thrust", tmp_path, QUICK + "    shared: [data/cache]\n")
        os.symlink(home / "datasets", proj / "data")  # the commit points `data` at the account's datasets
        commit(proj, "data is a link", "data")
        res = cli("train", "quick", cwd=proj)
        assert res.returncode == ExitCode.CONFIG, res.stderr
        assert "data/cache" in res.stderr and "outside the run's tree" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr
        assert cache.is_dir() and not cache.is_symlink(), "the host directory was replaced"
        assert (cache / "precious.bin").read_text() == "PRECIOUS\n"
        assert sorted(p.name for p in (home / "datasets").iterdir()) == ["cache"]


SETUP = """\
jobs:
  quick:
    kind: command
    command: [sh, -c, 'cat out/note.txt > "$THRUST_RUN_DIR/seen"']
    setup: [sh, prep.sh]
"""
PREP = "mkdir -p out\n[ -e out/note.txt ] || echo 'prepared' > out/note.txt\n"  # a setup that keeps what is there


def test_kept_setup_outputs_are_never_placed_through_a_symlink_a_later_commit_tracks(cli, sshd, tmp_path):
    with throwaway_account(sshd) as (owner, home):
        note = _owned(home, "victim/note.txt", owner, "PRECIOUS\n")
        proj = _as(sshd, owner, home / "thrust", tmp_path, SETUP, files={"prep.sh": PREP})
        first = cli("train", "quick", "--json", cwd=proj)
        assert first.returncode == 0, first.stderr
        assert (Path(json.loads(first.stdout)["run_dir"]) / "seen").read_text() == "prepared\n"
        os.symlink(home / "victim", proj / "out")  # commit B: the same setup, `out` a link to the account's dir
        commit(proj, "out is a link", "out")
        second = cli("train", "quick", "--json", cwd=proj)
        assert second.returncode == 0, second.stderr
        st = note.lstat()
        assert note.read_text() == "PRECIOUS\n" and st.st_nlink == 1 and stat.S_IMODE(st.st_mode) == 0o644, (
            note.read_text(), st.st_nlink, oct(st.st_mode))
        assert sorted(p.name for p in note.parent.iterdir()) == ["note.txt"]
        assert "outputs for these inputs are kept on the host: placed" not in second.stderr  # it ran again
        third = cli("train", "quick", "--json", cwd=proj)  # and commit B's run left the kept outputs as they were
        assert third.returncode == 0, third.stderr
        assert note.read_text() == "PRECIOUS\n" and note.lstat().st_nlink == 1


ARTIFACTS = """\
jobs:
  outs:
    kind: command
    command: [sh, -c, 'mkdir -p out && echo made > out/result.txt']
    artifacts: [out/**]
"""


def _workdir_project(sshd, tmp_path: Path, jobs: str, hosts_extra: str = "", files: dict | None = None,
                     ) -> tuple[Path, Path]:
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=jobs, files=files)
    if hosts_extra:
        cfg = proj / "thrust.yaml"
        cfg.write_text(cfg.read_text().replace("    connect_timeout: 5\n", "    connect_timeout: 5\n" + hosts_extra, 1))
        commit(proj, "host settings", "thrust.yaml")
    return proj, workdir


def _launched(res) -> str:
    found = re.search(r"launching run (\S+)", res.stderr)
    assert found, res.stderr
    return found.group(1)


def test_a_runs_own_keep_zero_never_removes_its_tree_before_its_fetch(cli, sshd, tmp_path):
    proj, workdir = _workdir_project(sshd, tmp_path, ARTIFACTS, "    keep: {runs: 0}\n")
    trees = workdir / ".thrust" / "trees"
    first = cli("train", "outs", cwd=proj)  # not --json: its steps (keep:'s among them) are on stderr
    assert first.returncode == 0, first.stderr
    run_id = _launched(first)
    assert "removed the trees of" not in first.stderr and "matches nothing" not in first.stderr, first.stderr
    got = proj / ".thrust" / "fetched" / run_id / "artifacts" / "out" / "result.txt"
    assert got.read_text() == "made\n"
    second = cli("train", "outs", cwd=proj)  # its launch's keep: the first, fetched, goes now
    assert second.returncode == 0, second.stderr
    later = _launched(second)
    assert (proj / ".thrust" / "fetched" / later / "artifacts" / "out" / "result.txt").read_text() == "made\n"
    assert f"removed the trees of {run_id} ({run_id}; fetched)" in second.stderr, second.stderr
    assert f"removed the trees of {later}" not in second.stderr
    assert sorted(p.name for p in trees.iterdir()) == [later]


def test_prune_and_another_launchs_keep_never_remove_a_tree_still_being_set_up(cli, sshd, tmp_path):
    gate = remote_tempdir(sshd) / "gate"
    proj, workdir = _workdir_project(sshd, tmp_path, GATED_SETUP.format(gate=gate), "    keep: {runs: 0}\n")
    trees = workdir / ".thrust" / "trees"
    outcome: dict = {}
    training = threading.Thread(target=lambda: outcome.update(res=cli("train", "gated", "--json", cwd=proj)))
    training.start()
    try:
        wait_until(lambda: Path(f"{gate}.waiting").exists(), 120, "the first train's setup to start")
        setting_up = [p.name for p in trees.iterdir()]
        assert len(setting_up) == 1
        pruned = cli("prune", "--keep", "0", "--json", cwd=proj)
        assert pruned.returncode == 0, pruned.stderr
        assert (trees / setting_up[0]).is_dir(), "prune removed a tree still being set up"
        other = cli("train", "quick", "--json", cwd=proj)  # its launch applies keep: {runs: 0}
        assert other.returncode == 0, other.stderr
        assert (trees / setting_up[0]).is_dir(), "another launch's keep removed a tree still being set up"
    finally:
        gate.touch()
        training.join(300)
    res = outcome["res"]
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)
    assert run["run_id"] == setting_up[0] and (Path(run["run_dir"]) / "seen").read_text() == "ran\n"


def test_a_fetch_of_a_run_whose_tree_was_pruned_says_so_and_fails(cli, sshd, tmp_path):
    proj, workdir = _workdir_project(sshd, tmp_path, ARTIFACTS)
    res = cli("train", "outs", "--detach", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    run_id = json.loads(res.stdout)["run_id"]
    wait_until(lambda: json.loads(cli("status", run_id, "--json", cwd=proj).stdout)["state"] == "FINISHED", 60,
               "the run to finish")
    pruned = cli("prune", "--keep", "0", cwd=proj)
    assert pruned.returncode == 0 and f"removed {run_id}" in pruned.stdout, (pruned.stdout, pruned.stderr)
    fetched = cli("fetch", run_id, cwd=proj)
    assert fetched.returncode == ExitCode.UNAVAILABLE, fetched.stderr
    assert re.search(rf"the tree of run {run_id} on sandbox was removed by prune at \S+", fetched.stderr), \
        fetched.stderr
    assert "run directory" in fetched.stderr and "Traceback" not in fetched.stderr
    assert fetched.stderr.count("was removed by prune") == 1, fetched.stderr  # said once, not three times


READER = """\
jobs:
  reader:
    kind: command
    command: [sh, -c, 'cat data/blob.bin > "$THRUST_RUN_DIR/seen"']
    files: [data/blob.bin]
"""


def test_a_laptop_file_of_mode_000_is_stored_readable_and_an_unreadable_object_is_sent_again(cli, sshd, tmp_path):
    with throwaway_account(sshd) as (owner, home):
        workdir = home / "thrust"
        proj = _as(sshd, owner, workdir, tmp_path, READER, files={".gitignore": "data/\n"})
        blob = proj / "data" / "blob.bin"
        blob.parent.mkdir()
        blob.write_text("blob content\n")
        blob.chmod(0)  # the laptop's user is root here: it still reads it
        first = cli("train", "reader", "--json", cwd=proj)
        assert first.returncode == 0, first.stderr
        assert (Path(json.loads(first.stdout)["run_dir"]) / "seen").read_text() == "blob content\n"
        objects = [p for p in (workdir / ".thrust" / "store").rglob("*") if p.is_file() and p.suffix != ".stat"]
        assert len(objects) == 1 and stat.S_IMODE(objects[0].stat().st_mode) == 0o400, objects
        # an object as an older version stored it: mode 000, never sealed
        objects[0].chmod(0)
        Path(f"{objects[0]}.stat").unlink()
        blob.chmod(0o644)
        again = cli("train", "reader", "--json", cwd=proj)
        assert again.returncode == 0, again.stderr
        assert (Path(json.loads(again.stdout)["run_dir"]) / "seen").read_text() == "blob content\n"
        assert stat.S_IMODE(objects[0].stat().st_mode) == 0o400


def test_concurrent_quick_trains_under_keep_one_all_launch_in_their_trees(cli, sshd, tmp_path):
    """Four trains at once, each launch applying keep: {runs: 1}: another's tree between its tree-add
    and its launch is never removed (it failed "could not launch bash: No such file or directory")."""
    proj, workdir = _workdir_project(sshd, tmp_path, ARTIFACTS, "    keep: {runs: 1}\n")
    assert cli("train", "outs", cwd=proj).returncode == 0  # the host set up once: the four race on trees only
    results: list = [None] * 4

    def one(i: int) -> None:
        results[i] = cli("train", "outs", "--no-fetch", cwd=proj)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for res in results:
        assert res is not None and res.returncode == 0, res.stderr if res else "no result"
        assert "No such file or directory" not in res.stderr, res.stderr
