"""`doctor`'s core: run envcheck on a host in one remote command, and apply the safe fixes.

envcheck travels as one zipapp (`envcheck-<sha>.pyz` in ~/.cache/thrust-remote on the host, built
and run by thrust_remote.host.payload like the host agent), uploaded only when that exact version is not
already there. The common case is therefore a single remote command: `[python, pyz, *args]`.
Rendering is the CLI's job; this module returns data (Report, FixResult) and raises ThrustError.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envcheck.checks import BUILD_RS_LINES, CHECK_IDS
from envcheck.probe import NO_AS_NEEDED_RE
from thrust_remote.core import hints
from thrust_remote.core.config import HostConfig, JobConfig
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host import payload
from thrust_remote.host.runner import Runner, expand_home
from thrust_remote.host.session import bad_python, python_problem
from thrust_remote.run.buildenv import job_spec

CACHE_DIR = payload.CACHE_DIR
STATUSES = ("ok", "warn", "fail", "skip")
Job = JobConfig | Mapping[str, Any] | None  # a JobConfig or the plain spec (buildenv.job_spec)


@dataclass(frozen=True)
class Check:
    id: str
    title: str
    status: str
    detail: str
    fix: str | None = None


@dataclass
class Report:
    """envcheck's JSON as objects, plus how long the round trip took."""

    host: str
    facts: dict
    checks: list[Check]
    wall_s: float = 0.0
    uploaded: bool = False

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def exit_code(self) -> int:
        """0 when nothing fails, 1 when a check fails (docs/architecture.md, "Exit codes")."""
        return int(ExitCode.FAILED) if self.failed else int(ExitCode.OK)

    def check(self, cid: str) -> Check:
        for c in self.checks:
            if c.id == cid:
                return c
        raise KeyError(cid)

    def counts(self) -> dict[str, int]:
        return {s: sum(1 for c in self.checks if c.status == s) for s in STATUSES}

    def to_json(self) -> dict:
        """docs/architecture.md's shape: {"host", "facts", "checks": [{id, title, status, detail, fix}]}."""
        return {
            "host": self.host,
            "facts": self.facts,
            "checks": [
                {"id": c.id, "title": c.title, "status": c.status, "detail": c.detail, "fix": c.fix}
                for c in self.checks
            ],
        }

    @classmethod
    def from_json(cls, doc: dict, wall_s: float = 0.0, uploaded: bool = False) -> Report:
        checks = [Check(c["id"], c["title"], c["status"], c["detail"], c.get("fix")) for c in doc["checks"]]
        return cls(doc["host"], doc["facts"], checks, wall_s, uploaded)


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
# the envcheck payload


def payload_path() -> str:
    """Where the payload lives on a host (its `~` is the host's home)."""
    return payload.envcheck().remote


def envcheck_args(host: HostConfig, job: Job, workdir: str | None = None, torch_timeout: float = 30.0, *,
                  cache_dir: str | None = None, fresh: bool = False) -> list[str]:
    """envcheck's argv; the job goes on stdin (`--job-json -`, `envcheck_stdin`): its env may hold secrets.
    cache_dir: where the host keeps a passing torch probe to reuse (fresh: probe again all the same)."""
    args = ["--json", "--workdir", workdir or host.workdir, "--host", host.name,
            "--torch-timeout", f"{torch_timeout:g}"]
    if cache_dir:
        args += ["--cache-dir", cache_dir] + (["--fresh"] if fresh else [])
    if job is not None:
        args += ["--job-json", "-"]
    if host.gpus:
        args += ["--gpus", ",".join(str(g) for g in host.gpus)]
    return args


def run_envcheck(runner: Runner, host: HostConfig, job: Job = None, *,
                 workdir: str | None = None, torch_timeout: float = 30.0, fresh: bool = False) -> Report:
    """One remote command (two plus an upload the first time a host sees this envcheck version).
    A host without the configured python is UnreachableError (69), from payload.run_pyz."""
    started = time.monotonic()
    args = envcheck_args(host, job, workdir, torch_timeout, cache_dir=expand_home(CACHE_DIR, runner.home()),
                         fresh=fresh)
    stdin = json.dumps(job_spec(job), sort_keys=True).encode() if job is not None else None
    timeout = torch_timeout + 30.0
    result, uploaded = payload.run_pyz(runner, host, payload.envcheck(), args, timeout=timeout, stdin=stdin)
    if result.timed_out:
        raise ThrustError(f"envcheck on {runner.name} did not finish in {timeout:g} s",
                          "run it by hand to see where it hangs: "
                          f"{host.python} {payload_path()} --json", ExitCode.UNAVAILABLE)
    doc = _report_doc(result.stdout)
    if doc is None:
        # not executable, not a Python, too old: say which, with doctor's own hint (exit 69)
        reason = python_problem(runner, host)
        if reason or not result.ok:
            tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-3:])[:300]
            raise bad_python(runner, host, f"could not run envcheck (exit {result.exit_code}): {reason or tail}")
        raise ThrustError(f"envcheck on {runner.name} answered something that is not its report: "
                          f"{result.stdout.strip()[:200]!r}",
                          "does a start-up file of that account (~/.bashrc, ~/.profile) print to stdout for "
                          f"commands? Make it print only in interactive shells; see what it prints with: "
                          f"ssh {host.address or 'HOST'} true",
                          ExitCode.UNAVAILABLE)
    report = Report.from_json(doc, time.monotonic() - started, uploaded)
    return with_config(with_local_extra(report, runner, host), host.config_path)


def _report_doc(stdout: str) -> dict[str, Any] | None:
    """envcheck's report: its one JSON line, the last of stdout (a line an account's start-up file
    prints before the command's own output comes first, and is not the report)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        doc = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "checks" in doc else None


def with_local_extra(report: Report, runner: Runner, host: HostConfig) -> Report:
    """The host `local` on thrust-remote's own python without torch is a plain install: torch alone would
    not do, the trainer also wants the `local` extra's onnxscript and gymnasium (run/preflight.py)."""
    python = payload.python_of(runner, host)
    if not host.is_local or python != sys.executable:
        return report
    report.checks = [
        replace(c, fix=f"{c.fix}, then {python} -m {hints.LOCAL_EXTRA_INSTALL}")
        if c.id == "torch-import" and c.status == "fail" and " -m pip install torch " in (c.fix or "") else c
        for c in report.checks
    ]
    return report


def with_config(report: Report, config_path: str | None) -> Report:
    """envcheck runs on the host and cannot know the thrust.yaml the user named: its fixes that are
    thrust-remote commands get `--config PATH` here, like every other hint (thrust_remote/core/hints.py)."""
    if not config_path:
        return report
    prefix = f"{hints.PROG} "
    with_path = command_hint("", config=config_path) + " "
    report.checks = [
        replace(c, fix=c.fix.replace(prefix, with_path, 1)) if c.fix and c.fix.startswith(prefix) else c
        for c in report.checks
    ]
    return report


def run_doctor(runner: Runner, host: HostConfig, job: Job = None, *,
               workdir: str | None = None, torch_timeout: float = 30.0, fresh: bool = False) -> Report:
    """The whole checklist for `host` (and `job`, when given): a Report with every check id.

    Connection problems arrive as the Runner's ThrustError (exit 68/69/76/77); a host without the
    configured python is UnreachableError (69). A failing check is data: Report.exit_code says 1.
    fresh: import torch again even where the host kept a passing probe (envcheck/torchprobe.py).
    """
    report = run_envcheck(runner, host, job, workdir=workdir, torch_timeout=torch_timeout, fresh=fresh)
    missing = [cid for cid in CHECK_IDS if cid not in {c.id for c in report.checks}]
    if missing:  # an old payload cached under the same hash cannot happen; a hand-edited one can
        raise ThrustError(f"envcheck on {runner.name} did not report {', '.join(missing)}")
    return report


def collect_facts(runner: Runner, host: HostConfig, job: Job = None, **kw) -> dict:
    """Just the facts (for buildenv): what the train pipeline needs before a build or a run."""
    return run_envcheck(runner, host, job, **kw).facts


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
