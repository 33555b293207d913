"""The stages between a synced checkout and a launch: preflight (envcheck, cached) and setup
(the python requirements, or the cargo build), plus staging a cargo run's artifact for fetch.

Each takes a HostSession and the job's plain spec (buildenv.job_spec, built once per train by the
pipeline), and reports through the pipeline's Reporter (anything with `step`). Every remote action
is an agent subcommand or a plain argv (docs/architecture.md, "The flow of one train").
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from . import buildenv, doctor
from .buildenv import JobSpec
from .errors import ExitCode, ThrustError
from .session import HostSession, parse_json
from .sync import LocalState, SyncResult

# What the built-in trainer imports besides torch; torch itself is never installed by us.
TRAINER_REQUIREMENTS = ("numpy", "onnx", "onnxruntime", "onnxscript", "gymnasium")
CRITICAL_CHECKS = ("python", "torch-import")


class Steps(Protocol):
    def step(self, message: str) -> None: ...


def preflight(report: doctor.Report, spec: JobSpec, args: Sequence[str], session: HostSession) -> None:
    """Stop before launching when the host cannot run the job at all."""
    host = session.host
    for cid in CRITICAL_CHECKS:
        try:
            check = report.check(cid)
        except KeyError:
            continue
        if check.status == "fail":
            raise ThrustError(
                f"{host.name}: {check.title}: {check.detail}",
                check.fix or "run: thrust-remote doctor --host " + host.name,
                ExitCode.UNAVAILABLE,
            )
    wants_cuda = "cuda" in [a.lower() for a in args] or "--cuda" in args
    if wants_cuda and not report.facts.get("cuda_available"):
        check = report.check("cuda-available")
        raise ThrustError(
            f"{host.name}: the job asks for CUDA but it is not available there: {check.detail}",
            check.fix or "train on the CPU (drop --device cuda) or fix the driver: thrust-remote doctor",
            ExitCode.FAILED,
        )


def envcheck_report(session: HostSession, spec: JobSpec) -> doctor.Report:
    """doctor.run_doctor, reusing the host's cached report of a python job while nothing it depends on
    changed (the agent's `preflight`: one short command instead of a torch import). Cargo jobs are
    always checked afresh: their facts include the build itself."""
    runner, host, paths = session.runner, session.host, session.paths
    if spec.get("kind") != "python":
        return doctor.run_doctor(runner, host, spec, workdir=paths.workdir)
    extra = json.dumps([spec, doctor.payload_path(), paths.workdir], sort_keys=True)
    probe = session.agent("preflight", "--cache-dir", paths.thrust, "--extra", extra, timeout=60)
    cache_path = None
    if probe.ok:
        try:
            doc = json.loads(probe.stdout)
        except ValueError:
            doc = {}
        if "checks" in doc and "facts" in doc:
            return doctor.Report.from_json(doc)
        cache_path = doc.get("miss")
    report = doctor.run_doctor(runner, host, spec, workdir=paths.workdir)
    if cache_path and not report.failed:
        runner.write_text(cache_path, json.dumps(report.to_json()))
    return report


def setup_python(session: HostSession, facts: Mapping[str, Any], local: LocalState | None, reporter: Steps) -> bool:
    """Make sure the host's python has the trainer's requirements. Returns True when skipped (cached).

    Torch comes from the host as it is: pip runs with `torch==<host version>` as a constraint, so it
    fails rather than replace it.
    """
    runner, host, paths = session.runner, session.host, session.paths
    torch_version = str(facts.get("torch") or "")
    pyproject = local.root / "pyproject.toml" if local else None
    spec = {
        "python": host.python,
        "python_version": facts.get("python"),
        "torch": torch_version,
        "requirements": TRAINER_REQUIREMENTS,
        "pyproject": hashlib.sha256(pyproject.read_bytes()).hexdigest() if pyproject and pyproject.exists() else None,
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()
    stamp = f"{paths.thrust}/setup-python.json"
    if _stamp_key(runner.read_text(stamp)) == key:
        return True
    reporter.step("setting up the host's python (first run, or something it depends on changed)")
    probe = session.agent("missing-modules", *TRAINER_REQUIREMENTS, timeout=60)
    missing = parse_json(probe, "missing-modules") if probe.ok else list(TRAINER_REQUIREMENTS)
    if missing:
        reporter.step(f"installing {', '.join(missing)} into {host.python} (torch pinned to {torch_version})")
        constraint = f"{paths.thrust}/constraints.txt"
        runner.write_text(constraint, f"torch=={torch_version}\n")
        result = runner.run([host.python, "-m", "pip", "install", "-q", "-c", constraint, *missing], timeout=1800)
        if not result.ok:
            raise ThrustError(
                f"installing {', '.join(missing)} on {host.name} failed: {result.stderr.strip()[-400:]}",
                f"install them into {host.python} by hand, or point hosts.{host.name}.python at a venv that has them",
                ExitCode.UNAVAILABLE,
            )
    runner.write_text(stamp, json.dumps({"key": key, **spec}))
    return False


def _stamp_key(text: str | None) -> str | None:
    try:
        return json.loads(text).get("key") if text else None
    except (ValueError, AttributeError):
        return None


def setup_cargo(session: HostSession, spec: JobSpec, report: doctor.Report, sync_result: SyncResult | None,
                reporter: Steps) -> bool:
    """cargo +TOOLCHAIN build --release --example X under buildenv's env; clean first when the env changed.

    Skipped when the same commit/patch was already built with the same env fingerprint.
    """
    runner, facts = session.runner, report.facts
    env = buildenv.build_env(facts, spec)
    crate = buildenv.crate_dir(facts, spec)
    fp = buildenv.fingerprint(facts, spec)
    build_key = hashlib.sha256(
        json.dumps([fp.get("digest"), sync_result.commit if sync_result else None,
                    sync_result.patch_sha256 if sync_result else None, spec.get("example"),
                    spec.get("toolchain")]).encode()
    ).hexdigest()
    stamp = f"{buildenv.target_dir(facts, spec)}/.thrust-build-key"
    binary = buildenv.cargo_run_argv(facts, spec)[0]
    if (runner.read_text(stamp) or "").strip() == build_key and runner.exists(binary):
        return True
    stale = report.check("stale-build")
    if stale.status in ("fail", "warn"):
        reporter.step(f"the build env changed since the last build ({stale.detail}): cargo clean")
        runner.run(buildenv.cargo_clean_argv(facts, spec), env=env, cwd=crate, timeout=600).check("cargo clean")
    build = buildenv.cargo_build_argv(facts, spec)
    reporter.step("building: " + " ".join(build))
    result = runner.run(build, env=env, cwd=crate, timeout=3600, stream=lambda _n, line: None)
    if not result.ok:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise ThrustError(f"cargo build failed on {session.name} (exit {result.exit_code}):\n{tail}",
                          f"reproduce with: thrust-remote doctor --host {session.name} --job {spec.get('name')}")
    buildenv.write_fingerprint(runner, facts, spec)
    runner.write_text(stamp, build_key)
    return False


def stage_cargo_artifact(session: HostSession, run_dir: str, spec: JobSpec) -> None:
    """Copy the crate's artifact into the run dir with a manifest, so fetch treats both kinds alike.
    The artifact path is relative to the crate in the host's workdir (never to a shell's cwd)."""
    crate = os.path.normpath(os.path.join(session.paths.workdir, spec.get("crate") or "."))
    src = os.path.normpath(os.path.join(crate, spec.get("artifact") or ""))
    result = session.agent("stage-artifact", "--src", src, "--run-dir", run_dir, "--job", str(spec.get("name")))
    if not result.ok:
        raise ThrustError(
            f"the cargo job's artifact {src} could not be staged on the host: {result.stderr.strip()[-300:]}",
            f"check `artifact:` of job {spec.get('name')} (relative to the crate, {crate}) and that the run wrote it",
        )

