"""`thrust-remote prune` says why a tree it did not remove stays (docs/architecture.md, "Trees"; agent
tree-prune's `hold`), over a real sshd through the CLI: beside the trees it removed (or would), each kept
tree that carries a hold (being set up or launched, still to fetch) is listed with its reason, so a
`prune --keep 0` that leaves a tree behind is not a puzzle."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

from helpers import GATED_SETUP, new_project, remote_tempdir, wait_until


def test_prune_lists_the_trees_it_kept_for_a_hold_with_the_reason(cli, sshd, tmp_path):
    gate = remote_tempdir(sshd) / "gate"
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=GATED_SETUP.format(gate=gate))
    ended = cli("train", "quick", "--json", cwd=proj)  # an ended run's tree: prune removes it
    assert ended.returncode == 0, ended.stderr
    ended_id = json.loads(ended.stdout)["run_id"]
    trees = workdir / ".thrust" / "trees"
    outcome: dict = {}
    training = threading.Thread(target=lambda: outcome.update(res=cli("train", "gated", "--json", cwd=proj)))
    training.start()
    try:
        wait_until(lambda: Path(f"{gate}.waiting").exists(), 120, "the gated train's setup to start")
        setting_up = sorted(p.name for p in trees.iterdir() if p.name != ended_id)
        assert len(setting_up) == 1, setting_up
        dry = cli("prune", "--keep", "0", "--dry-run", cwd=proj)
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {ended_id} ({ended_id}; ended)" in dry.stdout, dry.stdout
        assert f"kept {setting_up[0]} (no run; being set up or launched)" in dry.stdout, dry.stdout
        pruned = cli("prune", "--keep", "0", cwd=proj)
        assert pruned.returncode == 0, pruned.stderr
        assert re.search(rf"^removed {ended_id} \({ended_id}; ended\)", pruned.stdout, re.M), pruned.stdout
        assert f"kept {setting_up[0]} (no run; being set up or launched)" in pruned.stdout, pruned.stdout
        assert "1 tree(s) removed, 1 kept" in pruned.stderr, pruned.stderr
        assert sorted(p.name for p in trees.iterdir()) == setting_up
    finally:
        gate.touch()
        training.join(300)
    res = outcome["res"]
    assert res.returncode == 0, res.stderr
    assert (Path(json.loads(res.stdout)["run_dir"]) / "seen").read_text() == "ran\n"
