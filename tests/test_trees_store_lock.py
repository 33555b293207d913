"""A run's tree and the store's lock (thrust_remote/agent/trees.py, agent/checkout.py `store_lock`; issue 51):
a receive's fetch reads every worktree's admin files, which `git worktree add` writes one by one and `git
worktree prune` removes, so both are made under the lock the receive holds. Real git, the agent's own
`tree-add`/`tree-remove` run as processes of their own, the lock held here as a receive holds it:

- a tree-add waits for a receive under way before it writes the worktree's records, then completes;
- a tree-remove's worktree prune waits the same, the tree's files going before;
- the lock is not held while the tree's files are checked out (a big tree keeps no receive waiting):
  a smudge filter run by that checkout finds it free.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import commit, git, git_init, wait_until

from thrust_remote.agent.checkout import STORE_LOCK, store_lock


@pytest.fixture
def store(tmp_path: Path) -> tuple[Path, str]:
    """A workdir that is a git store with one commit; (workdir, commit)."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "code.py").write_text("v = 1\n")
    git_init(work)
    commit(work, "v1")
    return work, git(work, "rev-parse", "HEAD")


def _agent(*args: str) -> subprocess.Popen:
    """The agent's subcommand in a process of its own, as the host runs it (its stdin: `{}`, given whole)."""
    proc = subprocess.Popen([sys.executable, "-m", "thrust_remote.agent", *args], text=True, cwd="/",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write("{}")
    proc.stdin.close()
    proc.stdin = None  # given: communicate() reads only
    return proc


def _holds_open(proc: subprocess.Popen, path: Path) -> bool:
    """The process has `path` open: it has reached the lock (it opens the file, then waits for its flock).
    Raises once the process has ended: whatever it did, it did not wait for the lock."""
    if proc.poll() is not None:
        out, err = proc.communicate()
        raise AssertionError(f"the agent ended (exit {proc.returncode}) without waiting for the store's lock: "
                             f"{out}{err}")
    fds = Path(f"/proc/{proc.pid}/fd")
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == str(path):
                return True
        except OSError:
            continue
    return False


def test_a_tree_add_waits_for_a_receive_under_way_before_it_writes_the_worktree_records(store):
    work, head = store
    tree = work / ".thrust" / "trees" / "r1"
    lock = work / ".git" / STORE_LOCK
    with store_lock(str(work)):  # a receive's fetch under way
        adding = _agent("tree-add", "--workdir", str(work), "--tree", str(tree), "--commit", head, "--ref", "r1",
                        "--stdin")
        try:
            wait_until(lambda: _holds_open(adding, lock), 60, "the tree-add to reach the store's lock")
            assert not (work / ".git" / "worktrees").exists(), "worktree records written during a receive"
            assert git(work, "for-each-ref", "refs/thrust/trees/") == ""
        except BaseException:
            adding.kill()
            adding.wait()
            raise
    out, err = adding.communicate(timeout=60)
    assert adding.returncode == 0, err
    assert json.loads(out)["head"] == head
    assert (tree / "code.py").read_text() == "v = 1\n"
    assert git(tree, "status", "--porcelain") == ""  # checked out in full after the records
    assert git(work, "rev-parse", "refs/thrust/trees/r1") == head


def test_a_tree_removes_worktree_prune_waits_for_a_receive_under_way(store):
    work, head = store
    tree = work / ".thrust" / "trees" / "r1"
    added = _agent("tree-add", "--workdir", str(work), "--tree", str(tree), "--commit", head, "--stdin")
    out, err = added.communicate(timeout=60)
    assert added.returncode == 0, err
    records = work / ".git" / "worktrees" / "r1"
    assert records.is_dir()
    lock = work / ".git" / STORE_LOCK
    with store_lock(str(work)):
        removing = _agent("tree-remove", "--workdir", str(work), "--tree", str(tree))
        try:
            wait_until(lambda: _holds_open(removing, lock), 60, "the tree-remove to reach the store's lock")
            assert not tree.exists(), "the tree's files go before the lock is asked for"
            assert records.is_dir(), "the worktree records were pruned during a receive"
        except BaseException:
            removing.kill()
            removing.wait()
            raise
    out, err = removing.communicate(timeout=60)
    assert removing.returncode == 0, err
    assert json.loads(out) == {"removed": True}
    assert not records.exists()


def test_the_store_lock_is_free_while_the_trees_files_are_checked_out(store, tmp_path):
    work, _ = store
    seen = tmp_path / "seen"
    lock = work / ".git" / STORE_LOCK
    # what a receive would do meanwhile: take the lock (flock -n: at once or not at all); run by the
    # checkout of each file under filter=probe
    probe = f"flock -n {lock} true && echo free >> {seen} || echo held >> {seen}; cat"
    git(work, "config", "filter.probe.smudge", probe)
    git(work, "config", "filter.probe.clean", "cat")
    (work / ".gitattributes").write_text("*.txt filter=probe\n")
    (work / "big.txt").write_text("a file of the tree\n")
    commit(work, "a filtered file", ".gitattributes", "big.txt")
    head = git(work, "rev-parse", "HEAD")
    seen.unlink(missing_ok=True)  # the commit's own checkout of the index may have run the filter
    adding = _agent("tree-add", "--workdir", str(work), "--tree", str(work / ".thrust" / "trees" / "r2"),
                    "--commit", head, "--stdin")
    out, err = adding.communicate(timeout=60)
    assert adding.returncode == 0, err
    assert (work / ".thrust" / "trees" / "r2" / "big.txt").read_text() == "a file of the tree\n"
    assert seen.read_text().split() == ["free"], "the store's lock was held while the files were checked out"
