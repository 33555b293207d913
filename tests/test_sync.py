"""sync on its own (LocalRunner as the host's runner; the host is a separate directory): rewritten
history (amend) syncs again; the dirty patch comes and goes; a busy workdir is not changed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import commit, git, git_init

from thrust_remote.core.config import HostConfig
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run.sync import local_state, sync


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
    first = sync(_session(host), local_state(repo))
    assert first.method == "bundle"
    (repo / "a.txt").write_text("one, amended\n")
    git(repo, "commit", "-q", "--amend", "-am", "amended")  # history rewritten: not a fast-forward
    second = sync(_session(host), local_state(repo))
    assert second.method == "bundle"
    assert git(Path(host.workdir), "rev-parse", "HEAD") == git(repo, "rev-parse", "HEAD")
    assert (Path(host.workdir) / "a.txt").read_text() == "one, amended\n"


def test_dirty_patch_applies_and_the_next_clean_sync_removes_it(repo, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    (repo / "a.txt").write_text("dirty\n")
    (repo / "new.txt").write_text("added, staged\n")
    git(repo, "add", "new.txt")
    result = sync(_session(host), local_state(repo))
    assert result.dirty
    assert (Path(host.workdir) / "a.txt").read_text() == "dirty\n"
    assert (Path(host.workdir) / "new.txt").read_text() == "added, staged\n"
    git(repo, "checkout", "-q", "--", "a.txt")
    git(repo, "rm", "-q", "--cached", "new.txt")
    (repo / "new.txt").unlink()
    clean = sync(_session(host), local_state(repo))
    assert not clean.dirty
    assert (Path(host.workdir) / "a.txt").read_text() == "one\n"
    assert not (Path(host.workdir) / "new.txt").exists()


def test_unchanged_tree_is_left_alone_and_a_busy_workdir_is_never_changed(repo, tmp_path):
    from thrust_remote.core.errors import ThrustError

    host = HostPaths(str(tmp_path / "host"))
    sync(_session(host), local_state(repo))
    again = sync(_session(host), local_state(repo), busy=lambda: ["run-1"])
    assert again.method == "up-to-date"  # nothing to change: a running job is no obstacle
    before = git(Path(host.workdir), "rev-parse", "HEAD")
    (repo / "a.txt").write_text("two\n")
    git(repo, "commit", "-q", "-am", "two")
    with pytest.raises(ThrustError, match="in use by running or queued run") as one:
        sync(_session(host), local_state(repo), busy=lambda: ["run-1"])
    assert "wait for it to end (thrust-remote wait run-1 --host" in one.value.hint
    with pytest.raises(ThrustError) as two:  # one running, one queued behind it: stopping the first is not enough
        sync(_session(host), local_state(repo), busy=lambda: ["run-1", "run-2"])
    assert "wait for them all to end: thrust-remote wait run-1 run-2 --host" in two.value.hint
    assert "stop run-1 --host" in two.value.hint and "stop run-2 --host" in two.value.hint
    assert git(Path(host.workdir), "rev-parse", "HEAD") == before
    assert (Path(host.workdir) / "a.txt").read_text() == "one\n"


def test_a_hand_edit_on_the_host_is_put_back(repo, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    sync(_session(host), local_state(repo))
    (Path(host.workdir) / "a.txt").write_text("edited on the host\n")
    result = sync(_session(host), local_state(repo))
    assert result.method == "up-to-date"
    assert (Path(host.workdir) / "a.txt").read_text() == "one\n"
