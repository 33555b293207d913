"""`wait`'s end line leads with the job's `objective: {metric:}` as the live line does (a TensorBoard
job's tags come sorted by name) (issue 53 leftovers, item 3). A real run over the `sshd` host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir

pytestmark = pytest.mark.xdist_group("test_wait_objective")

TB_PY = '''\
from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter("tbruns")
for step in (10, 20, 30):
    writer.add_scalar("train/acc", 0.99 + step / 10000, step)
    writer.add_scalar("val/acc", 0.9 + step / 1000, step)
writer.close()
print("wrote", flush=True)
'''

JOBS = """\
jobs:
  tb:
    script: tb.py
    metrics: {tensorboard: tbruns}
    objective: {metric: val/acc, mode: max}
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "wait-objective"
    return new_project(tmp_path_factory.mktemp("waitobj") / "project", sshd, workdir, files={"tb.py": TB_PY},
                       jobs=JOBS, message="a TensorBoard job with an objective")


def test_waits_end_line_leads_with_the_objective(cli, project):
    started = cli("train", "tb", "--detach", cwd=project)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"run (\S+) started", started.stdout).group(1)  # type: ignore[union-attr]
    got = cli("wait", run_id, cwd=project)
    assert got.returncode == 0, got.stderr
    assert f"{run_id}: FINISHED (exit code 0) (val/acc 0.93, step 30, train/acc 0.993)" in got.stderr, got.stderr
