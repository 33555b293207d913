"""A fetch of a run whose tree `prune` removed, for a job with `checkpoints:` and no `artifacts:` (issue 53
item 5, the checkpoints' side), over a real sshd: a checkpoint in the tree is gone, and the fetch says so
(when, by what, where the local copy is) with 69, never "none on the host yet" and 0; a checkpoint under
$THRUST_RUN_DIR is in the run directory, which prune keeps, and still comes."""

from __future__ import annotations

import json
import re

from helpers import new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode

JOBS = """\
jobs:
  intree:
    kind: command
    command: [sh, -c, 'mkdir -p out && echo weights > out/ckpt.pt']
    checkpoints: out/ckpt.pt
  inrundir:
    kind: command
    command: [sh, -c, 'echo weights > "$THRUST_RUN_DIR/ckpt.pt"']
    checkpoints: $THRUST_RUN_DIR/ckpt.pt
"""


def _train(cli, proj, job: str, *more: str) -> str:
    res = cli("train", job, "--json", *more, cwd=proj)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["run_id"]


def test_fetch_of_a_pruned_tree_says_its_checkpoint_went_with_it(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "proj", sshd, workdir, jobs=JOBS)
    in_tree, in_run_dir = _train(cli, proj, "intree"), _train(cli, proj, "inrundir")
    never = _train(cli, proj, "intree", "--no-fetch")  # nothing of it here
    pruned = cli("prune", "--keep", "0", cwd=proj)
    assert pruned.returncode == 0, pruned.stderr
    assert not (workdir / ".thrust" / "trees" / in_tree).exists()

    gone = cli("fetch", in_tree, cwd=proj)
    assert gone.returncode == ExitCode.UNAVAILABLE, (gone.stdout, gone.stderr)
    said = " ".join((gone.stdout + gone.stderr).split())  # the console wraps long lines
    assert "none on the host yet" not in said and "Traceback" not in said
    assert re.search(rf"the tree of run {in_tree} on sandbox was removed by prune at \S+", said), said
    local = proj / ".thrust" / "fetched" / in_tree
    assert f"its copy here (what was fetched of it): {local}/" in said, said
    assert (local / "checkpoints" / "ckpt.pt").read_text() == "weights\n"  # the train's end brought it

    bare = cli("fetch", never, cwd=proj)
    assert bare.returncode == ExitCode.UNAVAILABLE, (bare.stdout, bare.stderr)
    said = " ".join((bare.stdout + bare.stderr).split())
    assert "none on the host yet" not in said and "no fetch of it left a copy here" in said, said

    kept = cli("fetch", in_run_dir, cwd=proj)  # the run directory stays: its checkpoint is there
    assert kept.returncode == 0, (kept.stdout, kept.stderr)
    assert "checkpoint: " in kept.stdout + kept.stderr and "removed" not in kept.stdout + kept.stderr
