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



# What the child prints: a JSON line on stdout at every stage (the facts so far) and "stage: X" on
# stderr, so a probe killed at its deadline still says what it learned and where it hung (import
# torch vs. CUDA init vs. the kernel). The last line has stage "done" (or "failed": no torch).
TORCH_PROBE = r"""
import json, os, subprocess, sys, time
t0 = time.time()
out = {"ok": False}
def stage(name):
    # progress goes out as it happens: a probe killed at its deadline still tells what it learned
    out["stage"] = name
    sys.stderr.write("stage: " + name + "\n")
    sys.stderr.flush()
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
stage("import torch")
try:
    import torch
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
    stage("failed"); sys.exit(0)
out["import_s"] = round(time.time() - t0, 3)
out["version"] = str(torch.__version__)
out["file"] = torch.__file__
out["lib_dir"] = os.path.join(os.path.dirname(torch.__file__), "lib")
out["cuda_version"] = torch.version.cuda
try:
    out["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
except Exception:
    out["cxx11_abi"] = None
stage("cuda init")
try:
    out["cuda_available"] = bool(torch.cuda.is_available())
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
except BaseException as exc:
    out["cuda_available"] = False
    out["device_count"] = 0
    out["cuda_error"] = "%s: %s" % (type(exc).__name__, exc)
devices = []
for i in range(out["device_count"]):
    p = torch.cuda.get_device_properties(i)
    devices.append({"index": i, "name": p.name, "memory_mib": p.total_memory // (1 << 20),
                    "capability": "%d.%d" % (p.major, p.minor)})
out["devices"] = devices
if out["device_count"] > 1:
    stage("nccl")
    try:
        import torch.distributed as dist
        out["nccl_available"] = bool(dist.is_available() and dist.is_nccl_available())
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except BaseException as exc:
        out["nccl_available"] = False
        out["nccl_error"] = "%s: %s" % (type(exc).__name__, exc)
if out["cuda_available"]:
    stage("cuda matmul")
    try:
        a = torch.randn(256, 256, device="cuda"); b = torch.randn(256, 256, device="cuda")
        t = time.time(); c = a @ b; torch.cuda.synchronize()
        ms = (time.time() - t) * 1000
        err = (c.cpu() - a.cpu() @ b.cpu()).abs().max().item()
        out["matmul"] = {"ok": err < 1e-1, "ms": round(ms, 3), "max_abs_err": err}
    except BaseException as exc:
        out["matmul"] = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
    smi = sys.argv[1] if len(sys.argv) > 1 else ""
    if smi and out["matmul"].get("ok"):
        stage("utilization probe")
        # queue ~0.5 s of matmuls without waiting, sample nvidia-smi while they run, then sync;
        # the count comes from one timed matmul so a T4 and an H100 are both busy for that long
        try:
            x = torch.randn(4096, 4096, device="cuda")
            y = x @ x; torch.cuda.synchronize()
            t = time.time(); y = x @ x; torch.cuda.synchronize()
            one = max(time.time() - t, 1e-4)
            n = int(min(2000, max(10, 0.5 / one)))
            for _ in range(n):
                y = x @ x
            samples = []
            for _ in range(2):
                time.sleep(0.12)
                r = subprocess.run([smi, "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=5)
                for line in r.stdout.splitlines():
                    parts = [p.strip() for p in line.split(",")]
                    if len(parts) == 2 and parts[1].isdigit():
                        samples.append({"index": int(parts[0]), "utilization_pct": int(parts[1])})
            torch.cuda.synchronize()
            out["gpu_probe"] = {"samples": samples, "matmuls": n, "matmul_ms": round(one * 1000, 3),
                                "max_pct": max([s["utilization_pct"] for s in samples] or [0])}
        except BaseException as exc:
            out["gpu_probe"] = {"error": "%s: %s" % (type(exc).__name__, exc)}
out["ok"] = True
out["elapsed_s"] = round(time.time() - t0, 3)
stage("done")
# skip interpreter teardown: unloading torch costs ~0.3 s and the parent only waits for the exit
os._exit(0)
"""


class TorchProbe:
    """The torch child process: started at once, collected with a deadline."""

    def __init__(self, python: str, nvidia_smi: str | None, timeout: float) -> None:
        self.timeout = timeout
        self.started = time.monotonic()
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        try:
            self.proc = subprocess.Popen(
                [python, "-c", TORCH_PROBE, nvidia_smi or ""],
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


