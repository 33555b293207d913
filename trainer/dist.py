"""Rank facts and the few collectives the training loop needs (no-ops in a single process).

Under `torchrun` (WORLD_SIZE > 1) the process group uses NCCL on CUDA and gloo on CPU; see
trainer/train.py's docstring for how runs, restarts and ranks fit together.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TypeVar

import torch

T = TypeVar("T")


class Dist:
    """Rank facts, and the few collectives the loop needs (no-ops in a single process)."""

    def __init__(self, timeout_s: float, want_cuda: bool) -> None:
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.enabled = self.world > 1
        self.backend = "nccl" if want_cuda else "gloo"
        self.device = torch.device(f"cuda:{self.local_rank}" if want_cuda else "cpu")
        if self.enabled:
            import torch.distributed as dist

            if want_cuda:
                torch.cuda.set_device(self.local_rank)
            timeout = timedelta(seconds=timeout_s)
            # torchrun keeps one store across restarts; keys of a dead attempt (gloo's peer addresses)
            # were read by the next attempt ("connectFullMesh ... Connection refused"). A prefix per
            # attempt keeps each attempt's keys apart.
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                self.world,
                is_master=self.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
                timeout=timeout,
            )
            dist.init_process_group(
                self.backend,
                store=dist.PrefixStore(f"thrust-attempt-{self.restart_count}", store),
                rank=self.rank,
                world_size=self.world,
                timeout=timeout,
            )
            self._dist = dist

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, returned on `t`'s device. NCCL reduces only CUDA tensors: move there."""
        if not self.enabled:
            return t
        work = t.to(self.device, dtype=torch.float64 if t.is_floating_point() else t.dtype, copy=True)
        self._dist.all_reduce(work)
        return work.to(t.device, t.dtype)

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        return self.sum(t) / self.world if self.enabled else t

    def broadcast_str(self, value: str) -> str:
        return self.broadcast(value)

    def broadcast(self, value: T) -> T:
        """Rank 0's `value` on every rank (pickled: for small things, a checkpoint on CPU included)."""
        if not self.enabled:
            return value
        box = [value]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            self._dist.barrier()

    def close(self) -> None:
        """Every rank has finished its last collective before any rank tears the group down. This is not
        the whole teardown story: gloo's worker threads can outlive destroy_process_group and abort the
        process if they drop a work while Python shuts down, so train.py ends in `os._exit`."""
        if self.enabled:
            self._dist.barrier()
            self._dist.destroy_process_group()
