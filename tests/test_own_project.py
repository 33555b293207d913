"""Your own training code, end to end over a real sshd (the acceptance test of "your own code"): a project that is not
this repository, with its own DDP-aware `train.py` that writes TensorBoard scalars (torch.utils.tensorboard)
and a checkpoint, and a requirements.txt. `train` shows its progress from the scalars read on the host (no
JSON on the screen), the run FINISHES, the artifacts come back verified, a second run skips setup, and under
torchrun with `nproc: 2` (gloo on CPU) the script sees world size 2."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from helpers import EXE, new_project, remote_tempdir, run_tree

# one worker runs this module's tests, in order: its tests share one project and host
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("test_own_project")]  # a user's own torch training, for real

pytest.importorskip("tensorboard", reason="the job writes TensorBoard events: pip install tensorboard")

TRAIN_PY = '''\
"""A user's DDP-aware training script: torch's own TensorBoard writer and a checkpoint."""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter



def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    w = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=args.lr)
    writer = SummaryWriter(f"runs/{os.environ['THRUST_RUN_ID']}") if rank == 0 else None
    for step in range(1, args.steps + 1):
        loss = (w - 1.0).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        if world > 1:
            dist.all_reduce(w.grad)
            w.grad /= world
        opt.step()
        if writer is not None:
            writer.add_scalar("losses/value_loss", loss.item(), step)
            writer.add_scalar("charts/episodic_return", 100.0 - loss.item(), step)
    if rank == 0:
        writer.close()
        os.makedirs("models", exist_ok=True)
        torch.save({"w": w.detach(), "world_size": world}, "models/ckpt.pt")
        print(f"done: world size {world}", flush=True)
    if world > 1:
        dist.barrier()  # no rank tears gloo down while a peer's last bytes are in flight
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: gloo's threads can abort it (the README's troubleshooting)
'''

JOBS = """\
jobs:
  ppo:
    kind: python
    script: train.py
    requirements: requirements.txt
    artifacts: ["runs/**", "models/*.pt"]
    metrics: {tensorboard: runs}
  ddp:
    script: train.py
    requirements: requirements.txt
    nproc: 2
    artifacts: ["models/*.pt"]
    metrics: {tensorboard: runs}
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir): a fresh git repo with only train.py, requirements.txt and thrust.yaml."""
    # requirements.txt: satisfied by the host's own site-packages (the venv sees them): pip installs nothing,
    # offline
    files = {"train.py": TRAIN_PY, "requirements.txt": "tensorboard\n", ".gitignore": "runs/\nmodels/\n"}
    workdir = remote_tempdir(sshd) / "mine"
    proj = new_project(tmp_path_factory.mktemp("mine") / "project", sshd, workdir, files=files, jobs=JOBS,
                       message="my project")
    return proj, workdir


def _train(proj: Path, job: str) -> tuple[subprocess.CompletedProcess, str]:
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    result = subprocess.run([EXE, "train", job], cwd=proj, capture_output=True, text=True, env=env, timeout=600)
    match = re.search(r"launching run (\S+)", result.stderr)
    assert match, result.stderr
    return result, match.group(1)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_own_script_shows_tensorboard_progress_brings_artifacts_back_and_skips_setup_again(project):
    proj, workdir = project
    first, run_id = _train(proj, "ppo")
    assert first.returncode == 0, first.stderr
    assert "installing" in first.stderr or "setting up" in first.stderr
    # progress from the scalars read on the host: the run id, the step and the tags' values, never JSON
    line = re.search(rf"^{re.escape(run_id)}: 40 steps .*charts/episodic_return [\d.]+.*$", first.stdout, re.M)
    assert line, first.stdout
    assert "{" not in first.stdout and "THRUST_METRICS" not in first.stdout
    assert "done: world size 1" in first.stdout
    assert json.loads(subprocess.run([EXE, "status", run_id, "--json"], cwd=proj, capture_output=True,
                                     text=True, timeout=120).stdout)["state"] == "FINISHED"

    here = proj / ".thrust" / "fetched" / run_id / "artifacts"
    assert str(here.relative_to(proj)) in first.stderr  # where they are is said
    tree = run_tree(workdir, run_id)
    host_files = sorted(p.relative_to(tree) for p in [*(tree / "runs" / run_id).rglob("*"),
                                                      tree / "models" / "ckpt.pt"] if p.is_file())
    assert len(host_files) >= 2 and sorted(p.relative_to(here) for p in here.rglob("*") if p.is_file()) == host_files
    assert all(_sha(here / rel) == _sha(tree / rel) for rel in host_files)

    second, second_id = _train(proj, "ppo")
    assert second.returncode == 0, second.stderr
    assert "setup skipped: the job's venv is up to date" in second.stderr
    assert second_id != run_id and (proj / ".thrust" / "fetched" / second_id / "artifacts" / "models").is_dir()


@pytest.mark.slow
def test_own_ddp_script_under_torchrun_sees_world_size_2_and_its_checkpoint_comes_back(project):
    proj, _workdir = project
    result, run_id = _train(proj, "ddp")
    assert result.returncode == 0, result.stderr
    assert "done: world size 2" in result.stdout
    assert re.search(rf"^{re.escape(run_id)}: 40 steps ", result.stdout, re.M), result.stdout
    import torch

    ckpt = torch.load(proj / ".thrust" / "fetched" / run_id / "artifacts" / "models" / "ckpt.pt")
    assert ckpt["world_size"] == 2
