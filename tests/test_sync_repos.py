"""sync with the repositories users really have (docs/architecture.md, "Sync"): a shallow clone with a
commit of its own and a superproject whose submodule has a dirty change (both trained over a real
sshd); an object store missing a blob, or a partial clone whose promisor is gone (the tree goes alone,
or a clear error naming the file); Git LFS files (content, never the pointer; refused naming them, by
train too, when the laptop has only the pointer)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import commit, git, git_init, new_project, remote_tempdir, run_tree, sync_tree

from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import repo as repo_mod
from thrust_remote.run.sync import UNREADABLE, local_state, sync

# a command job that records what it read from the checkout
JOBS = """\
jobs:
  show:
    kind: command
    command: [sh, -c, "cat {path} > \\"$THRUST_RUN_DIR/seen.txt\\""]
"""


def _session(paths: HostPaths) -> HostSession:
    return HostSession(LocalRunner(), HostConfig(name="local", python=sys.executable), paths)


def _train(cli, project: Path, workdir: Path) -> dict:
    """`train show` in `project`: run.json of the run (the job must have succeeded)."""
    result = cli("train", "show", cwd=project)
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"launching run (\S+)", result.stderr).group(1)
    run_dir = workdir / ".thrust" / "runs" / run_id
    return {**json.loads((run_dir / "run.json").read_text()), "seen": (run_dir / "seen.txt").read_text()}


def _loose(repo: Path, sha: str) -> Path:
    return repo / ".git" / "objects" / sha[:2] / sha[2:]


# ------------------------------------------------------------------------------------------ shallow


def test_a_shallow_clone_with_a_commit_of_its_own_syncs_and_runs(sshd, cli, tmp_path):
    workdir = remote_tempdir(sshd)
    upstream = new_project(tmp_path / "upstream", sshd, workdir, files={"old.txt": "old\n"},
                           jobs=JOBS.format(path="mine.txt"))
    (upstream / "old.txt").write_text("newer\n")
    commit(upstream, "a second upstream commit: the clone's boundary has a parent")
    laptop = tmp_path / "laptop"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{upstream}", str(laptop)], check=True)
    git(laptop, "remote", "remove", "origin")  # the host cannot reach where it came from
    git(laptop, "config", "user.email", "t@example.com")
    git(laptop, "config", "user.name", "t")
    (laptop / "mine.txt").write_text("a commit of my own\n")
    commit(laptop, "mine", "mine.txt")

    meta = _train(cli, laptop, workdir)
    assert meta["seen"] == "a commit of my own\n"
    assert (meta["commit"], meta["sync"], meta["shallow"]) == (git(laptop, "rev-parse", "HEAD"), "shallow-bundle", True)
    assert git(workdir, "rev-parse", "--is-shallow-repository") == "true"  # its history stops where ours does


def test_a_second_commit_on_a_shallow_clone_is_a_plain_bundle(tmp_path):
    upstream = git_init(tmp_path / "upstream")
    for n in (1, 2):
        (upstream / "f.txt").write_text(f"{n}\n")
        commit(upstream, f"c{n}")
    laptop = tmp_path / "laptop"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{upstream}", str(laptop)], check=True)
    git(laptop, "remote", "remove", "origin")
    host = HostPaths(str(tmp_path / "host"))
    assert sync_tree(_session(host), local_state(laptop), "t1")[0].method == "shallow-bundle"
    (laptop / "f.txt").write_text("3\n")
    git(laptop, "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qam", "c3")
    again, tree = sync_tree(_session(host), local_state(laptop), "t2")
    assert (again.method, again.shallow) == ("bundle", True)  # the host has the boundary now
    assert (tree / "f.txt").read_text() == "3\n"


# ------------------------------------------------------------------------------------------ submodules


def _submodule_add(superproject: Path, url: Path, path: str) -> None:
    git(superproject, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(url), path)


def test_a_submodule_with_a_dirty_change_arrives_exact(sshd, cli, tmp_path):
    workdir = remote_tempdir(sshd)
    lib = git_init(tmp_path / "lib")
    (lib / "lib.txt").write_text("lib, committed\n")
    commit(lib, "lib")
    project = new_project(tmp_path / "project", sshd, workdir, jobs=JOBS.format(path="vendor/lib/lib.txt"))
    _submodule_add(project, lib, "vendor/lib")
    commit(project, "the lib as a submodule")
    sub = project / "vendor" / "lib"
    (sub / "lib.txt").write_text("lib, edited here and not committed\n")

    meta = _train(cli, project, workdir)
    assert meta["seen"] == "lib, edited here and not committed\n"
    recorded = meta["submodules"]["vendor/lib"]
    in_tree = run_tree(workdir, meta["run_id"]) / "vendor/lib"  # a worktree of the submodule's own store
    assert recorded["commit"] == git(sub, "rev-parse", "HEAD") == git(in_tree, "rev-parse", "HEAD")
    assert recorded["dirty"] and recorded["patch_sha256"]
    assert not meta["dirty"]  # the superproject's own tree is clean: the edit is the submodule's


def test_nested_submodules_follow_the_laptop_and_an_uninitialized_one_is_named(tmp_path):
    inner = git_init(tmp_path / "inner")
    (inner / "i.txt").write_text("inner\n")
    commit(inner, "inner")
    outer = git_init(tmp_path / "outer")
    (outer / "o.txt").write_text("outer\n")
    commit(outer, "outer")
    _submodule_add(outer, inner, "in")
    commit(outer, "inner inside")
    top = git_init(tmp_path / "top")
    (top / "t.txt").write_text("top\n")
    commit(top, "top")
    _submodule_add(top, outer, "out")
    _submodule_add(top, inner, "skipped")
    commit(top, "two submodules")
    git(top, "-c", "protocol.file.allow=always", "submodule", "-q", "update", "--init", "--recursive", "out")
    git(top, "submodule", "-q", "deinit", "skipped")
    (top / "out" / "in" / "i.txt").write_text("inner, dirty two levels down\n")
    git(top / "out", "remote", "remove", "origin")  # one the host cannot clone: it gets a bundle


    host = HostPaths(str(tmp_path / "host"))
    result, tree = sync_tree(_session(host), local_state(top), "t1")
    assert (tree / "out" / "in" / "i.txt").read_text() == "inner, dirty two levels down\n"
    assert (tree / "out" / "o.txt").read_text() == "outer\n" and list((tree / "skipped").iterdir()) == []
    assert result.submodules["out"].method == "bundle" and result.submodules["out"].submodules["in"].dirty
    assert any("skipped" in w and "submodule update --init" in w for w in result.warnings)
    again, _ = sync_tree(_session(host), local_state(top), "t2")  # nothing changed: nothing is sent
    assert [again.method, again.submodules["out"].method, again.submodules["out"].submodules["in"].method] == [
        "up-to-date"] * 3


def test_a_submodule_not_checked_out_here_leaves_no_earlier_copy_on_the_host(tmp_path):
    """Sent once (dirty), then from a clone without it: the host must not run the old copy as if sent."""
    lib = git_init(tmp_path / "lib")
    (lib / "lib.txt").write_text("lib\n")
    commit(lib, "lib")
    top = git_init(tmp_path / "top")
    (top / "t.txt").write_text("top\n")
    commit(top, "top")
    _submodule_add(top, lib, "lib")
    commit(top, "lib inside")
    (top / "lib" / "lib.txt").write_text("lib, an old uncommitted edit\n")
    host = HostPaths(str(tmp_path / "host"))
    _, first = sync_tree(_session(host), local_state(top), "t1")
    assert (first / "lib" / "lib.txt").read_text() == "lib, an old uncommitted edit\n"

    plain = tmp_path / "plain"
    git(tmp_path, "clone", "-q", str(top), str(plain))  # no --recursive: lib is not checked out here
    result, tree = sync_tree(_session(host), local_state(plain), "t2")
    assert result.not_sent == ("lib",) and result.as_meta()["submodules_not_sent"] == ["lib"]
    assert list((tree / "lib").iterdir()) == []  # empty there too, as here: the earlier copy is t1's only
    assert any("not checked out here were not sent" in w for w in result.warnings)


# ------------------------------------------------------------------------------------------ missing objects


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A repository whose first commit's blob is gone from the object store (its HEAD tree is whole)."""
    repo = git_init(tmp_path / "damaged")
    (repo / "a.txt").write_text("one\n")
    (repo / "b.txt").write_text("bee\n")
    commit(repo, "one")
    old = git(repo, "rev-parse", "HEAD:a.txt")
    (repo / "a.txt").write_text("two\n")
    commit(repo, "two")
    _loose(repo, old).unlink()
    return repo


def test_a_history_that_cannot_be_read_sends_the_tree_and_says_so(damaged, tmp_path):
    host = HostPaths(str(tmp_path / "host"))
    result, tree = sync_tree(_session(host), local_state(damaged), "t1")
    assert result.method == "tree" and result.as_meta()["checkout"] == result.checkout != result.commit
    assert git(tree, "rev-parse", "HEAD^{tree}") == git(damaged, "rev-parse", "HEAD^{tree}")
    assert (tree / "a.txt").read_text() == "two\n"
    assert any("cannot be read" in w and "git fsck" in w for w in result.warnings)
    again, _ = sync_tree(_session(host), local_state(damaged), "t2")
    assert (again.method, again.checkout, again.bundle_bytes) == ("tree", result.checkout, 0)


def test_a_tree_with_a_missing_blob_is_refused_naming_the_file(damaged, tmp_path):
    _loose(damaged, git(damaged, "rev-parse", "HEAD:b.txt")).unlink()
    with pytest.raises(ThrustError, match=r"b\.txt") as error:
        sync(_session(HostPaths(str(tmp_path / "host"))), local_state(damaged))
    assert error.value.exit_code == ExitCode.TRANSFER and "git fsck" in error.value.hint


def test_a_partial_clone_whose_promisor_is_gone_sends_its_tree(tmp_path):
    upstream = git_init(tmp_path / "upstream")
    for text in ("first\n", "second\n"):
        (upstream / "f.txt").write_text(text)
        commit(upstream, text)
    git(upstream, "config", "uploadpack.allowFilter", "true")
    laptop = tmp_path / "laptop"
    subprocess.run(["git", "clone", "-q", "--filter=blob:none", f"file://{upstream}", str(laptop)], check=True)
    upstream.rename(tmp_path / "gone")  # the promisor (and origin) out of reach: the old blob cannot come
    result, tree = sync_tree(_session(HostPaths(str(tmp_path / "host"))), local_state(laptop), "t1")
    assert result.method == "tree" and (tree / "f.txt").read_text() == "second\n"


# ------------------------------------------------------------------------------------------ Git LFS

POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"


def _pointer_repo(tmp_path: Path, data: bytes) -> tuple[Path, str]:
    """A repository with an LFS-tracked data.bin committed as its pointer, the laptop holding only that
    pointer (no git-lfs needed): what a clone made with GIT_LFS_SKIP_SMUDGE looks like."""
    repo = git_init(tmp_path / "pointers")
    oid = hashlib.sha256(data).hexdigest()
    (repo / ".gitattributes").write_text("*.bin filter=lfs diff=lfs merge=lfs -text\n")
    (repo / "data.bin").write_text(POINTER.format(oid=oid, size=len(data)))
    commit(repo, "data as an LFS pointer")
    return repo, oid


def test_an_lfs_pointer_without_its_content_is_refused_and_the_stored_object_is_sent(tmp_path):
    data = os.urandom(3000)
    repo, oid = _pointer_repo(tmp_path, data)
    host = HostPaths(str(tmp_path / "host"))
    with pytest.raises(ThrustError, match=r"data\.bin") as error:
        sync(_session(host), local_state(repo))
    assert error.value.exit_code == ExitCode.UNAVAILABLE and "git lfs pull --include" in error.value.hint
    assert not Path(host.workdir).exists()  # refused before anything reached the host
    store = repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4]
    store.mkdir(parents=True)
    (store / oid).write_bytes(data)  # what `git lfs fetch` leaves
    result, tree = sync_tree(_session(host), local_state(repo), "t1")
    assert (tree / "data.bin").read_bytes() == data
    assert result.as_meta()["lfs"] == ["data.bin"]


def test_train_refuses_pointer_only_lfs_files_before_the_host_gets_anything(sshd, cli, tmp_path):
    workdir = remote_tempdir(sshd)
    project = new_project(tmp_path / "project", sshd, workdir, jobs=JOBS.format(path="data.bin"),
                          files={".gitattributes": "*.bin filter=lfs -text\n",
                                 "data.bin": POINTER.format(oid="cd" * 32, size=10)})
    result = cli("train", "show", cwd=project)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert "data.bin" in result.stderr and "git lfs pull" in result.stderr
    assert not (workdir / ".git").exists()


def test_many_lfs_objects_reach_a_host_over_ssh_as_their_content(sshd, cli, tmp_path):
    """A project whose LFS objects the laptop holds (pointers in git, objects in .git/lfs/objects, as
    `git lfs fetch` leaves them): `train` over SSH sends them all (streamed on one channel) and the job
    reads the content, never a pointer."""
    workdir = remote_tempdir(sshd)
    blobs = {f"data/d{i:02d}.bin": os.urandom(500 + 997 * i) for i in range(40)}
    oids = {name: hashlib.sha256(data).hexdigest() for name, data in blobs.items()}
    files = {".gitattributes": "*.bin filter=lfs diff=lfs merge=lfs -text\n",
             **{name: POINTER.format(oid=oids[name], size=len(data)) for name, data in blobs.items()}}
    project = new_project(tmp_path / "project", sshd, workdir, files=files,
                          jobs=JOBS.replace("cat {path}", "sha256sum data/*.bin"))
    for name, data in blobs.items():
        store = project / ".git" / "lfs" / "objects" / oids[name][:2] / oids[name][2:4]
        store.mkdir(parents=True, exist_ok=True)
        (store / oids[name]).write_bytes(data)
    seen = dict(reversed(line.split()) for line in _train(cli, project, workdir)["seen"].splitlines())
    assert seen == oids  # what the job read is each file's content: its sha256 is the object id


@pytest.mark.skipif(shutil.which("git-lfs") is None, reason="git-lfs is not installed (make system-deps)")
def test_an_lfs_file_arrives_as_its_content_and_a_new_version_replaces_it(tmp_path):
    repo = git_init(tmp_path / "lfs")
    git(repo, "lfs", "install", "--local")
    git(repo, "lfs", "track", "*.bin")
    (repo / "data.bin").write_bytes(b"\0weights v1" * 500)
    commit(repo, "data in LFS")
    assert git(repo, "cat-file", "-p", "HEAD:data.bin").startswith("version https://git-lfs")  # a pointer in git
    host = HostPaths(str(tmp_path / "host"))
    _, tree = sync_tree(_session(host), local_state(repo), "t1")
    assert (tree / "data.bin").read_bytes() == b"\0weights v1" * 500
    assert sync_tree(_session(host), local_state(repo), "t2")[0].method == "up-to-date"  # content is no change
    (repo / "data.bin").write_bytes(b"\0weights v2, not committed" * 300)
    dirty, tree = sync_tree(_session(host), local_state(repo), "t3")
    assert (tree / "data.bin").read_bytes() == b"\0weights v2, not committed" * 300
    assert not dirty.dirty  # the content went as content, not as a patch of the pointer


# ------------------------------------------------------------------------------------------ pure units


def test_git_words_for_an_unreadable_object_are_recognised_and_a_full_disk_is_not():
    assert UNREADABLE.search("fatal: unable to read d00491fd7e5bb6fa28c517a0bb32b8b506539d4d")
    assert UNREADABLE.search("error: Could not read 5a292be6f5215541d1c2f75459a9df0451f89308")
    assert not UNREADABLE.search("fatal: sha1 file '/tmp/x.bundle' write error: No space left on device")


def test_a_pointer_is_told_from_content(tmp_path):
    oid = "ab" * 32
    (tmp_path / "p").write_text(POINTER.format(oid=oid, size=3))
    (tmp_path / "c").write_bytes(b"version 2 of my data")
    assert repo_mod._pointer_oid(tmp_path / "p") == oid
    assert repo_mod._pointer_oid(tmp_path / "c") is None


def test_a_plain_repo_keeps_its_meta_and_build_key_and_a_moved_submodule_changes_the_key():
    from thrust_remote.run.sync import SyncResult

    def result(**extra) -> SyncResult:
        return SyncResult("c" * 40, "bundle", True, "p" * 64, (), **extra)

    plain = result()
    assert plain.code_id == "p" * 64
    assert set(plain.as_meta()) == {"commit", "sync", "dirty", "patch_sha256", "untracked"}
    at_a, at_b = (result(submodules={"lib": SyncResult(sha, "clone", False, None, ())}) for sha in ("a" * 40, "b" * 40))
    assert len({plain.code_id, at_a.code_id, at_b.code_id}) == 3
    assert at_a.as_meta()["submodules"]["lib"]["commit"] == "a" * 40
