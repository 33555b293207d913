"""The build and run environment of a job, computed from the host's facts (standard library only).

This is the one definition of the tch-rs environment people otherwise type by hand (LIBTORCH_USE_PYTORCH,
LD_LIBRARY_PATH, LD_PRELOAD, RUSTFLAGS with -Wl,--no-as-needed).
envcheck uses it on the host to judge the environment and to fingerprint a build;
thrust_remote.run.buildenv re-exports it for the train pipeline on the laptop. Both sides therefore
agree on what "the right env" and "the same env as the last build" mean.

Why each cargo variable:
- LIBTORCH_USE_PYTORCH=1: torch-sys links the libtorch inside the host's PyTorch wheel.
- LD_LIBRARY_PATH=<torch>/lib first: the binary finds libtorch*.so at run time.
- LD_PRELOAD=<torch>/lib/libtorch_cuda.so:<torch>/lib/libtorch.so (CUDA wheels only): loads the CUDA
  half of libtorch even when the binary's NEEDED list lost it.
- RUSTFLAGS: `-C link-arg=-Wl,--no-as-needed` alone does nothing for libtorch, because rustc puts
  link-args *after* the `-l` libraries (verified with `--print link-args`). So the flags also name
  libtorch (and libtorch_cuda) after it, with `-L native=<lib>` to find them, and an rpath so the
  binary runs without LD_LIBRARY_PATH.
"""

from __future__ import annotations

import hashlib
import json
import os

TORCH_LIBS = ("libtorch.so", "libtorch_cpu.so", "libtorch_cuda.so", "libc10.so", "libc10_cuda.so")
CUDA_LIBS = ("libtorch_cuda.so", "libc10_cuda.so")

# Written by the train pipeline after a successful cargo build, beside the build's outputs, so that
# `cargo clean` removes it together with what it describes.
FINGERPRINT_FILE = ".thrust-build-env.json"
FINGERPRINT_VERSION = 1
# What torch-sys' build script and the linker read: a change in any of them needs `cargo clean`.
# LD_LIBRARY_PATH is left out on purpose: it only matters at run time and varies between sessions.
FINGERPRINT_ENV_KEYS = (
    "LIBTORCH_USE_PYTORCH", "LIBTORCH", "LIBTORCH_BYPASS_VERSION_CHECK", "LIBTORCH_CXX11_ABI", "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS", "LD_PRELOAD",
)


def torch_lib_dir(facts: dict) -> str | None:
    return (facts.get("torch_probe") or {}).get("lib_dir")


def has_cuda_libs(facts: dict) -> bool:
    libs = (facts.get("torch_probe") or {}).get("libs") or {}
    return bool(libs.get("libtorch_cuda.so"))


def rustflags(lib_dir: str, cuda: bool) -> list[str]:
    """The link flags, as separate arguments (order matters: --no-as-needed, then the libraries)."""
    flags = [
        "-C", "link-arg=-Wl,--no-as-needed",
        "-L", f"native={lib_dir}",
        "-C", f"link-arg=-Wl,-rpath,{lib_dir}",
        "-C", "link-arg=-ltorch",
    ]
    if cuda:
        flags += ["-C", "link-arg=-ltorch_cuda"]
    return flags


def _prepend_path(first: str, rest: str | None) -> str:
    parts = [first] + [p for p in (rest or "").split(os.pathsep) if p and p != first]
    return os.pathsep.join(parts)


def cargo_env(facts: dict, job: dict) -> dict:
    """Variables to set for `cargo build` and for running the built binary (one env for both).

    job is the job's config as a dict (kind, toolchain, example, crate, args, env,
    bypass_version_check...). job["env"] entries win, except RUSTFLAGS (appended after ours) and
    LD_LIBRARY_PATH (after torch's lib), so a user's extra flags cannot silently drop the fix.
    """
    host_env = facts.get("env") or {}
    job_env = dict(job.get("env") or {})
    env = {"LIBTORCH_USE_PYTORCH": "1"}
    lib = torch_lib_dir(facts)
    if lib:
        cuda = has_cuda_libs(facts)
        extra_ld = job_env.pop("LD_LIBRARY_PATH", None)
        rest = [p for p in (extra_ld, host_env.get("LD_LIBRARY_PATH")) if p]
        env["LD_LIBRARY_PATH"] = _prepend_path(lib, os.pathsep.join(rest))
        if cuda:
            env["LD_PRELOAD"] = os.pathsep.join(
                [os.path.join(lib, "libtorch_cuda.so"), os.path.join(lib, "libtorch.so")]
                + [p for p in (job_env.pop("LD_PRELOAD", None) or "").split(os.pathsep) if p]
            )
        flags = rustflags(lib, cuda)
        extra = job_env.pop("RUSTFLAGS", None)
        if any(any(c.isspace() for c in f) for f in flags):
            # RUSTFLAGS splits on spaces; a torch path with a space needs cargo's encoded form
            env["CARGO_ENCODED_RUSTFLAGS"] = "\x1f".join(flags + (extra.split() if extra else []))
        else:
            env["RUSTFLAGS"] = " ".join(flags + ([extra] if extra else []))
    if job.get("bypass_version_check"):
        env["LIBTORCH_BYPASS_VERSION_CHECK"] = "1"
    env.update({k: str(v) for k, v in job_env.items()})
    return env


def python_env(facts: dict, job: dict) -> dict:
    """Env for a python job: unbuffered output (the log is followed live) and tracebacks on crashes."""
    env = {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    env.update({k: str(v) for k, v in (job.get("env") or {}).items()})
    return env


def job_env(facts: dict, job: dict) -> dict:
    return cargo_env(facts, job) if job.get("kind") == "cargo" else python_env(facts, job)


def target_dir(crate_dir: str, job: dict, host_env: dict) -> str:
    """Where cargo writes: CARGO_TARGET_DIR from the job's env, else the host's, else <crate>/target."""
    value = (job.get("env") or {}).get("CARGO_TARGET_DIR") or host_env.get("CARGO_TARGET_DIR")
    if not value:
        return os.path.join(crate_dir, "target")
    return os.path.normpath(os.path.join(crate_dir, os.path.expanduser(value)))


def fingerprint_inputs(facts: dict, job: dict, env: dict | None = None) -> dict:
    """`env`: the job's cargo_env when the caller has it already (it is not made twice)."""
    probe = facts.get("torch_probe") or {}
    env = cargo_env(facts, job) if env is None else env
    return {
        "torch": probe.get("version"),
        "torch_lib": probe.get("lib_dir"),
        "torch_cuda": probe.get("cuda_version"),
        "cxx11_abi": probe.get("cxx11_abi"),
        "toolchain": job.get("toolchain") or "stable",
        "profile": "release",
        "env": {k: env[k] for k in FINGERPRINT_ENV_KEYS if k in env},
    }


def fingerprint(facts: dict, job: dict, env: dict | None = None) -> dict:
    """{'version', 'digest', 'inputs'}: what the train pipeline writes after a build, and what
    envcheck compares the stored one against. Same facts + same job -> same digest."""
    inputs = fingerprint_inputs(facts, job, env)
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()
    return {"version": FINGERPRINT_VERSION, "digest": digest, "inputs": inputs}


def fingerprint_diff(stored: dict, current: dict) -> list[str]:
    """Human-readable differences between two fingerprints' inputs ('torch: 2.9.0 -> 2.13.0')."""
    a, b = stored.get("inputs") or {}, current.get("inputs") or {}
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "env":
            ea, eb = a.get("env") or {}, b.get("env") or {}
            for k in sorted(set(ea) | set(eb)):
                if ea.get(k) != eb.get(k):
                    out.append(f"{k}: {ea.get(k)!r} -> {eb.get(k)!r}")
        elif a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} -> {b.get(key)!r}")
    return out


def without_env_values(job: dict) -> dict:
    """The job with its `env:` reduced to the names (`env_names`): what a report or a cache key may keep
    (values may be secrets; envcheck's checks of a job that is not cargo never read them)."""
    out = {k: v for k, v in job.items() if k != "env"}
    if job.get("env"):
        out["env_names"] = sorted(job["env"])
    return out


def cargo_bin(facts: dict) -> str:
    return (facts.get("rust") or {}).get("cargo") or "cargo"


def cargo_build_argv(facts: dict, job: dict) -> list[str]:
    """`cargo +TOOLCHAIN build --release --example X` (run it with cwd = the crate directory)."""
    argv = [cargo_bin(facts)]
    toolchain = job.get("toolchain")
    if toolchain and (facts.get("rust") or {}).get("rustup"):
        argv.append(f"+{toolchain}")  # `+x` is a rustup proxy feature; plain cargo rejects it
    argv += ["build", "--release"]
    if job.get("example"):
        argv += ["--example", job["example"]]
    return argv


def binary_path(facts: dict, job: dict) -> str | None:
    crate = facts.get("crate") or {}
    if crate.get("binary"):
        return crate["binary"]
    if not job.get("example"):
        return None
    crate_dir = crate.get("dir") or os.path.join((facts.get("workdir") or {}).get("path", "."), job.get("crate") or ".")
    return os.path.join(target_dir(crate_dir, job, facts.get("env") or {}), "release", "examples", job["example"])


def cargo_run_argv(facts: dict, job: dict) -> list[str]:
    """The built example itself plus the job's args (no `cargo run`: no second build check, and
    LD_PRELOAD then applies to the trainer only)."""
    binary = binary_path(facts, job)
    if not binary:
        raise ValueError("a cargo job needs an example")
    return [binary, *[str(a) for a in (job.get("args") or ())]]
