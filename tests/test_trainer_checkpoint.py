"""Checkpoints survive SIGKILL in the middle of a save; the newest loadable one never goes back."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import checkpoint_paths, load_latest, save_checkpoint


def _writer(directory: Path, blob: torch.Tensor) -> None:
    """Child body: continue from the latest checkpoint, save ~0.8 MB checkpoints as fast as possible.

    No tensor arithmetic here: after fork, torch's OpenMP pool inherited from the parent may hang.
    """
    loaded = load_latest(directory)
    step = loaded[0]["step"] + 1 if loaded else 0
    while True:
        save_checkpoint(directory, {"step": step, "blob": blob}, step, keep=2)
        step += 1


@pytest.mark.slow
def test_sigkill_during_saves_always_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(0)
    blob = torch.arange(200_000, dtype=torch.float32)
    last_step = -1
    for _ in range(20):
        # fork: the child starts writing at once (no interpreter start-up), so kills land mid-save.
        pid = os.fork()
        if pid == 0:
            try:
                _writer(tmp_path, blob)
            finally:
                os._exit(1)
        # Kill only once the child is visibly writing (a file that was not there before), then at a
        # random moment within the next saves: kills land mid-save, and every round makes progress
        # however loaded the machine is.
        before = set(os.listdir(tmp_path))
        deadline = time.monotonic() + 60
        while set(os.listdir(tmp_path)) <= before and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.05))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        loaded = load_latest(tmp_path)
        if loaded is None:  # killed before its first save completed: only allowed before any save
            assert last_step == -1
            continue
        state, path = loaded
        assert state["step"] >= last_step, "resume would go back"
        assert torch.equal(state["blob"], blob), "the checkpoint is complete"
        last_step = state["step"]
        assert path == checkpoint_paths(tmp_path)[0][1]
    assert last_step > 0


def test_save_keeps_the_newest_and_ignores_temp_files(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        save_checkpoint(tmp_path, {"step": step}, step, keep=3)
    (tmp_path / ".ckpt-garbage.tmp").write_bytes(b"torn")
    assert [s for s, _ in checkpoint_paths(tmp_path)] == [20, 15, 10]
    loaded = load_latest(tmp_path)
    assert loaded is not None
    assert loaded[0]["step"] == 20


def test_a_damaged_newest_file_falls_back_to_the_previous(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, {"step": 1}, 1)
    (tmp_path / "ckpt-000000000002.pt").write_bytes(b"not a checkpoint")
    loaded = load_latest(tmp_path)
    assert loaded is not None
    assert loaded[0]["step"] == 1
    assert load_latest(tmp_path / "missing") is None
