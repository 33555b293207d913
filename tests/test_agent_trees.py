"""The host side of "one run, one tree" (thrust_remote/agent/trees.py), called in this process on real
git repositories in a temporary directory: a tree at a commit with its patch, `files:` placed from the
content store as hard links and refused when the store's copy is not what its name says, `setup:`
outputs kept and linked into the next tree, `shared:` directories, sizes, prune's order, and the
agent's answers and exit codes. tests/test_trees.py runs the same verbs over a real sshd through
`train`; here each branch is reached directly (the agent runs as a zipapp there, where coverage does
not follow it)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import commit, git, git_init, wait_until

from thrust_remote.agent import trees
from thrust_remote.agent.protocol import EXIT_CODE, RUN_JSON, RUNS_DIR
from thrust_remote.agent.supervisor import _proc_environ_has, _proc_start_time


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A host workdir that is a git store with two commits: `code.py` v1 then v2."""
    work = tmp_path / "w"
    work.mkdir()
    (work / "code.py").write_text("v = 1\n")
    (work / ".gitignore").write_text("cache/\n")
    git_init(work)
    commit(work, "one")
    (work / "code.py").write_text("v = 2\n")
    commit(work, "two")
    return work


def _head(work: Path, rev: str = "HEAD") -> str:
    return git(work, "rev-parse", rev).strip()


def _store(work: Path, content: bytes, mtime_ns: int | None = None, *, sealed: bool = True) -> dict:
    """An object in the content store, as a verified transfer leaves it (sealed or not yet)."""
    sha = hashlib.sha256(content).hexdigest()
    path = Path(trees.object_path(str(work), sha))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    if sealed:
        trees.seal(str(path), mtime_ns)
    return {"sha256": sha, "mtime_ns": mtime_ns}


def _add(work: Path, name: str, commit_sha: str, **extra) -> dict:
    return trees.add(str(work), str(work / ".thrust" / "trees" / name), commit_sha, extra.pop("patch", ""),
                     extra.pop("lfs", []), name, extra)


def test_a_tree_is_the_commit_with_its_patch_and_its_files_linked_from_the_store(workdir: Path, tmp_path: Path):
    first = _head(workdir, "HEAD~1")
    patch = tmp_path / "p.patch"
    patch.write_text("--- a/code.py\n+++ b/code.py\n@@ -1 +1 @@\n-v = 1\n+v = 'patched'\n")
    data = _store(workdir, b"rows\n" * 100, mtime_ns=1_600_000_000_000_000_000)
    got = _add(workdir, "r1", first, patch=str(patch), files={"data/train.csv": data})
    tree = Path(got["tree"])
    assert got["head"] == first and got["setup"] == "none"
    assert (tree / "code.py").read_text() == "v = 'patched'\n"  # the commit, then the patch
    placed, obj = tree / "data" / "train.csv", Path(trees.object_path(str(workdir), data["sha256"]))
    assert placed.stat().st_ino == obj.stat().st_ino  # a hard link: the data is on disk once
    assert obj.stat().st_mtime_ns == data["mtime_ns"] and oct(obj.stat().st_mode & 0o777) == "0o400"
    assert git(workdir, "rev-parse", trees.REFS + "r1").strip() == first  # gc keeps the commit
    assert oct(workdir.stat().st_mode & 0o777) == "0o700"  # the workdir is this account's alone
    # its size counts the tree's own files only (the linked data is the store's)
    own = trees.size(str(tree), 10.0)
    assert own["complete"] and own["files"] >= 2 and own["bytes"] < 500 * 1024
    with pytest.raises(trees.Refused) as info:  # a tree's name is never reused
        _add(workdir, "r1", first)
    assert info.value.answer["error"] == "exists"
    assert trees.remove(str(workdir), str(tree), "r1", []) == {"removed": True}
    assert not tree.exists() and git(workdir, "show-ref").count(trees.REFS) == 0
    assert Path(trees.object_path(str(workdir), data["sha256"])).is_file()  # the store stays


def test_a_store_object_that_is_not_what_its_name_says_is_missing_and_sent_again(workdir: Path):
    good = _store(workdir, b"good\n")
    unsealed = _store(workdir, b"just sent\n", mtime_ns=1_700_000_000_000_000_000, sealed=False)
    lying = _store(workdir, b"x", sealed=False)
    lying_path = Path(trees.object_path(str(workdir), lying["sha256"]))
    lying_path.write_bytes(b"not x")  # arrived, not sealed, and not its name's content
    absent = "0" * 64
    # rewritten in place through a tree's link (a job appending to "its" data file)
    rewritten = Path(trees.object_path(str(workdir), good["sha256"]))
    rewritten.chmod(0o600)
    with rewritten.open("a") as fh:
        fh.write("appended\n")
    assert trees.missing(str(workdir), [good["sha256"], unsealed["sha256"], absent, absent]) == \
        [good["sha256"], absent]
    assert not rewritten.exists()  # dropped: the laptop sends it again
    with pytest.raises(trees.Refused) as info:
        _add(workdir, "r2", _head(workdir), files={"a.txt": unsealed, "b.txt": lying})
    assert info.value.answer == {"error": "missing", "missing": [lying["sha256"]]}
    assert not (workdir / ".thrust" / "trees" / "r2").exists()  # a refused tree is not left half-made
    unsealed_path = Path(trees.object_path(str(workdir), unsealed["sha256"]))
    assert trees.intact(str(unsealed_path))  # verified and sealed on the way, with the laptop's mtime
    assert unsealed_path.stat().st_mtime_ns == unsealed["mtime_ns"]


@pytest.mark.parametrize("rel", ["../escape.txt", "/etc/passwd-copy", "data/../../escape.txt"])
def test_a_path_outside_the_tree_is_refused(workdir: Path, rel: str):
    data = _store(workdir, b"d\n")
    with pytest.raises(trees.Refused) as info:
        _add(workdir, "r3", _head(workdir), files={rel: data})
    assert info.value.answer == {"error": "outside", "path": rel}
    assert not (workdir.parent / "escape.txt").exists()


def test_setup_outputs_are_kept_once_and_linked_into_the_next_tree_of_the_same_inputs(workdir: Path):
    head = _head(workdir)
    first = Path(_add(workdir, "s1", head, setup="key1")["tree"])
    assert _add(workdir, "s0", head, setup=None)["setup"] == "none"
    # what a setup does: downloads into an ignored directory, edits a tracked file, makes a link
    (first / "cache").mkdir()
    (first / "cache" / "weights.bin").write_bytes(b"w" * 4096)
    (first / "cache" / "skip.log").write_text("noise\n")
    (first / "code.py").write_text("v = 'set up'\n")
    (first / "link").symlink_to("code.py")
    kept = trees.keep_setup(str(workdir), str(first), "key1", ["cache/skip.log"])
    assert kept == {"outputs": 2, "bytes": 4096 + len("v = 'set up'\n")}
    second = _add(workdir, "s2", head, setup="key1")
    tree = Path(second["tree"])
    assert second["setup"] == "placed"
    assert (tree / "cache" / "weights.bin").stat().st_ino == (first / "cache" / "weights.bin").stat().st_ino
    assert (tree / "code.py").read_text() == "v = 'set up'\n" and not (tree / "cache" / "skip.log").exists()
    # an output gone from the store: the setup runs again rather than a tree missing a file
    record = json.loads((workdir / trees.SETUP / "key1.json").read_text())
    os.unlink(trees.object_path(str(workdir), record["outputs"]["cache/weights.bin"]))
    assert _add(workdir, "s3", head, setup="key1")["setup"] == "missing"
    assert _add(workdir, "s4", head, setup="never-made")["setup"] == "missing"


def test_a_shared_path_is_one_host_directory_and_a_tracked_one_is_refused(workdir: Path):
    head = _head(workdir)
    one = Path(_add(workdir, "h1", head, shared=["runs/cache/"])["tree"])
    (one / "runs" / "cache" / "made.txt").write_text("by run one\n")
    two = Path(_add(workdir, "h2", head, shared=["runs/cache"])["tree"])
    assert (two / "runs" / "cache").is_symlink()
    assert (two / "runs" / "cache" / "made.txt").read_text() == "by run one\n"
    trees.remove(str(workdir), str(one), "h1", [])
    assert (two / "runs" / "cache" / "made.txt").is_file()  # it outlives the tree that made it
    with pytest.raises(trees.Refused) as info:
        _add(workdir, "h3", head, shared=["code.py"])
    assert info.value.answer == {"error": "shared-tracked", "path": "code.py", "tracked": ["code.py"]}


def test_tree_info_is_counted_for_a_running_run_and_kept_once_it_ended(workdir: Path, tmp_path: Path):
    tree = Path(_add(workdir, "i1", _head(workdir))["tree"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    assert trees.tree_info(str(run_dir), {}, ended=False) == {}  # a run without a tree of its own
    live = trees.tree_info(str(run_dir), {"tree": str(tree)}, ended=False)
    assert live["tree_kept"] and live["tree_bytes"] > 0
    (run_dir / trees.SIZE_FILE).write_text(json.dumps({"bytes": 123}))
    assert trees.tree_info(str(run_dir), {"tree": str(tree)}, ended=True)["tree_bytes"] == 123
    trees.remove(str(workdir), str(tree), "i1", [])
    assert trees.tree_info(str(run_dir), {"tree": str(tree)}, ended=True) == \
        {"tree": str(tree), "tree_kept": False, "tree_bytes": None}


def _run(work: Path, run_id: str, tree: Path | None, *, exit_code: int | None = 0, ended: float = 0.0,
         live: subprocess.Popen | None = None, marker: str = "") -> None:
    run_dir = work / RUNS_DIR / run_id
    run_dir.mkdir(parents=True)
    meta: dict = {"run_id": run_id, **({"tree": str(tree)} if tree else {})}
    if live is not None:  # a job still running: its pid, start time and marker (what the supervisor records)
        meta.update(pid=live.pid, pid_start=_proc_start_time(live.pid), marker=marker)
    (run_dir / RUN_JSON).write_text(json.dumps(meta))
    if exit_code is not None and live is None:
        (run_dir / EXIT_CODE).write_text(json.dumps({"exit_code": exit_code, "ended_ts": ended}))


def test_prune_keeps_the_newest_never_a_running_runs_and_fetched_finished_ones_go_first(workdir: Path):
    head, now = _head(workdir), time.time()
    made = {name: Path(_add(workdir, name, head)["tree"]) for name in ("old", "mid", "new", "fetched", "live")}
    marker = "m-prune-test"
    job = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                           env={**os.environ, "THRUST_RUN_MARKER": marker})
    # Popen returns while the kernel may still be loading the new program: until then its
    # /proc/PID/environ reads empty (a loop of 300 starts beside two busy loops read it empty 181 times),
    # and the run would not be seen as live. A run's job has long started by the time its state matters.
    wait_until(lambda: _proc_environ_has(job.pid, f"THRUST_RUN_MARKER={marker}"), 30, "the job's environment")
    try:
        _run(workdir, "old", made["old"], exit_code=1, ended=now - 300)
        _run(workdir, "mid", made["mid"], ended=now - 200)
        _run(workdir, "new", made["new"], ended=now + 100)
        _run(workdir, "fetched", made["fetched"], ended=now + 200)  # the newest, but already home
        _run(workdir, "live", made["live"], exit_code=None, live=job, marker=marker)
        _run(workdir, "no-tree", None)
        dry = trees.prune(str(workdir), 2, ["fetched"], dry_run=True)
        rows = {r["name"]: r for r in dry["trees"]}
        assert rows["live"]["live"] and rows["fetched"]["fetched"] and not rows["new"]["fetched"]
        assert sorted(n for n, r in rows.items() if r.get("removed") is False) == ["fetched", "old"]
        assert all(t.is_dir() for t in made.values())  # a dry run removes nothing
        done = trees.prune(str(workdir), 0, ["fetched"], dry_run=False)
        assert sorted(r["name"] for r in done["trees"] if r.get("removed")) == ["fetched", "mid", "new", "old"]
        assert made["live"].is_dir() and not made["old"].exists() and done["freed"] > 0
    finally:
        job.kill()
        job.wait()
    assert trees.prune(str(workdir / "nowhere"), 1, [], dry_run=False) == {"trees": [], "freed": 0, "dry_run": False}


def test_the_agent_verbs_answer_json_and_exit_3_when_refused_1_when_the_host_fails(workdir: Path, capsys, monkeypatch):
    head = _head(workdir)
    tree = workdir / ".thrust" / "trees" / "c1"
    monkeypatch.setattr(sys, "stdin", _Stdin(json.dumps({"shared": ["code.py"]})))
    assert trees.main(["tree-add", "--workdir", str(workdir), "--tree", str(tree), "--commit", head, "--stdin"]) == 3
    assert json.loads(capsys.readouterr().out)["error"] == "shared-tracked"
    monkeypatch.setattr(sys, "stdin", _Stdin(""))
    add = ["tree-add", "--workdir", str(workdir), "--tree", str(tree), "--commit", head]
    assert trees.main([*add, "--ref", "c1"]) == 0
    assert json.loads(capsys.readouterr().out)["head"] == head
    assert trees.main(["tree-size", "--tree", str(tree)]) == 0
    assert json.loads(capsys.readouterr().out)["complete"] is True
    monkeypatch.setattr(sys, "stdin", _Stdin(json.dumps(["f" * 64])))
    assert trees.main(["store-missing", "--workdir", str(workdir)]) == 0
    assert json.loads(capsys.readouterr().out) == {"missing": ["f" * 64]}
    monkeypatch.setattr(sys, "stdin", _Stdin(json.dumps({"exclude": []})))
    assert trees.main(["setup-keep", "--workdir", str(workdir), "--tree", str(tree), "--key", "k"]) == 0
    assert json.loads(capsys.readouterr().out) == {"outputs": 0, "bytes": 0}
    assert trees.main(["tree-prune", "--workdir", str(workdir), "--keep", "5", "--dry-run"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["trees"]] == ["c1"]
    assert trees.main(["tree-remove", "--workdir", str(workdir), "--tree", str(tree), "--ref", "c1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"removed": True}
    # a commit the store does not have: the host's failure, said on stderr, exit 1
    monkeypatch.setattr(sys, "stdin", _Stdin(""))
    assert trees.main(["tree-add", "--workdir", str(workdir), "--tree", str(tree), "--commit", "f" * 40]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tree-add: git worktree add") and not tree.exists()


class _Stdin:
    """What `agent ... --stdin` reads."""

    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text
