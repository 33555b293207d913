"""`agent place-checkpoint --src FILE --root TREE --cwd DIR --at REL [--sha256 HEX]`: a resumed run's
checkpoint put where its job reads it (a job's `resume: {checkpoint_at: REL}`, run/resume.py).

REL is taken from DIR (the job's working directory) and judged after its links are resolved: a place
that leaves TREE (the run's own tree) through a link is refused, and nothing is made outside it. The
file is copied (never linked: a job that saves over its checkpoint in place would write through a link
into the run it continues) to a temporary name beside the final one, hashed as it is written, fsynced,
and renamed only when its sha256 is the one given: a reader finds the whole checkpoint or none.
Answer: {"path", "sha256", "bytes"}, or {"error", "why"} when refused (exit 0: the laptop words it).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys

CHUNK = 1 << 20
OUTSIDE = "outside"  # the answer's "why": the place is not a file inside the run's tree (the config's to fix)
CHANGED = "changed"  # the answer's "why": the bytes are not the verified checkpoint's (nothing was placed)


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def place(src: str, root: str, cwd: str, at: str, sha256: str | None) -> dict[str, object]:
    tree = os.path.realpath(root)
    final = os.path.realpath(os.path.join(cwd, at))  # every link on the way resolved, the file's own too
    if not within(final, tree) or final == tree:
        return {"error": f"{at} leaves the run's tree {tree} (it resolves to {final})", "why": OUTSIDE}
    if os.path.isdir(final):
        return {"error": f"{at} is a directory in the run's tree ({final})", "why": OUTSIDE}
    parent = os.path.dirname(final)
    _make_inside(parent, tree)
    tmp = f"{final}.thrust-part.{os.getpid()}"
    digest, size = hashlib.sha256(), 0
    try:
        with open(src, "rb") as inp, open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
            while chunk := inp.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if sha256 and got != sha256:
            os.unlink(tmp)
            return {"error": f"the checkpoint {src} is not the verified one (sha256 {got[:12]}, verified "
                             f"{sha256[:12]})", "why": CHANGED}
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return {"path": final, "sha256": got, "bytes": size}


def _make_inside(parent: str, tree: str) -> None:
    """The directories up to `parent` made one by one (0700), each checked to resolve inside `tree`:
    the resolved path was inside when judged, and a directory made since is still looked at."""
    missing = []
    here = parent
    while not os.path.isdir(here):
        missing.append(here)
        here = os.path.dirname(here)
    for path in reversed(missing):
        os.mkdir(path, 0o700)
        if not within(os.path.realpath(path), tree):
            raise OSError(f"{path} resolves outside {tree}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent place-checkpoint")
    parser.add_argument("--src", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--cwd", required=True)
    parser.add_argument("--at", required=True)
    parser.add_argument("--sha256")
    args = parser.parse_args(argv)
    try:
        answer = place(args.src, args.root, args.cwd, args.at, args.sha256)
    except OSError as exc:
        answer = {"error": f"{type(exc).__name__}: {exc}", "why": OUTSIDE if "resolves outside" in str(exc) else ""}
    sys.stdout.write(json.dumps(answer) + "\n")
    return 0
