"""The torch probe's child program: `import torch`, CUDA init, a matmul, a utilization sample.

Runs in its own interpreter (torchprobe.TorchProbe passes this file's source to `python -c`, so it
also works from inside the zipapp) with a deadline, so a missing, broken or hanging torch is a fact
and never a crash. Standard library (and torch) only, Python 3.8+.

What it prints: a JSON line on stdout at every stage (the facts so far) and "stage: X" on stderr, so
a probe killed at its deadline still says what it learned and where it hung (import torch vs. CUDA
init vs. the kernel). The last line has stage "done" (or "failed": no torch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Out:
    def __init__(self) -> None:
        self.t0 = time.time()
        self.data: dict = {"ok": False}

    def stage(self, name: str) -> None:
        # progress goes out as it happens: a probe killed at its deadline still tells what it learned
        self.data["stage"] = name
        sys.stderr.write("stage: " + name + "\n")
        sys.stderr.flush()
        sys.stdout.write(json.dumps(self.data) + "\n")
        sys.stdout.flush()


def _torch_facts(out: dict, torch, t0: float) -> None:
    out["import_s"] = round(time.time() - t0, 3)
    out["version"] = str(torch.__version__)
    out["file"] = torch.__file__
    out["lib_dir"] = os.path.join(os.path.dirname(torch.__file__), "lib")
    out["cuda_version"] = torch.version.cuda
    try:
        out["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    except Exception:
        out["cxx11_abi"] = None


def _cuda(out: dict, torch) -> None:
    try:
        out["cuda_available"] = bool(torch.cuda.is_available())
        out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    except BaseException as exc:
        out["cuda_available"] = False
        out["device_count"] = 0
        out["cuda_error"] = _err(exc)
    devices = []
    for i in range(out["device_count"]):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "memory_mib": p.total_memory // (1 << 20),
                        "capability": f"{p.major}.{p.minor}"})
    out["devices"] = devices


def _nccl(out: dict, torch) -> None:
    try:
        import torch.distributed as dist

        out["nccl_available"] = bool(dist.is_available() and dist.is_nccl_available())
        v = torch.cuda.nccl.version()
        out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
    except BaseException as exc:
        out["nccl_available"] = False
        out["nccl_error"] = _err(exc)


def _matmul(out: dict, torch) -> None:
    try:
        a = torch.randn(256, 256, device="cuda")
        b = torch.randn(256, 256, device="cuda")
        t = time.time()
        c = a @ b
        torch.cuda.synchronize()
        ms = (time.time() - t) * 1000
        err = (c.cpu() - a.cpu() @ b.cpu()).abs().max().item()
        out["matmul"] = {"ok": err < 1e-1, "ms": round(ms, 3), "max_abs_err": err}
    except BaseException as exc:
        out["matmul"] = {"ok": False, "error": _err(exc)}


def _utilization(out: dict, torch, smi: str) -> None:
    """Queue ~0.5 s of matmuls without waiting, sample nvidia-smi while they run, then sync; the count
    comes from one timed matmul so a T4 and an H100 are both busy for that long."""
    try:
        x = torch.randn(4096, 4096, device="cuda")
        y = x @ x
        torch.cuda.synchronize()
        t = time.time()
        y = x @ x
        torch.cuda.synchronize()
        one = max(time.time() - t, 1e-4)
        n = int(min(2000, max(10, 0.5 / one)))
        for _ in range(n):
            y = x @ x  # noqa: F841 - queued work, not a value
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
        out["gpu_probe"] = {"error": _err(exc)}


def main() -> None:
    # `python -c` puts the cwd first on sys.path, and the parent runs this in the shared temporary
    # directory: a torch.py planted there by anyone must not stand in for the real one
    if sys.path and sys.path[0] in ("", os.getcwd()):
        del sys.path[0]
    probe = Out()
    out = probe.data
    probe.stage("import torch")
    try:
        import torch
    except BaseException as exc:
        out["error"] = _err(exc)
        probe.stage("failed")
        sys.exit(0)
    _torch_facts(out, torch, probe.t0)
    probe.stage("cuda init")
    _cuda(out, torch)
    if out["device_count"] > 1:
        probe.stage("nccl")
        _nccl(out, torch)
    if out["cuda_available"]:
        probe.stage("cuda matmul")
        _matmul(out, torch)
        smi = sys.argv[1] if len(sys.argv) > 1 else ""
        if smi and out["matmul"].get("ok"):
            probe.stage("utilization probe")
            _utilization(out, torch, smi)
    out["ok"] = True
    out["elapsed_s"] = round(time.time() - probe.t0, 3)
    probe.stage("done")
    # skip interpreter teardown: unloading torch costs ~0.3 s and the parent only waits for the exit
    os._exit(0)


if __name__ == "__main__":
    main()
