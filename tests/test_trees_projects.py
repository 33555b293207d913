"""Two projects, one host, one workdir (issue 53 item 5; docs/architecture.md, "Trees"), over a real sshd:
a launch's `keep: {runs: N}` and `prune` count and remove the launching project's own trees only, never
another project's; and a fetch of a run whose tree its own project's keep: removed says so: when, by
which launch's keep:, where the copy an earlier fetch left is, with a non-zero exit."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import commit, new_project, remote_tempdir

from thrust_remote.core.errors import ExitCode

JOBS = """\
jobs:
  outs:
    kind: command
    command: [sh, -c, 'mkdir -p out && echo {name} > out/result.txt']
    artifacts: [out/**]
  plain:
    kind: command
    command: [sh, -c, 'mkdir -p out && echo {name} > out/result.txt']
"""


def _project(tmp_path: Path, sshd, workdir: Path, name: str) -> Path:
    """Project `name` (its own history: its own root commit) on the sshd's host, keep: {runs: 1}."""
    proj = new_project(tmp_path / name, sshd, workdir, jobs=JOBS.format(name=name), files={"NAME": f"{name}\n"},
                       message=f"project {name}")
    cfg = proj / "thrust.yaml"
    keep = "    connect_timeout: 5\n    keep: {runs: 1}\n"
    cfg.write_text(cfg.read_text().replace("    connect_timeout: 5\n", keep, 1))
    commit(proj, "keep one ended run's tree", "thrust.yaml")
    return proj


def _train(cli, proj: Path, job: str = "outs") -> str:
    """A run trained to its end (`outs`: its artifacts fetched here; `plain` fetches nothing): its id."""
    res = cli("train", job, "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["run_id"]


def test_one_projects_keep_never_removes_another_projects_trees(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    a, b = _project(tmp_path, sshd, workdir, "alpha"), _project(tmp_path, sshd, workdir, "beta")
    trees = workdir / ".thrust" / "trees"
    a1 = _train(cli, a)  # fetched: a copy of its artifacts here
    a2, a3 = _train(cli, a, "plain"), _train(cli, a, "plain")  # a3's launch: alpha's keep: removes a1
    assert sorted(p.name for p in trees.iterdir()) == sorted([a2, a3])
    b1 = _train(cli, b)  # two ended trees of alpha's on the host: beta's keep: counts neither
    assert sorted(p.name for p in trees.iterdir()) == sorted([a2, a3, b1]), "beta's launch removed alpha's trees"
    b2, b3 = _train(cli, b), _train(cli, b)  # beta's keep: now has two ended trees of its own: the older goes
    assert sorted(p.name for p in trees.iterdir()) == sorted([a2, a3, b2, b3])
    dry = cli("prune", "--keep", "0", "--dry-run", "--json", cwd=b)  # a prune from beta: beta's trees only
    assert dry.returncode == 0, dry.stderr
    answer = json.loads(dry.stdout)
    assert sorted(run for t in answer["trees"] if "removed" in t for run in t["runs"]) == sorted([b2, b3])
    assert not {a2, a3} & {run for t in answer["trees"] for run in t["runs"]} and answer["others"] == 2

    fetched = cli("fetch", a1, cwd=a)
    assert fetched.returncode == ExitCode.UNAVAILABLE, (fetched.stdout, fetched.stderr)
    said = " ".join(fetched.stderr.split())  # the console wraps long lines
    assert re.search(rf"the tree of run {a1} on sandbox was removed by keep: {{runs: 1}} at \S+, when run {a3} "
                     "of the same project was launched", said), fetched.stderr
    local = a / ".thrust" / "fetched" / a1
    assert f"its copy here (what was fetched of it): {local}/" in said, fetched.stderr
    assert (local / "artifacts" / "out" / "result.txt").read_text() == "alpha\n"
    assert "Traceback" not in fetched.stderr and "matches nothing" not in fetched.stderr
