"""`agent list-files --run-dir R -- GLOB...`: the files a run's artifact globs match on the host.

A glob is relative to the run's cwd (run.json's `cwd`: the host's checkout, a cargo job's crate);
one that starts with `$THRUST_RUN_DIR/` is relative to the run directory R itself. `**` matches any
depth; a directory that matches stands for every file under it. Only regular files are listed, each
once. A match whose real path is outside its base (a symlink out, a `..`) is refused, never listed:
the laptop fetches only what is under the workdir or the run dir (docs/architecture.md, "Artifacts").

Under the cwd (the checkout every run of the workdir shares) only files modified while the run went
are this run's: since it started (run.json's `started_ts`) and, once it has ended, not after its end
(the exit record's `ended_ts`). Older ones were left by an earlier run or came with the checkout
("older"), newer ones by a later run ("newer"); both are counted, not listed, and a glob that
matches only those is "unmatched".

Answer: {"cwd", "files": [{"base": "cwd" | "run", "path" (relative to the base, '/'-separated),
"abs", "size", "mtime", "sha256"}], "unmatched": [GLOB...], "refused": [GLOB or PATH...], "older": N,
"newer": N}.
Exit 2 with {"error"} when R has no run.json.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sys

from .protocol import EXIT_CODE, RUN_DIR_PREFIX, RUN_JSON, AgentExit

BLOCK = 1 << 20


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


class _Real:
    """Real paths with each directory resolved once: one lstat per file, not one per component."""

    def __init__(self) -> None:
        self.dirs: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        parent, name = os.path.split(path)
        real_parent = self.dirs.get(parent)
        if real_parent is None:
            real_parent = self.dirs[parent] = os.path.realpath(parent)
        full = os.path.join(real_parent, name)
        return os.path.realpath(full) if os.path.islink(full) else full


def _candidates(base: str, pattern: str) -> list[str]:
    """The files a glob names under base: its file matches, and every file under a directory match
    (a pattern ending in `**` lists those files itself)."""
    out: list[str] = []
    for match in sorted(glob.glob(os.path.join(glob.escape(base), pattern), recursive=True)):
        if not os.path.isdir(match):
            out.append(match)
        elif not pattern.endswith("**"):
            for root, _dirs, names in os.walk(match):  # symlinked directories are not followed
                out += [os.path.join(root, name) for name in sorted(names)]
    return out


def _bad_glob(pattern: str) -> bool:
    parts = pattern.replace("\\", "/").split("/")
    return not pattern.strip() or pattern.startswith(("/", "~")) or ".." in parts


# file times come from the kernel's coarse clock, which may lag time.time() by a tick or two
MTIME_SLACK_S = 0.05
# the run's last files are written before its process exits and the supervisor records the end: a
# second covers that, and a later run of the same workdir starts after a sync and a launch anyway
ENDED_SLACK_S = 1.0


def list_files(cwd: str, run_dir: str, patterns: list[str], since: float | None = None,
               until: float | None = None) -> dict:
    files: dict[str, dict] = {}
    older: set[str] = set()
    newer: set[str] = set()
    unmatched: list[str] = []
    refused: list[str] = []
    real = _Real()
    for pattern in patterns:
        base_name, base, rel_pattern = "cwd", cwd, pattern
        if pattern.startswith(RUN_DIR_PREFIX):
            base_name, base, rel_pattern = "run", run_dir, pattern[len(RUN_DIR_PREFIX):]
        if _bad_glob(rel_pattern):
            refused.append(pattern)
            continue
        inside = os.path.realpath(base).rstrip(os.sep) + os.sep
        found = 0
        for path in _candidates(base, rel_pattern):
            rel = path[len(base):].lstrip(os.sep)
            if not real(path).startswith(inside) or not os.path.isfile(path):
                if os.path.lexists(path) and not os.path.isdir(path):
                    refused.append(rel)  # a symlink out of its base
                continue
            key = f"{base_name}:{rel}"
            st = os.stat(path)
            if base_name == "cwd" and since is not None and st.st_mtime < since - MTIME_SLACK_S:
                older.add(key)
                continue
            if base_name == "cwd" and until is not None and st.st_mtime > until + ENDED_SLACK_S:
                newer.add(key)
                continue
            found += 1
            if key not in files:
                files[key] = {"base": base_name, "path": rel.replace(os.sep, "/"), "abs": path, "size": st.st_size,
                              "mtime": st.st_mtime, "sha256": sha256_of(path)}
        if not found:
            unmatched.append(pattern)
    return {"cwd": cwd, "files": list(files.values()), "unmatched": unmatched, "refused": refused,
            "older": len(older), "newer": len(newer)}


def _ended_ts(run_dir: str) -> float | None:
    """When the run ended (its exit record), or None while it goes (or when the record is unreadable)."""
    try:
        with open(os.path.join(run_dir, EXIT_CODE)) as fh:
            ended = json.load(fh).get("ended_ts")
    except (OSError, ValueError, AttributeError):
        return None
    return float(ended) if isinstance(ended, int | float) else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent list-files")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("globs", nargs="*")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(args.run_dir)
    try:
        with open(os.path.join(run_dir, RUN_JSON)) as fh:
            meta = json.load(fh)
        cwd, since = meta["cwd"], meta.get("started_ts")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(json.dumps({"error": f"{run_dir}/{RUN_JSON}: {exc}"}))
        return AgentExit.MISSING
    try:
        answer = list_files(os.path.abspath(cwd), run_dir, args.globs, float(since) if since else None,
                            _ended_ts(run_dir))
    except OSError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
