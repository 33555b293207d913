"""Where thrust.yaml is and which project it describes: found upwards like git finds .git, and the
project is the git work tree it belongs to."""

from __future__ import annotations

import subprocess
from pathlib import Path

CONFIG_NAME = "thrust.yaml"


def find_config(start: Path | None = None) -> Path | None:
    """thrust.yaml in the current directory or the nearest parent (like git finds .git)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


def project_root(cwd: Path, config: Path | None = None, *, given: bool = False) -> Path:
    """The work tree holding the config, else the one holding cwd; outside git, the directory of a
    config found upwards, else cwd (a config named with --config only configures where you stand).

    The config's own tree wins so that a library caller (or `--config` from outside any repo) gets the
    project that file describes, whatever directory the process happens to stand in."""
    for where in ([config.resolve().parent] if config else []) + [cwd]:
        top = work_tree(where)
        if top:
            return top
    return config.resolve().parent if config and not given else cwd


def work_tree(where: Path) -> Path | None:
    """`git rev-parse --show-toplevel` of a directory, or None outside a work tree."""
    try:
        proc = subprocess.run(["git", "-C", str(where), "rev-parse", "--show-toplevel"], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = proc.stdout.strip()
    return Path(top) if proc.returncode == 0 and top else None
