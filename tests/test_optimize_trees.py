"""Each `optimize` trial in a tree of its own (issue 53 item 18; docs/architecture.md, "Trees"), over a real
sshd: a job that writes a fixed path of its checkout (out/ckpt.pt, as nanoGPT does) and reads it back
later has, with two trials side by side, its own trial's file, never the other's."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import new_project, remote_tempdir

# Writes its lr to out/ckpt.pt, then waits (up to 30 s) until two trials of the study wrote theirs, so
# the first two run side by side whatever the timing; then reads the file back as its score. In a
# checkout the trials share, one of the two reads the other's lr.
FIXED_SH = """\
#!/bin/sh
for w in "$@"; do case "$w" in lr=*) lr="${w#lr=}";; esac; done
mkdir -p out && echo "$lr" > out/ckpt.pt
touch "$THRUST_RUN_DIR/wrote"
i=0
while [ "$(ls "$THRUST_RUN_DIR"/../"$THRUST_STUDY"-t*/wrote 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 300 ]; do
  sleep 0.1; i=$((i+1))
done
echo "THRUST_METRICS {\\"step\\": 1, \\"score\\": $(cat out/ckpt.pt)}"
"""

JOBS = """\
jobs:
  fixed:
    kind: command
    command: [sh, fixed.sh]
    objective: {metric: score, mode: max}
search:
  fixed: {lr: {low: 1.0, high: 100.0}}
"""


def test_trials_side_by_side_each_write_their_own_fixed_path(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, files={"fixed.sh": FIXED_SH}, jobs=JOBS,
                       message="a job that writes out/ckpt.pt")
    res = cli("optimize", "fixed", "--trials", "3", "--parallel", "2", "--seed", "3", "--json", cwd=proj, timeout=300)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["counts"]["done"] == 3, out
    trees = set()
    for t in out["trials"]:
        run_dir = workdir / ".thrust" / "runs" / t["run_id"]
        assert (run_dir / "wrote").exists()
        # its score is what it read back from out/ckpt.pt: its own lr, never the other trial's
        assert t["state"] == "COMPLETE" and t["value"] == t["params"]["lr"], t
        tree = Path(json.loads((run_dir / "run.json").read_text())["tree"])
        assert tree == workdir / ".thrust" / "trees" / t["run_id"]
        assert float((tree / "out" / "ckpt.pt").read_text()) == t["params"]["lr"]
        trees.add(tree)
    assert len(trees) == 3
