"""`agent list-files --run-dir R [--deadline S] -- GLOB...`: the files a run's artifact globs match on the host.

A glob is relative to the run's cwd (run.json's `cwd`: the host's checkout, a cargo job's crate);
one that starts with `$THRUST_RUN_DIR/` is relative to the run directory R itself. `**` matches any
depth; a directory that matches stands for every file under it. `*`, `?` and `[...]` match names
that start with a dot too (`out/**` lists `out/.hidden`, `out/..foo`): an artifact is whatever the job
wrote. Only regular files are listed, each once.

A run with a tree of its own (run.json's `tree`; docs/architecture.md, "Trees") has every file there
listed. Under a cwd that runs share (the workdir of the layout before trees, a study's trials in the
tree the study was prepared in, as a cargo job's are; a trial's own tree is named as its run) only
files modified while the run went are this run's: since it started (run.json's `started_ts`) and,
once it has ended, not after its end (the exit record's `ended_ts`). Older ones were left by an
earlier run or came with the checkout ("older"), newer ones by a later run ("newer"); both are
counted, not listed, and a glob that matches only those is "unmatched".

The walk itself (links and hostile trees, the deadline, the answer's shape): walk.py. Exit 2 with
{"error"} when R has no run.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .protocol import EXIT_CODE, LOG, RUN_JSON, AgentExit, RunState
from .runjson import load
from .walk import DEADLINE_ERROR, DeadlineHit, list_files


def _ended_ts(run_dir: str, meta: dict) -> float | None:
    """When the run ended: its exit record's time; for a run that ended with none (LOST: its host
    restarted, its supervisor was killed) its log's last write, so a later run's files in the same
    checkout are not taken for its own; None while it goes."""
    try:
        with open(os.path.join(run_dir, EXIT_CODE)) as fh:
            ended = json.load(fh).get("ended_ts")
        return float(ended) if isinstance(ended, (int, float)) else None
    except (OSError, ValueError, AttributeError):
        pass
    from .supervisor import run_state  # only for a run without an exit record: is it still going?

    if RunState.of(run_state(run_dir, meta)["state"]).is_live:
        return None
    try:
        return os.stat(os.path.join(run_dir, LOG)).st_mtime
    except OSError:
        return None


def _trial_shares(run_dir: str, meta: dict) -> bool:
    """A study's trial in a checkout other trials run in too: the tree the study was prepared in (a
    cargo job's one build, a study launched before trials had trees of their own). A trial's own tree
    is named as its run, as a train's is: everything in it is its own, as for any run with a tree."""
    tree = meta.get("tree")
    return "trial" in meta and not (isinstance(tree, str) and os.path.basename(tree) == os.path.basename(run_dir))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent list-files")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--deadline", type=float, default=None, help="seconds the walk may take")
    parser.add_argument("globs", nargs="*")
    args = parser.parse_args(argv)
    run_dir = os.path.abspath(args.run_dir)
    try:
        meta = load(os.path.join(run_dir, RUN_JSON))  # never a crafted run.json read whole
        cwd, since = meta["cwd"], meta.get("started_ts")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        print(json.dumps({"error": f"{run_dir}/{RUN_JSON}: {exc}"}))
        return AgentExit.MISSING
    own_tree = isinstance(meta.get("tree"), str) and not _trial_shares(run_dir, meta)
    try:
        answer = list_files(os.path.abspath(cwd), run_dir, args.globs,
                            None if own_tree or not since else float(since),
                            None if own_tree else _ended_ts(run_dir, meta), args.deadline)
    except DeadlineHit as exc:
        print(json.dumps({"error": DEADLINE_ERROR, "glob": exc.glob, "seconds": args.deadline}))
        return AgentExit.REFUSED
    except OSError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
