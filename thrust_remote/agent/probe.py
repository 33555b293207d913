"""Cheap looks at the host's python, without importing torch.

    agent preflight --cache-dir D --extra JSON|-
        the cached envcheck report (JSON, as envcheck printed it) or {"miss": PATH}; `-`: JSON on stdin
    agent missing-modules MODULE...
        ["module", ...]: those the host's python cannot import (find_spec is None)
    agent dist-versions NAME...
        {"name": "version" or null}: the installed distributions' versions, as pip sees them

preflight: what the envcheck report depends on is the interpreter, where torch is installed and when,
the NVIDIA driver and the GPUs visible (plus the caller's `extra`: the job, envcheck's version, the
workdir). While none of that changed, the last passing report of this job is still true, so the
report is looked up under a key made of them; `miss` names where the caller stores a new one.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return None


def cache_key(extra: str) -> str:
    spec = importlib.util.find_spec("torch")
    loc = spec.origin if spec and spec.origin else None
    try:
        gpus: list[str] | None = sorted(os.listdir("/proc/driver/nvidia/gpus"))  # a GPU added or removed
    except OSError:
        gpus = None
    key = {
        "exe": os.path.realpath(sys.executable),
        # venvs share their base's executable; the report names the venv (python_path) and may see
        # other packages there, so each venv is its own entry
        "prefix": sys.prefix,
        "version": sys.version,
        "torch": loc,
        "torch_mtime": _mtime(os.path.join(os.path.dirname(loc), "version.py")) if loc else None,
        "driver": _read("/proc/driver/nvidia/version"),
        "gpus": gpus,
        "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "extra": extra,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]


def preflight(cache_dir: str, extra: str) -> str:
    path = os.path.join(cache_dir, f"preflight-{cache_key(extra)}.json")
    cached = _read(path)
    return cached if cached is not None else json.dumps({"miss": path})


def missing_modules(names: list[str]) -> list[str]:
    return [m for m in names if importlib.util.find_spec(m) is None]


def dist_versions(names: list[str]) -> dict[str, str | None]:
    import importlib.metadata

    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("preflight")
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--extra", default="")
    p = sub.add_parser("missing-modules")
    p.add_argument("modules", nargs="*")
    p = sub.add_parser("dist-versions")
    p.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    if args.cmd == "preflight":
        print(preflight(args.cache_dir, sys.stdin.read() if args.extra == "-" else args.extra))
    elif args.cmd == "dist-versions":
        print(json.dumps(dist_versions(args.names)))
    else:
        print(json.dumps(missing_modules(args.modules)))
    return 0
