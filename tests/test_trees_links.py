"""The agent's tree verbs against a commit that tracks symlinks (issue 51; thrust_remote/agent/trees.py),
in this process on real git repositories: `files:`, LFS content and `shared:` are never written, replaced
or removed through a link of the commit (an answer names the path and the link instead), a run's
tree is kept by its lease while it is set up, and a pruned run's directory says when its tree went.
tests/test_trees_hostile.py runs the same through `train` over a real sshd with a non-root account."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from helpers import commit, git, git_init

from thrust_remote.agent import trees
from thrust_remote.agent.protocol import EXIT_CODE, RUN_JSON, RUNS_DIR, TREE_REMOVED


@pytest.fixture
def linked(tmp_path: Path) -> tuple[Path, Path, str]:
    """A workdir whose commit tracks `data -> OUTSIDE` (a directory of the account's, outside the tree)
    holding `keep.txt`; (workdir, outside, commit)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("PRECIOUS\n")
    work = tmp_path / "w"
    work.mkdir()
    (work / "code.py").write_text("v = 1\n")
    os.symlink(outside, work / "data")
    git_init(work)
    commit(work, "data is a link")
    return work, outside, git(work, "rev-parse", "HEAD")


def _object(work: Path, content: bytes) -> dict:
    sha = hashlib.sha256(content).hexdigest()
    path = Path(trees.object_path(str(work), sha))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    trees.seal(str(path))
    return {"sha256": sha, "mtime_ns": None}


def _add(work: Path, name: str, commit_sha: str, lfs: list[str] | None = None, **extra) -> dict:
    return trees.add(str(work), str(work / ".thrust" / "trees" / name), commit_sha, "", lfs or [], name, extra)


def test_files_behind_a_tracked_link_are_refused_and_nothing_is_written_there(linked):
    work, outside, head = linked
    with pytest.raises(trees.Refused) as refused:
        _add(work, "r1", head, files={"data/keep.txt": _object(work, b"replaced\n")})
    assert refused.value.answer["error"] == "outside" and refused.value.answer["through"] == "data"
    assert refused.value.answer["link"] == str(outside) and refused.value.answer["what"] == "files"
    assert (outside / "keep.txt").read_text() == "PRECIOUS\n" and (outside / "keep.txt").stat().st_nlink == 1
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
    assert not (work / ".thrust" / "trees" / "r1").exists()  # a refused tree is not left half made


def test_an_lfs_path_behind_a_tracked_link_removes_nothing_there(linked):
    work, outside, head = linked
    with pytest.raises(trees.Refused):
        _add(work, "r1", head, lfs=["data/keep.txt="])  # an LFS file with no content: removed in the tree
    assert (outside / "keep.txt").read_text() == "PRECIOUS\n"


def test_shared_behind_a_tracked_link_is_refused_and_the_directory_stays(linked):
    work, outside, head = linked
    (outside / "cache").mkdir()
    (outside / "cache" / "big.bin").write_text("downloaded\n")
    with pytest.raises(trees.Refused) as refused:
        _add(work, "r1", head, shared=["data/cache"])
    assert refused.value.answer["through"] == "data" and refused.value.answer["what"] == "shared"
    assert (outside / "cache").is_dir() and not (outside / "cache").is_symlink()
    assert (outside / "cache" / "big.bin").read_text() == "downloaded\n"


def test_a_link_standing_where_a_file_goes_is_replaced_never_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("PRECIOUS\n")
    work = tmp_path / "w"
    work.mkdir()
    os.symlink(outside, work / "input.txt")
    git_init(work)
    commit(work, "input.txt is a link")
    _add(work, "r1", git(work, "rev-parse", "HEAD"), files={"input.txt": _object(work, b"data\n")})
    placed = work / ".thrust" / "trees" / "r1" / "input.txt"
    assert not placed.is_symlink() and placed.read_text() == "data\n"
    assert outside.read_text() == "PRECIOUS\n"


def test_a_tree_being_set_up_is_kept_by_its_lease_and_a_pruned_runs_directory_says_when(linked):
    work, _, head = linked
    _add(work, "setting-up", head)
    _add(work, "ended", head)
    run_dir = work / RUNS_DIR / "ended"
    run_dir.mkdir(parents=True)
    tree = str(work / ".thrust" / "trees" / "ended")
    (run_dir / RUN_JSON).write_text(json.dumps({"run_id": "ended", "tree": tree, "cwd": tree}))
    (run_dir / EXIT_CODE).write_text(json.dumps({"exit_code": 0, "ended_ts": time.time()}))
    # a launch's keep: spares the run just launched and one whose train is still to fetch it
    kept = trees.prune(str(work), 0, [], False, auto=True, spare=("x",))
    assert {t["name"]: t.get("hold") for t in kept["trees"]} == {"setting-up": "setup", "ended": "fetch"}
    assert not any("removed" in t for t in kept["trees"])
    done = trees.prune(str(work), 0, [], False)  # prune itself removes an ended run's, never a set-up's
    assert [t["name"] for t in done["trees"] if t.get("removed")] == ["ended"]
    assert (work / ".thrust" / "trees" / "setting-up").is_dir()
    note = json.loads((run_dir / TREE_REMOVED).read_text())
    assert note["by"] == "prune" and note["tree"] == tree and note["at"].endswith("Z")
    trees.prune(str(work), None, [], False, release=("setting-up",))  # its train is done with it
    gone = trees.prune(str(work), 0, [], False)
    assert [t["name"] for t in gone["trees"] if t.get("removed")] == ["setting-up"]
