"""`doctor`'s fixes: the safe, idempotent ones a report calls for, each one reported.

The report itself (envcheck run on a host, as data) is host/report.py's: a run's preflight asks it
too. Rendering is the CLI's job; this module returns data (FixResult) and raises ThrustError.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from envcheck.checks import BUILD_RS_LINES
from envcheck.probe import NO_AS_NEEDED_RE
from thrust_remote.core.config import JobConfig
from thrust_remote.host.report import Report
from thrust_remote.host.runner import Runner


@dataclass
class FixResult:
    """One fix doctor --fix tried: what, where, whether it changed anything, and the evidence."""

    check_id: str
    action: str
    applied: bool
    detail: str = ""
    output: str = ""
    preview: str = field(default="", repr=False)


# ----------------------------------------------------------------------------------------------
# fixes: only the safe, idempotent ones

CLEAN_TRIGGERS = {"stale-build": ("fail", "warn"), "release-build": ("fail",), "binary-links-cuda": ("fail",)}

_FN_MAIN = re.compile(r"fn\s+main\s*\(\s*\)\s*(?:->\s*[^{]+)?\{")


def patch_build_rs(text: str | None) -> str | None:
    """build.rs with the tch-rs link lines added to fn main(); None when it cannot be done safely.

    The lines go first in main() so nothing returns before them. `-ltorch` must follow
    `--no-as-needed`: a library named before the flag is still dropped.
    """
    if text is None or not text.strip():
        return "fn main() {\n" + "".join(f"    {line}\n" for line in BUILD_RS_LINES) + "}\n"
    found = NO_AS_NEEDED_RE.search(text)  # a real link-arg instruction, not the words in a comment
    if found:
        if re.search(r"rustc-link-arg=-l\s*torch", text[found.start():]):
            return text  # already there: idempotent
        line_end = text.find("\n", found.end())
        line_start = text.rfind("\n", 0, found.start()) + 1
        line = text[line_start:]
        indent = line[: len(line) - len(line.lstrip())]
        if line_end < 0:
            return text + f"\n{indent}{BUILD_RS_LINES[1]}\n"
        return text[: line_end + 1] + f"{indent}{BUILD_RS_LINES[1]}\n" + text[line_end + 1:]
    m = _FN_MAIN.search(text)
    if not m:
        return None
    insert = "".join(f"\n    {line}" for line in BUILD_RS_LINES)
    return text[: m.end()] + insert + text[m.end():]


def _diff(old: str | None, new: str, path: str) -> str:
    return "".join(difflib.unified_diff((old or "").splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=f"{path} (before)", tofile=f"{path} (after)"))


def _apply_build_rs(old: str | None, where: str, write: Callable[[str], None], done: str,
                    show: Callable[[str, str], None] | None) -> FixResult:
    """Patch, show the diff, write: the same steps wherever build.rs lives."""
    new = patch_build_rs(old)
    if new is None:
        return FixResult("build-rs-no-as-needed", f"edit {where}", False, "no `fn main() {` found to add to")
    if new == old:
        return FixResult("build-rs-no-as-needed", f"edit {where}", False, "already has the lines")
    preview = _diff(old, new, where)
    if show:
        show("build-rs-no-as-needed", preview)
    write(new)
    return FixResult("build-rs-no-as-needed", f"edit {where}", True, done, preview=preview)


def fix_build_rs(runner: Runner, report: Report, *, local_crate: Path | None = None,
                 show: Callable[[str, str], None] | None = None) -> FixResult:
    """Add the link lines to build.rs: in the local checkout when there is one (sync ships it, and a
    host-side edit would be overwritten by the next sync), else on the host."""
    crate = report.facts.get("crate") or {}
    remote_path = crate.get("build_rs_path")
    if not remote_path:
        return FixResult("build-rs-no-as-needed", "edit build.rs", False, "the crate was not found")
    if local_crate is not None and (local_crate / "Cargo.toml").is_file():
        # the same file in the local checkout (build.rs, or Cargo.toml's `build = "..."`)
        rel = os.path.relpath(remote_path, crate["dir"]) if crate.get("dir") else Path(remote_path).name
        path = local_crate / rel
        old = path.read_text() if path.is_file() else None
        return _apply_build_rs(old, str(path), path.write_text, "commit it: the next sync takes it to the host",
                               show)
    with tempfile.TemporaryDirectory(prefix="thrust-buildrs-") as tmp:
        local = Path(tmp) / "build.rs"
        old = None
        if (crate.get("build_rs") or {}).get("exists"):
            runner.get(remote_path, local)
            old = local.read_text()

        def write_on_host(text: str) -> None:
            local.write_text(text)
            runner.put(local, remote_path)

        return _apply_build_rs(old, f"{runner.name}:{remote_path}", write_on_host, "written on the host", show)


def fix_stale_build(runner: Runner, report: Report, job: JobConfig) -> FixResult:
    crate = report.facts.get("crate") or {}
    cargo = (report.facts.get("rust") or {}).get("cargo")
    action = f"cargo clean in {crate.get('dir')}"
    if not cargo:
        return FixResult("stale-build", action, False, "cargo is not installed (see rust-toolchain)")
    env = {}
    if job.env.get("CARGO_TARGET_DIR"):
        env["CARGO_TARGET_DIR"] = crate.get("target_dir") or job.env["CARGO_TARGET_DIR"]
    res = runner.run([cargo, "clean"], cwd=crate.get("dir"), env=env, timeout=300)
    output = (res.stderr or res.stdout).strip()
    if not res.ok:
        return FixResult("stale-build", action, False, f"cargo clean failed (exit {res.exit_code})", output)
    return FixResult("stale-build", action, True, f"removed {crate.get('target_dir')}", output)


def apply_fixes(runner: Runner, report: Report, job: JobConfig | None, *, local_crate: Path | None = None,
                show: Callable[[str, str], None] | None = None) -> list[FixResult]:
    """Apply the safe, idempotent fixes the report calls for; each one is reported, none is silent.

    - stale-build (and a release-build / binary-links-cuda failure): `cargo clean` in the crate.
    - build-rs-no-as-needed: add the link lines to build.rs (`show` sees the diff before the write).
    Everything else needs a person (installing drivers, choosing a torch) and is only described.
    """
    results: list[FixResult] = []
    if job is None or job.kind != "cargo":
        return results
    by_id = {c.id: c for c in report.checks}
    if any(by_id[cid].status in statuses for cid, statuses in CLEAN_TRIGGERS.items() if cid in by_id):
        results.append(fix_stale_build(runner, report, job))
    if by_id.get("build-rs-no-as-needed") and by_id["build-rs-no-as-needed"].status in ("warn", "fail"):
        results.append(fix_build_rs(runner, report, local_crate=local_crate, show=show))
    return results
