"""A run's tree's size, for `status` and `list` (runs.py) and for `tree-size` and `prune` (trees.py).

Its own module so that a status, every 2 s of a follow, imports none of what `tree-add` needs (git,
the content store, the transfer helper): docs/architecture.md, "The host agent" and "Trees".
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from .protocol import RunRecord


def size(tree: str, deadline: float) -> dict:
    """The bytes of the tree's own files (a file linked from the store, or into another tree, is not
    its own; shared directories are links, not entered). `complete` false: the walk ran out of time."""
    total, count, end = 0, 0, time.monotonic() + deadline
    for root, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if st.st_nlink == 1:
                total += st.st_blocks * 512
                count += 1
        if time.monotonic() > end:
            return {"bytes": total, "files": count, "complete": False}
    return {"bytes": total, "files": count, "complete": True}


SIZE_FILE = "tree-size.json"  # in a run's directory: its tree's size, once the run has ended


def tree_info(run_dir: str, meta: RunRecord, ended: bool, deadline: float = 1.0) -> dict:
    """A run's tree for `status` and `list`: its path, whether it is still kept, its size (counted once
    the run ended and kept in the run's directory; a running run's is counted within `deadline`)."""
    tree = meta.get("tree")
    if not isinstance(tree, str):
        return {}
    if not os.path.isdir(tree):
        return {"tree": tree, "tree_kept": False, "tree_bytes": None}
    cached = os.path.join(run_dir, SIZE_FILE)
    if ended:
        with contextlib.suppress(OSError, ValueError), open(cached) as fh:
            return {"tree": tree, "tree_kept": True, "tree_bytes": json.load(fh)["bytes"]}
    counted = size(tree, deadline)
    if ended and counted["complete"]:
        with contextlib.suppress(OSError):
            with open(f"{cached}.tmp", "w") as fh:
                json.dump(counted, fh)
            os.replace(f"{cached}.tmp", cached)
    return {"tree": tree, "tree_kept": True, "tree_bytes": counted["bytes"]}
