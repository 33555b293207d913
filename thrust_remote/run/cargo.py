"""A cargo (tch-rs) job on a host: one plan, computed once from envcheck's facts and the job's spec,
then handed whole to setup (the build), launch (the binary and its env) and fetch (the artifact).

The rules themselves (LIBTORCH_USE_PYTORCH, LD_LIBRARY_PATH, LD_PRELOAD, RUSTFLAGS with
`-Wl,--no-as-needed`, the build fingerprint) are envcheck.buildenv's, the standard-library module the
host also runs to judge a build's env (docs/architecture.md, "Job kinds").
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from envcheck import buildenv as _core
from thrust_remote.core.errors import ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.jobspec import JobLike, JobSpec, job_spec
from thrust_remote.host.report import Report
from thrust_remote.host.runner import Runner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run.sync import SyncResult

FINGERPRINT_FILE = _core.FINGERPRINT_FILE
BUILD_KEY_FILE = ".thrust-build-key"  # in the target dir: the commit, patch and env the binary was built from


class Steps(Protocol):
    def step(self, message: str) -> None: ...


@dataclass(frozen=True)
class CargoPlan:
    """Everything a cargo job needs on one host. `env` serves the build and the run alike."""

    name: str
    env: dict[str, str]
    crate_dir: str  # absolute, on the host: the build's and the run's cwd
    target_dir: str
    build_argv: list[str]  # cargo [+TOOLCHAIN] build --release --example X
    clean_argv: list[str]
    binary: str  # <target>/release/examples/X: run itself, not `cargo run`
    args: list[str]  # the job's own args
    fingerprint: dict[str, Any] = field(repr=False)
    example: str | None = None
    toolchain: str | None = None
    artifact: str | None = None  # the job's `artifact:`, relative to the crate

    @property
    def fingerprint_path(self) -> str:
        """<target dir>/.thrust-build-env.json (inside target/, so `cargo clean` removes it too)."""
        return os.path.join(self.target_dir, FINGERPRINT_FILE)

    def run_argv(self, args: list[str] | None = None) -> list[str]:
        """The binary and its args (the job's own unless others are given: --set, --params)."""
        return [self.binary, *(self.args if args is None else args)]

    def build_key(self, sync_result: SyncResult | None) -> str:
        """What a built binary is good for: the env's fingerprint, the commit and patch (with submodules and
        LFS content: SyncResult.code_id), the example."""
        return hashlib.sha256(json.dumps([
            self.fingerprint.get("digest"), sync_result.commit if sync_result else None,
            sync_result.code_id if sync_result else None, self.example, self.toolchain,
        ]).encode()).hexdigest()


def plan(facts: Mapping[str, Any], job: JobLike) -> CargoPlan:
    """The plan for `job` on the host `facts` describe (envcheck's report, with the crate it found)."""
    spec = job_spec(job)
    facts = dict(facts)
    env = _core.cargo_env(facts, spec)
    crate = (facts.get("crate") or {}).get("dir") or os.path.normpath(
        os.path.join((facts.get("workdir") or {}).get("path") or ".", spec.get("crate") or "."))
    target = (facts.get("crate") or {}).get("target_dir") or _core.target_dir(crate, spec, facts.get("env") or {})
    binary = _core.binary_path(facts, spec)
    if not binary:
        raise ThrustError(f"job {spec.get('name')} is a cargo job without `example:`: nothing to build and run")
    return CargoPlan(name=str(spec.get("name")), env=env, crate_dir=crate, target_dir=target,
                     build_argv=_core.cargo_build_argv(facts, spec), clean_argv=[_core.cargo_bin(facts), "clean"],
                     binary=binary, args=[str(a) for a in spec.get("args") or ()],
                     fingerprint=_core.fingerprint(facts, spec, env=env), example=spec.get("example"),
                     toolchain=spec.get("toolchain"), artifact=spec.get("artifact"))


def shared_target(spec: JobSpec, paths: HostPaths) -> JobSpec:
    """A cargo job's CARGO_TARGET_DIR on a remote host, unless its `env:` names one: the workdir's own
    per crate path (`.thrust/cargo/<hash>`), so every run's tree builds into one target dir and a new
    tree of the same code reuses the build (cargo's own locks keep two builds apart)."""
    env = dict(spec.get("env") or {})
    if env.get("CARGO_TARGET_DIR"):
        return spec
    crate = hashlib.sha256(str(spec.get("crate") or ".").encode()).hexdigest()[:12]
    env["CARGO_TARGET_DIR"] = f"{paths.thrust}/cargo/{crate}"
    return {**spec, "env": env}


def snapshot(session: HostSession, cargo: CargoPlan, checkout: str) -> CargoPlan:
    """The built binary copied into the run's tree (`.thrust-bin/`), which the run executes: the shared
    target dir's binary is another commit's once a later build replaces it (a queued run starts later)."""
    if not checkout.startswith(session.paths.trees + "/"):
        return cargo  # host `local`, or a workdir of the old layout: the binary where it was built
    copy = f"{checkout}/.thrust-bin/{os.path.basename(cargo.binary)}"
    session.runner.makedirs(os.path.dirname(copy))
    session.runner.run(["cp", "-p", "--", cargo.binary, copy]).check(f"copying {cargo.binary} into the run's tree")
    return replace(cargo, binary=copy)


def write_fingerprint(runner: Runner, cargo: CargoPlan) -> str:
    """After a successful build: the env it used, stored on the host (doctor's stale-build check reads
    it). Returns the remote path."""
    with tempfile.TemporaryDirectory(prefix="thrust-fp-") as tmp:
        local = os.path.join(tmp, FINGERPRINT_FILE)
        with open(local, "w") as fh:
            json.dump(cargo.fingerprint, fh, indent=2, sort_keys=True)
        runner.put(local, cargo.fingerprint_path)
    return cargo.fingerprint_path


def setup_cargo(session: HostSession, cargo: CargoPlan, report: Report, sync_result: SyncResult | None,
                reporter: Steps) -> bool:
    """`cargo +TOOLCHAIN build --release --example X` under the plan's env; `cargo clean` first when the
    env changed since the last build. Skipped (True) when this commit and patch were built with this env."""
    runner = session.runner
    key, stamp = cargo.build_key(sync_result), os.path.join(cargo.target_dir, BUILD_KEY_FILE)
    if (runner.read_text(stamp) or "").strip() == key and runner.exists(cargo.binary):
        return True
    stale = report.check("stale-build")
    if stale.status in ("fail", "warn"):
        reporter.step(f"the build env changed since the last build ({stale.detail}): cargo clean")
        runner.run(cargo.clean_argv, env=cargo.env, cwd=cargo.crate_dir, timeout=600).check("cargo clean")
    reporter.step("building: " + " ".join(cargo.build_argv))
    result = runner.run(cargo.build_argv, env=cargo.env, cwd=cargo.crate_dir, timeout=3600,
                        stream=lambda _n, line: None)
    if not result.ok:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise ThrustError(f"cargo build failed on {session.name} (exit {result.exit_code}):\n{tail}",
                          "reproduce with: " + command_hint("doctor", "--job", cargo.name, host=session.host))
    write_fingerprint(runner, cargo)
    runner.write_text(stamp, key)
    return False


def stage_artifact(session: HostSession, run_dir: str, crate_dir: str, job_name: str, artifact: str) -> None:
    """Copy the crate's artifact into the run dir with a manifest, so fetch treats both kinds alike.
    `crate_dir` is the run's cwd (run.json: the crate the plan chose); the artifact is relative to it."""
    src = os.path.normpath(os.path.join(crate_dir, artifact))
    result = session.agent("stage-artifact", "--src", src, "--run-dir", run_dir, "--job", job_name)
    if not result.ok:
        raise ThrustError(
            f"the cargo job's artifact {src} could not be staged on the host: {result.stderr.strip()[-300:]}",
            f"check `artifact:` of job {job_name} (relative to the crate, {crate_dir}) and that the run wrote it",
        )
