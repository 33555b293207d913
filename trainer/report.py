"""What the trainer reports: `TAG {json}` lines on stdout, metrics.jsonl rows, and the episode window.

The line formats (THRUST_METRICS / THRUST_INFO / THRUST_DONE) are the contract with thrust-remote;
trainer/train.py's docstring lists their fields.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch


def emit(tag: str, obj: dict[str, Any]) -> None:
    """One machine-readable line on stdout: `TAG {json}` (the documented output of this CLI)."""
    sys.stdout.write(f"{tag} {json.dumps(obj, separators=(', ', ': '))}\n")
    sys.stdout.flush()


def say(line: str) -> None:
    """One plain log line on stdout, for people (no tag: tools show it as it is)."""
    sys.stdout.write(line.rstrip("\n") + "\n")
    sys.stdout.flush()


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def gpu_fields(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {}
    out: dict[str, Any] = {"gpu_mem_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 3)}
    with contextlib.suppress(Exception):  # needs pynvml; the field is optional
        out["gpu_util"] = torch.cuda.utilization(device)
    return out


def trim_metrics(path: Path, step: int) -> None:
    """After a resume from `step`, drop the rows a crashed attempt logged past it, so the file's steps
    only ever go up (the page draws it as one curve). Atomic: temp file + os.replace."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if int(json.loads(line).get("step", 0)) <= step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(f"{row}\n" for row in kept))
    os.replace(tmp, path)


class Window:
    """Env steps and finished-episode sums since the last report.

    The sums ([return, length, score, count]) stay a tensor on the training device, added to every
    iteration without a host sync; `read` copies them (and the losses) to the host once per report,
    into `ret`, `len`, `score` and `n`.
    """

    def __init__(self, now: float, device: torch.device | str = "cpu") -> None:
        self.t = now
        self.steps = 0
        self.sums = torch.zeros(4, device=device)
        self.ret = self.len = self.score = self.n = 0.0

    def add(self, steps: int, sums: torch.Tensor) -> None:
        """`steps` env steps and the `[4]` sums of the episodes they finished (a device tensor)."""
        self.steps += steps
        self.sums += sums.to(self.sums.dtype)

    def read(self, *extra: torch.Tensor) -> list[float]:
        """Copy the sums to the host (`ret`, `len`, `score`, `n`); returns the values of `extra` (flat,
        in order), copied along in the same transfer: the report's one host sync."""
        flat = torch.cat([self.sums, *(x.reshape(-1).to(self.sums) for x in extra)]).tolist()
        self.ret, self.len, self.score, self.n = flat[:4]
        return flat[4:]

    def sps(self, now: float) -> float:
        return round(self.steps / max(now - self.t, 1e-9), 1)

    def mean(self, total: float) -> float | None:
        return total / self.n if self.n else None

    def restart(self, now: float) -> None:
        """A new window, after `read`; with no episode finished yet, the episode sums carry on into it."""
        self.steps, self.t = 0, now
        if self.n:
            self.sums.zero_()
            self.ret = self.len = self.score = self.n = 0.0


class RunLog:
    """Rank 0's outputs of a run: THRUST_METRICS lines, metrics.jsonl, TensorBoard, the progress bar.

    `resumed_step` > 0: metrics.jsonl is first trimmed to it (see `trim_metrics`)."""

    def __init__(self, run_dir: Path, writer_cls: Any, resumed_step: int) -> None:
        self.writer = writer_cls(log_dir=str(run_dir / "tensorboard")) if writer_cls is not None else None
        if resumed_step > 0:
            trim_metrics(run_dir / "metrics.jsonl", resumed_step)
        self.file = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 - closed in close()
        self.progress: Any = None
        self.task: Any = None

    def start_progress(self, label: str, total: int, completed: int) -> None:
        """A rich progress bar, only when stdout is a terminal."""
        if not sys.stdout.isatty():
            return
        from rich.console import Console
        from rich.progress import Progress

        # The bar stays at the bottom and our lines print above it; soft_wrap keeps rich from
        # re-wrapping the THRUST_* lines to the terminal width (they must stay one line each).
        self.progress = Progress(console=Console(soft_wrap=True, highlight=False))
        self.progress.start()
        self.task = self.progress.add_task(label, total=total, completed=completed)

    def metrics(self, row: dict[str, Any]) -> None:
        """One report: the THRUST_METRICS line, the same row in metrics.jsonl and TensorBoard."""
        emit("THRUST_METRICS", row)
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()
        if self.writer is not None:
            for k, v in row.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.writer.add_scalar(k, v, row["step"])
        if self.progress is not None:
            self.progress.update(self.task, completed=row["step"])

    def stop_progress(self) -> None:
        if self.progress is not None:
            self.progress.stop()

    def close(self) -> None:
        self.file.close()
        if self.writer is not None:
            self.writer.close()
