"""The torch probe: `import torch` (and CUDA init, a matmul, a utilization sample) in a child
process with a deadline, so a missing, broken or hanging torch is a fact and never a crash.

Kept apart from the other probes, with light imports only, so the CLI can start the child before it
imports the rest of envcheck: `import torch` (1-2 s) is the critical path of the whole report.

A probe that found nothing wrong is kept (`--cache-dir`) and reused for REUSE_S while nothing its
answer depends on changed: the interpreter, every directory on its sys.path (an install or upgrade
writes there), torch's own files, the environment variables that steer the import or CUDA, the NVIDIA
driver, the GPUs and device nodes, and the boot. A failing probe is never reused: a fix shows at once.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
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


# How long a passing probe is reused. A GPU can go bad with nothing above changing (it falls off the
# bus, another user takes it in exclusive mode): nvidia-smi, run fresh on every report, shows most of
# that, and this bound the rest.
REUSE_S = 600.0
# What steers `import torch` or CUDA init besides the files: a change to any variable with one of these
# prefixes (or HOME) is a new probe. Prefixes, not names: torch and CUDA read many, and new ones come.
STEERING_PREFIXES = ("PYTHON", "LD_", "CUDA_", "PYTORCH_", "TORCH_", "NVIDIA_", "NCCL_", "HIP_", "ROCR_")


def start(timeout: float, python: str | None = None, cache_dir: str | None = None,
          fresh: bool = False) -> TorchProbe | ReusedProbe:
    """Start the child now (collect it later with .result()), or reuse a kept probe from cache_dir
    when nothing it depends on changed (fresh: never reuse, but keep this one)."""
    smi, _ = find_program("nvidia-smi", NVIDIA_SMI_PLACES)
    python = python or sys.executable
    kept = None
    if cache_dir and python == sys.executable:  # depends_on describes this interpreter
        kept = os.path.join(os.path.expanduser(cache_dir), f"torch-probe-{_digest(_identity(python))}.json")
        reused = None if fresh else ReusedProbe.load(kept, smi)
        if reused is not None:
            return reused
    return TorchProbe(python, smi, timeout, kept)


def _identity(python: str) -> list:
    """What a record is filed under: the interpreter and what steers it (the account, the variables). An
    account's ssh sessions and its jobs or a local run (other groups, a PYTHON* variable set) are two
    environments of one python; keyed by the interpreter alone, each probe replaced the other's record,
    so neither was ever reused while both came by turns."""
    return [python, sys.prefix, _steering_env(), _account()]


def _steering_env() -> dict:
    return {k: v for k, v in os.environ.items() if k == "HOME" or k.startswith(STEERING_PREFIXES)}


def _account() -> list:
    return [os.getuid(), sorted(os.getgroups())]


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _stat(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino]


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _node(path: str) -> list[int] | None:
    """A device node's identity and who may open it (a chmod or chgrp of /dev/nvidia0 matters)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_rdev, st.st_mode, st.st_uid, st.st_gid]


def depends_on(smi: str | None, torch_file: str | None) -> dict:
    """Everything a passing probe's answer depends on, as comparable data (stats, not contents: this
    runs on every report and must cost milliseconds)."""
    import site

    exe = os.path.realpath(sys.executable)
    # this process's sys.path is the child's (same interpreter and environment) but for its first
    # entry: the zipapp or script here, the child's temporary cwd there
    dirs = [*sys.path[1:], site.getusersitepackages()]
    torch_dir = os.path.dirname(torch_file) if torch_file else None
    torch_files = ([torch_dir, os.path.join(torch_dir, "lib"), torch_file, os.path.join(torch_dir, "version.py")]
                   if torch_dir else [])
    try:
        gpus: list[str] | None = sorted(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        gpus = None
    env = _steering_env()
    # where the dynamic loader finds libcuda and the rest: a driver package upgraded without a reboot
    # (the kernel module's /proc version unchanged) reruns ldconfig and rewrites its files
    libs = ["/etc/ld.so.cache", *filter(None, env.get("LD_LIBRARY_PATH", "").split(":"))]
    return {
        "python": [exe, _stat(exe), sys.prefix, sys.version],
        "paths": {d: _stat(d) for d in dirs if d},
        "torch": {f: _stat(f) for f in torch_files},
        "env": env,
        "account": _account(),
        "libs": {d: _stat(d) for d in libs},
        "driver": _read("/proc/driver/nvidia/version"),
        "gpus": gpus,
        "dev": {d: _node(d) for d in sorted(glob.glob("/dev/nvidia*"))},
        "boot": _read("/proc/sys/kernel/random/boot_id"),
        "nvidia_smi": smi,
        "child": _digest(child_source()),
    }


def _without_torch(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "torch"}


def passing(data: dict, smi: str | None) -> bool:
    """The probe found nothing wrong: torch imported and, where there is a GPU, CUDA worked."""
    if data.get("stage") != "done" or not data.get("ok") or not data.get("version"):
        return False
    if data.get("cuda_error") or data.get("nccl_error"):
        return False
    if data.get("cuda_available"):
        sample = data.get("gpu_probe")  # a utilization warning is looked at again each time too
        return bool((data.get("matmul") or {}).get("ok")) and not (
            sample and ("error" in sample or (sample.get("samples") and not sample.get("max_pct"))))
    # a driver or GPU that torch cannot use is a failure to look at again each time
    return not smi and not glob.glob("/dev/nvidia[0-9]*")


def forget(path: str) -> None:
    """A probe that did not pass: the record of an earlier pass must not answer for it next time."""
    with contextlib.suppress(OSError):
        os.unlink(path)


def keep(path: str, data: dict, smi: str | None, before: dict) -> None:
    """Write the record under a temporary name, then rename: a reader sees a whole record or none.
    Only when nothing it depends on changed while the probe ran (`before`: depends_on at its start,
    torch's files aside): an install that lands mid-probe is not vouched for by the old import.
    Best effort: a probe that cannot be kept is only slower next time."""
    state = json.loads(json.dumps(depends_on(smi, data.get("file"))))
    if _without_torch(state) != before:
        forget(path)
        return
    record = {"at": time.time(), "depends_on": state, "result": data}
    _prune(os.path.dirname(path))
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _prune(cache_dir: str) -> None:
    """Records past REUSE_S are never read again (one per interpreter would otherwise pile up), nor
    is the temporary file of an envcheck killed while it wrote one."""
    for old in glob.glob(os.path.join(cache_dir, "torch-probe-*.json*")):
        with contextlib.suppress(OSError):
            if time.time() - os.stat(old).st_mtime > REUSE_S:
                os.unlink(old)


class ReusedProbe:
    """A kept probe whose dependencies are unchanged: .result() is its answer, marked `reused`."""

    def __init__(self, data: dict) -> None:
        self.data = data

    @classmethod
    def load(cls, path: str, smi: str | None) -> ReusedProbe | None:
        try:
            return cls._load(path, smi)
        except Exception:  # a damaged or hand-edited record is no record: probe again
            return None

    @classmethod
    def _load(cls, path: str, smi: str | None) -> ReusedProbe | None:
        text = _read(path)
        record = json.loads(text) if text else None
        if not isinstance(record, dict) or not isinstance(record.get("result"), dict):
            return None
        data = record["result"]
        age = time.time() - float(record.get("at") or 0)
        if not 0 <= age < REUSE_S or not passing(data, smi):
            return None
        if record.get("depends_on") != json.loads(json.dumps(depends_on(smi, data.get("file")))):
            return None
        data["reused"] = {"age_s": round(age, 1), "wall_s": data.get("wall_s")}
        data["wall_s"] = 0.0  # this report's cost of it
        return cls(data)

    def result(self) -> dict:
        return self.data


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

    def __init__(self, python: str, nvidia_smi: str | None, timeout: float, kept: str | None = None) -> None:
        self.timeout = timeout
        self.smi = nvidia_smi
        self.kept = kept  # where a passing answer is kept for the next report
        self.before = _without_torch(json.loads(json.dumps(depends_on(nvidia_smi, None)))) if kept else {}
        self.started = time.monotonic()
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        try:
            self.proc = subprocess.Popen(
                [python, "-c", child_source(), nvidia_smi or ""],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                # a neutral cwd: a `torch/` directory in the workdir must not shadow the real one (and
                # the child drops its cwd from sys.path anyway: /tmp is anyone's to write in)
                cwd=tempfile.gettempdir(),
                start_new_session=True,  # so a hung CUDA init can be killed with its helpers
            )
        except OSError as exc:
            self.error = f"could not start {python}: {exc}"

    def result(self) -> dict:
        data = self._collect()
        if self.kept and passing(data, self.smi):
            keep(self.kept, data, self.smi, self.before)
        elif self.kept:
            forget(self.kept)
        return data

    def _collect(self) -> dict:
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


