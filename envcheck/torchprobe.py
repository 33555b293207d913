"""The torch probe: `import torch` (and CUDA init, a matmul, a utilization sample) in a child
process with a deadline, so a missing, broken or hanging torch is a fact and never a crash.

Kept apart from the other probes, with light imports only, so the CLI can start the child before it
imports the rest of envcheck: `import torch` (~1 s) is the critical path of the whole report.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Where nvidia-smi lives when it is not on a non-interactive SSH session's PATH.
NVIDIA_SMI_PLACES = ("/usr/bin/nvidia-smi", "/usr/local/nvidia/bin/nvidia-smi", "/usr/lib/wsl/lib/nvidia-smi")


def find_program(name: str, places: tuple = ()) -> tuple[str | None, bool]:
    """(path, on_path): found on PATH, or in a well-known place a non-login shell's PATH misses."""
    found = shutil.which(name)
    if found:
        return found, True
    for place in places:
        if os.access(place, os.X_OK):
            return place, False
    return None, False


def start(timeout: float, python: str | None = None) -> TorchProbe:
    """Start the child now; collect it later with .result()."""
    smi, _ = find_program("nvidia-smi", NVIDIA_SMI_PLACES)
    return TorchProbe(python or sys.executable, smi, timeout)


def child_source() -> str:
    """The child program (torch_child.py) as text for `python -c`: read through the package loader,
    so it works from the zipapp as well as from a checkout."""
    import pkgutil

    data = pkgutil.get_data(__package__ or "envcheck", "torch_child.py")
    if data is None:
        raise OSError("envcheck/torch_child.py is missing")
    return data.decode("utf-8")


class TorchProbe:
    """The torch child process: started at once, collected with a deadline."""

    def __init__(self, python: str, nvidia_smi: str | None, timeout: float) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        try:
            self.proc = subprocess.Popen(
                [python, "-c", child_source(), nvidia_smi or ""],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                # a neutral cwd: a `torch/` directory in the workdir must not shadow the real one
                cwd=tempfile.gettempdir(),
                start_new_session=True,  # so a hung CUDA init can be killed with its helpers
            )
        except OSError as exc:
            self.error = f"could not start {python}: {exc}"

    def result(self) -> dict:
        if self.proc is None:
            return {"ok": False, "error": self.error, "stage": "start"}
        left = max(0.1, self.timeout - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                self.proc.kill()
            try:
                out, err = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # a grandchild stuck in the driver keeps the pipe open
                out, err = b"", b""
            data = _last_json(out) or {}
            stage = data.get("stage") or "start"
            data.update(
                ok=False,
                timed_out=True,
                error=f"torch probe timed out after {self.timeout:g} s during {stage!r}",
            )
            return data
        data = _last_json(out)
        if data is None or data.get("stage") not in ("done", "failed"):
            tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
            partial = data or {}
            stage = partial.get("stage") or "start"
            code = self.proc.returncode
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            return {
                **partial,
                "ok": False,
                "crashed": True,
                "error": f"torch probe died ({how}) during {stage!r}: " + " | ".join(
                    t for t in tail if not t.startswith("stage: ")),
            }
        data["wall_s"] = round(time.monotonic() - self.started, 3)
        return data


def _last_json(out: bytes) -> dict | None:
    for line in reversed(out.decode("utf-8", "replace").strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


