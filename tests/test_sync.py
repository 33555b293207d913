"""sync on its own (LocalRunner as the host's runner; the host is a separate directory): the commit's
objects into the host's store and a tree of its own per run (docs/architecture.md, "Trees"): rewritten
history (amend) syncs again; the dirty patch is one tree's and not the next's; trees of other code, a
running run's, are never changed by a later sync, and a hand edit in one tree is not the next tree's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import commit, git, git_init, sync_tree

from thrust_remote.core.config import HostConfig
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run.sync import local_state


def _session(paths: HostPaths) -> HostSession:
    return HostSession(LocalRunner(), HostConfig(name="local", python=sys.executable), paths)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = git_init(tmp_path / "laptop")
    (repo / "a.txt").write_text("one\n")
    commit(repo, "one", "a.txt")
    return repo


def test_amended_commit_syncs_again_by_bundle(repo, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    first, _ = sync_tree(_session(host), local_state(repo), "t1")
    assert first.method == "bundle"
    (repo / "a.txt").write_text("one, amended\n")
    git(repo, "commit", "-q", "--amend", "-am", "amended")  # history rewritten: not a fast-forward
    second, tree = sync_tree(_session(host), local_state(repo), "t2")
    assert second.method == "bundle"
    assert git(tree, "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
    assert (tree / "a.txt").read_text() == "one, amended\n"


def test_a_dirty_patch_is_its_trees_and_not_the_next_clean_ones(repo, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    (repo / "a.txt").write_text("dirty\n")
    (repo / "new.txt").write_text("added, staged\n")
    git(repo, "add", "new.txt")
    result, dirty = sync_tree(_session(host), local_state(repo), "t1")
    assert result.dirty
    assert (dirty / "a.txt").read_text() == "dirty\n"
    assert (dirty / "new.txt").read_text() == "added, staged\n"
    git(repo, "checkout", "-q", "--", "a.txt")
    git(repo, "rm", "-q", "--cached", "new.txt")
    (repo / "new.txt").unlink()
    clean, tree = sync_tree(_session(host), local_state(repo), "t2")
    assert not clean.dirty and clean.method == "up-to-date"  # the commit's objects are there already
    assert (tree / "a.txt").read_text() == "one\n"
    assert not (tree / "new.txt").exists()
    assert (dirty / "a.txt").read_text() == "dirty\n"  # the first run's tree is as it was


def test_a_later_sync_of_other_code_never_changes_an_earlier_tree(repo, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    _, running = sync_tree(_session(host), local_state(repo), "t1")
    before = git(running, "rev-parse", "HEAD")
    (repo / "a.txt").write_text("two\n")
    git(repo, "commit", "-q", "-am", "two")
    _, later = sync_tree(_session(host), local_state(repo), "t2")
    assert git(running, "rev-parse", "HEAD") == before and (running / "a.txt").read_text() == "one\n"
    assert (later / "a.txt").read_text() == "two\n"
    assert not (Path(host.workdir) / "a.txt").exists()  # the workdir holds the objects, not a checkout


def test_a_hand_edit_in_one_tree_is_not_the_next_trees(repo, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    _, first = sync_tree(_session(host), local_state(repo), "t1")
    (first / "a.txt").write_text("edited on the host\n")
    result, second = sync_tree(_session(host), local_state(repo), "t2")
    assert result.method == "up-to-date"
    assert (second / "a.txt").read_text() == "one\n"
