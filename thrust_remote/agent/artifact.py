"""`agent stage-artifact --src S --run-dir R --job J`: a cargo job's model into its run directory.

Copies S to R/model.onnx and writes R/manifest.json ({"sha256", "bytes", "job", "source"}), so the
laptop fetches a cargo run exactly like a python one (docs/architecture.md, "The run directory on the host").
Answer: the manifest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys

from .files import write_atomic
from .protocol import MANIFEST, MODEL


def stage(src: str, run_dir: str, job: str) -> dict:
    dst = os.path.join(run_dir, MODEL)
    shutil.copyfile(src, dst)
    digest = hashlib.sha256()
    size = 0
    with open(dst, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
            size += len(block)
    manifest = {"sha256": digest.hexdigest(), "bytes": size, "job": job, "source": src}
    write_atomic(os.path.join(run_dir, MANIFEST), json.dumps(manifest).encode())
    return manifest


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent stage-artifact")
    parser.add_argument("--src", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--job", required=True)
    args = parser.parse_args(argv)
    try:
        manifest = stage(args.src, args.run_dir, args.job)
    except OSError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    print(json.dumps(manifest))
    return 0
