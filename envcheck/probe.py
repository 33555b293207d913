"""Collect the host's facts. Every probe has a timeout and never raises: a failure is a fact.

`import torch` (~1 s) dominates, so the torch child process starts first and every other probe
(nvidia-smi, rustup, git, the crate's files) runs in threads while it imports.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from . import buildenv, elf, nvsmi
from .torchprobe import NVIDIA_SMI_PLACES, ReusedProbe, TorchProbe, find_program
from .torchprobe import start as start_torch_probe

ENV_KEYS = (
    "PATH", "HOME", "USER", "LD_LIBRARY_PATH", "LD_PRELOAD", "RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS",
    "LIBTORCH_USE_PYTORCH", "LIBTORCH", "LIBTORCH_BYPASS_VERSION_CHECK", "LIBTORCH_CXX11_ABI",
    "CUDA_VISIBLE_DEVICES", "CARGO_TARGET_DIR", "CARGO_HOME", "RUSTUP_HOME", "VIRTUAL_ENV", "CONDA_PREFIX",
)

def run_cmd(argv: list[str], timeout: float = 5.0, cwd: str | None = None, env: dict | None = None) -> dict:
    """Run argv; return {'rc', 'out', 'err'} — a missing program is rc 127, a timeout rc 124."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        return {"rc": 127, "out": "", "err": f"{argv[0]}: not found"}
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"rc": 124, "out": out, "err": f"timed out after {timeout:g} s"}
    except OSError as exc:
        return {"rc": 126, "out": "", "err": f"{argv[0]}: {exc}"}
    return {"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr}


def torch_libs(lib_dir: str | None) -> dict:
    return {name: bool(lib_dir) and os.path.exists(os.path.join(lib_dir, name)) for name in buildenv.TORCH_LIBS}


def probe_nvidia_smi() -> dict:
    path, on_path = find_program("nvidia-smi", NVIDIA_SMI_PLACES)
    dev_nodes = sorted(glob.glob("/dev/nvidia[0-9]*"))
    base = {"path": path, "on_path": on_path, "dev_nodes": len(dev_nodes)}
    if not path:
        return {**base, "found": False, "exit_code": None, "gpus": [], "gpu_count": 0, "driver_version": None,
                "mig": False, "error": "nvidia-smi not found"}
    query = run_cmd([path, *nvsmi.QUERY_ARGV[1:]], timeout=10)
    listing = run_cmd([path, *nvsmi.LIST_ARGV[1:]], timeout=10) if query["rc"] == 0 else {"out": ""}
    summary = nvsmi.summarize(query["out"] or query["err"], query["rc"], listing["out"])
    # the header's "CUDA Version" picks the PyTorch wheel index in doctor's fixes (checks.wheel_tag)
    header = run_cmd([path], timeout=10) if summary["gpus"] else {"out": ""}
    summary["cuda_version"] = nvsmi.parse_cuda_version(header["out"])
    return {**base, "found": True, "exit_code": query["rc"], **summary}


def probe_rust(workdir: str) -> dict:
    home = os.path.expanduser("~")
    cargo_bin = os.path.join(os.environ.get("CARGO_HOME") or os.path.join(home, ".cargo"), "bin")
    cargo, cargo_on_path = find_program("cargo", (os.path.join(cargo_bin, "cargo"),))
    rustup, _ = find_program("rustup", (os.path.join(cargo_bin, "rustup"),))
    out: dict = {"cargo": cargo, "cargo_on_path": cargo_on_path, "rustup": rustup, "toolchains": [],
                 "default_toolchain": None, "error": None}
    if rustup:
        # cwd matters: a rust-toolchain.toml in the crate overrides the default
        env = dict(os.environ, PATH=cargo_bin + os.pathsep + os.environ.get("PATH", ""))
        r = run_cmd([rustup, "toolchain", "list"], timeout=10, env=env,
                    cwd=workdir if os.path.isdir(workdir) else None)
        if r["rc"] == 0:
            for line in r["out"].splitlines():
                parts = line.split()
                if not parts or parts[0].startswith("no"):
                    continue
                out["toolchains"].append(parts[0])
                if "default" in line:
                    out["default_toolchain"] = parts[0]
        else:
            out["error"] = (r["err"] or r["out"]).strip()[:300]
    elif cargo:
        r = run_cmd([cargo, "--version"], timeout=10)
        out["cargo_version"] = r["out"].strip() or None
    return out


def probe_git(workdir: str) -> dict:
    git, _ = find_program("git")
    if not git:
        return {"found": False, "error": "git not found on PATH"}
    if not os.path.isdir(workdir):
        return {"found": True, "path": git, "repo": False, "error": f"workdir {workdir} does not exist yet"}
    r = run_cmd([git, "-C", workdir, "status", "--porcelain=v1", "-b"], timeout=10)
    if r["rc"] != 0:
        return {"found": True, "path": git, "repo": False, "error": (r["err"] or "").strip()[:300]}
    if run_cmd([git, "-C", workdir, "rev-parse", "--verify", "-q", "HEAD"], timeout=10)["rc"] != 0:
        # no commit checked out: a host's store (every run runs in a tree of its own, .thrust/trees), whose
        # branch and untracked .thrust/ say nothing about what runs
        return {"found": True, "path": git, "repo": True, "store": True, "trees": _run_trees(workdir)}
    lines = r["out"].splitlines()
    branch = lines[0][3:] if lines and lines[0].startswith("## ") else None
    return {"found": True, "path": git, "repo": True, "branch": branch, "dirty_files": len(lines) - 1}


def _run_trees(workdir: str) -> int:
    trees = os.path.join(workdir, ".thrust", "trees")
    try:
        return sum(1 for entry in os.scandir(trees) if entry.is_dir())
    except OSError:
        return 0


def probe_disk(workdir: str) -> dict:
    path = workdir
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        usage = shutil.disk_usage(path or "/")
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return {"path": path, "free_bytes": usage.free, "total_bytes": usage.total}


# Where users keep the environment that has torch, relative to their home, in the order doctor
# prefers them (docs/doctor.md, "ssh-python"): venvs first, then conda envs, then conda's base.
HOME_ENV_GLOBS = (
    "venv", ".venv", "*/.venv", "*/venv",
    "miniconda3/envs/*", "anaconda3/envs/*", "miniforge3/envs/*", "miniconda3", "anaconda3", "miniforge3",
)
MAX_OTHER_PYTHONS = 24  # each costs one interpreter start (~30 ms); a home with hundreds of projects is capped


def python_candidates(workdir: str, home: str) -> list[str]:
    """Interpreters a user might mean, most likely first: the workdir's .venv, the environments under
    home (HOME_ENV_GLOBS; `*` skips hidden directories, as a shell does), then the PATH's and system ones."""
    out = [os.path.join(workdir, ".venv", "bin", "python")]
    for pattern in HOME_ENV_GLOBS:
        out += [os.path.join(d, "bin", "python") for d in sorted(glob.glob(os.path.join(home, pattern)))]
    out += [shutil.which("python3"), shutil.which("python"), "/usr/bin/python3", "/usr/local/bin/python3"]
    return [c for c in out if c]


def probe_other_pythons(workdir: str) -> list[dict]:
    """Other interpreters a user might mean, and whether each has torch (find_spec: no import)."""
    me = os.path.abspath(sys.executable)
    seen = {me}
    found = []
    for cand in python_candidates(workdir, os.path.expanduser("~")):
        # abspath, not realpath: a venv's python is a symlink to its base, and they differ in packages
        cand = os.path.abspath(cand)
        if cand in seen or not os.access(cand, os.X_OK):
            continue
        seen.add(cand)
        found.append(cand)
    found = found[:MAX_OTHER_PYTHONS]

    def has_torch(path: str) -> dict:
        r = run_cmd([path, "-c", "import importlib.util as u;s=u.find_spec('torch');print(s.origin if s else '')"],
                    timeout=5)
        return {"path": path, "torch": bool(r["rc"] == 0 and r["out"].strip()), "on_path": path in (
            shutil.which("python3"), shutil.which("python"))}

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(has_torch, found))


def python_env() -> dict:
    """What kind of interpreter this is, for doctor's torch fix: pip may install into a venv or a conda
    env, while a distribution's python refuses (PEP 668's EXTERNALLY-MANAGED) and needs a venv, which
    needs ensurepip (Debian's python3-venv package)."""
    import importlib.util
    import sysconfig

    stdlib = sysconfig.get_paths().get("stdlib") or ""
    return {
        "venv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "conda": os.path.isdir(os.path.join(sys.prefix, "conda-meta")),
        "externally_managed": os.path.isfile(os.path.join(stdlib, "EXTERNALLY-MANAGED")),
        "ensurepip": importlib.util.find_spec("ensurepip") is not None,
    }


_LOCK_PKG_RE = re.compile(r'^\[\[package\]\]\s*\nname\s*=\s*"([^"]+)"\s*\nversion\s*=\s*"([^"]+)"', re.M)


def lock_versions(text: str) -> dict:
    """Cargo.lock -> {name: [versions]} (a lock file may carry several versions of one crate)."""
    versions: dict = {}
    for name, version in _LOCK_PKG_RE.findall(text):
        versions.setdefault(name, []).append(version)
    return versions


def _read(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return None


# --no-as-needed counts only inside a cargo:rustc-link-arg instruction: the same words in a comment
# pass nothing to the linker.
NO_AS_NEEDED_RE = re.compile(r'cargo:rustc-link-arg[^"\n]*--no-as-needed')


def build_rs_state(text: str | None) -> dict:
    """Does build.rs pass --no-as-needed to the linker, and name libtorch after it (what makes it work)?"""
    if text is None:
        return {"exists": False, "no_as_needed": False, "links_torch_after": False}
    m = NO_AS_NEEDED_RE.search(text)
    pos = m.start() if m else -1
    after = text[pos:] if pos >= 0 else ""
    return {
        "exists": True,
        "no_as_needed": pos >= 0,
        "links_torch_after": bool(re.search(r"rustc-link-arg=-l\s*torch", after)),
    }


def probe_crate(workdir: str, job: dict, env: dict) -> dict:
    crate_dir = os.path.normpath(os.path.join(workdir, job.get("crate") or "."))
    out: dict = {"dir": crate_dir, "exists": os.path.isdir(crate_dir)}
    cargo_toml = _read(os.path.join(crate_dir, "Cargo.toml"))
    out["cargo_toml"] = cargo_toml is not None
    build_path = os.path.join(crate_dir, "build.rs")
    if cargo_toml:
        m = re.search(r'^\s*build\s*=\s*"([^"]+)"', cargo_toml, re.M)
        if m:
            build_path = os.path.join(crate_dir, m.group(1))
    out["build_rs_path"] = build_path
    out["build_rs"] = build_rs_state(_read(build_path))
    lock = _read(os.path.join(crate_dir, "Cargo.lock"))
    out["cargo_lock"] = lock is not None
    versions = lock_versions(lock) if lock else {}
    out["tch_lock_versions"] = versions.get("tch", [])
    out["torch_sys_lock_versions"] = versions.get("torch-sys", [])
    pinned = job.get("tch_version") or "auto"
    if pinned != "auto":
        out["tch_version"], out["tch_source"] = pinned, "thrust.yaml tch_version"
    elif out["tch_lock_versions"]:
        out["tch_version"], out["tch_source"] = out["tch_lock_versions"][-1], "Cargo.lock"
    else:
        out["tch_version"], out["tch_source"] = None, None
    target = buildenv.target_dir(crate_dir, job, env)
    out["target_dir"] = target
    out["job_env_target"] = bool((job.get("env") or {}).get("CARGO_TARGET_DIR"))
    out["target_exists"] = os.path.isdir(target)
    example = job.get("example")
    out["binary"] = os.path.join(target, "release", "examples", example) if example else None
    out["debug_binary"] = os.path.join(target, "debug", "examples", example) if example else None
    out["binary_exists"] = bool(out["binary"]) and os.path.isfile(out["binary"])
    out["debug_binary_exists"] = bool(out["debug_binary"]) and os.path.isfile(out["debug_binary"])
    if out["binary_exists"]:
        try:
            out["elf"] = elf.read_dynamic(out["binary"])
        except (OSError, ValueError, IndexError) as exc:
            out["elf"] = {"error": f"{type(exc).__name__}: {exc}"}
    fp_path = os.path.join(target, buildenv.FINGERPRINT_FILE)
    out["fingerprint_path"] = fp_path
    stored = _read(fp_path)
    try:
        out["fingerprint"] = json.loads(stored) if stored else None
    except ValueError:
        out["fingerprint"] = {"error": "unreadable"}
    return out


def collect(
    workdir: str = ".",
    job: dict | None = None,
    host: str | None = None,
    gpus: list[int] | None = None,
    torch_timeout: float = 30.0,
    torch_probe: TorchProbe | ReusedProbe | None = None,
) -> dict:
    """All facts, in one process. Never raises for a broken host: a broken host is what we report.

    torch_probe: one already started (the CLI starts it before importing the rest of envcheck).
    """
    started = time.monotonic()
    if torch_probe is None:
        torch_probe = start_torch_probe(torch_timeout)
    workdir = os.path.abspath(os.path.expanduser(workdir))
    job = job or {}
    env = {k: os.environ[k] for k in ENV_KEYS if k in os.environ}

    results: dict = {}
    lock = threading.Lock()

    def task(name, fn, *args):
        try:
            value = fn(*args)
        except Exception as exc:  # a probe bug must not lose the whole report
            value = {"error": f"probe failed: {type(exc).__name__}: {exc}"}
        with lock:
            results[name] = value

    tasks = [("nvidia_smi", probe_nvidia_smi), ("rust", probe_rust, workdir), ("git", probe_git, workdir),
             ("disk", probe_disk, workdir)]
    if job.get("kind") == "cargo":
        tasks.append(("crate", probe_crate, workdir, job, env))
    with ThreadPoolExecutor(max_workers=len(tasks)) as pool:
        for t in tasks:
            pool.submit(task, *t)
    torch = torch_probe.result()
    if not torch.get("version"):
        # only now: starting four more interpreters would slow the torch import they run beside
        results["other_pythons"] = probe_other_pythons(workdir)
    torch["libs"] = torch_libs(torch.get("lib_dir"))
    if torch.get("libs", {}).get("libtorch.so"):
        try:
            torch["libtorch_needed"] = elf.read_dynamic(
                os.path.join(torch["lib_dir"], "libtorch.so"), scan_symbols=False)["needed"]
        except (OSError, ValueError, IndexError):
            torch["libtorch_needed"] = None

    facts: dict = {
        "envcheck": "1",
        "hostname": socket.gethostname(),
        "host": host or socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "python_path": sys.executable,
        "python_env": python_env(),
        "home": os.path.expanduser("~"),
        "torch": torch.get("version"),
        "cuda_available": torch.get("cuda_available"),
        "torch_probe": torch,
        "env": env,
        "workdir": {"path": workdir, "exists": os.path.isdir(workdir)},
        "gpus_config": gpus,
        "job": buildenv.without_env_values(job) if job else None,  # names only: a report is printed, cached
        **results,
    }
    if "crate" in facts:
        facts["crate"]["current_fingerprint"] = buildenv.fingerprint(facts, job)
    facts["elapsed_s"] = round(time.monotonic() - started, 3)
    return facts
