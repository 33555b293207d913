"""The preflight stage: envcheck on the host (cached while nothing it depends on changed) and the
checks without which a job cannot run there at all (docs/architecture.md, "The flow of one train")."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Sequence

from thrust_remote.agent.slurmcheck import COMMANDS_ROW, LOGIN_SHELL_FIX, NO_PARTITION
from thrust_remote.core.errors import ConfigError, ExitCode, ThrustError, UnreachableError
from thrust_remote.core.hints import CPU_TORCH_INSTALL, LOCAL_EXTRA_INSTALL, command_hint, config_file
from thrust_remote.core.scheduler import login_shell_fix
from thrust_remote.host import payload
from thrust_remote.host import report as envcheck
from thrust_remote.host.jobspec import JobSpec
from thrust_remote.host.session import HostSession
from thrust_remote.run.buildenv import without_env_values
from thrust_remote.run.venv import is_builtin_trainer

CRITICAL_CHECKS = ("python", "torch-import")
# pyproject's `local` extra: what the built-in trainer imports that a plain install leaves out
LOCAL_EXTRA_MODULES = ("torch", "onnxscript", "gymnasium")
PARTITION_S = 60.0  # sinfo alone (agent/slurmcheck.py gives it 30 s, in a login shell as many more)


def check_local_python(session: HostSession, spec: JobSpec) -> None:
    """The host `local` runs a job in the python thrust-remote itself runs in (unless its `python:` says
    otherwise): a plain install (no `local` extra) has no torch there. Say which modules are missing and
    the one command that adds them, before envcheck probes torch or setup pip-installs into a venv.
    `spec`: the job as the stages see it (jobspec.job_spec)."""
    host = session.host
    if not host.is_local or spec.get("kind") in ("command", "cargo"):
        return
    if payload.python_of(session.runner, host) != sys.executable:
        return  # another python: envcheck's torch-import check speaks for it
    wanted = LOCAL_EXTRA_MODULES if is_builtin_trainer(spec) else ("torch",)
    missing = [name for name in wanted if importlib.util.find_spec(name) is None]
    if missing:
        python = sys.executable
        raise UnreachableError(
            f"{host.name}: {python} has no {', '.join(missing)}: the host `local` runs the job in the python "
            "thrust-remote runs in, and the trainer's packages are the `local` extra, not in a plain install",
            f"{python} -m {LOCAL_EXTRA_INSTALL}   (on Linux without a GPU, first `{python} -m {CPU_TORCH_INSTALL}`: "
            "PyPI's torch there is the multi-GB CUDA build), or train on a GPU host: "
            + command_hint(f"train {spec.get('name')}", host="HOST"),
        )


def check_partition(session: HostSession) -> None:
    """The first step of a run's check on a host (stages.check), before its sync, venv and `setup:`
    (seconds here, minutes on a cluster): Slurm's commands work on the login node and the host's
    partition is one the cluster has; else the error says which it has, or the key that makes Slurm's
    commands found. Anything else sinfo says is doctor's to show."""
    host = session.host
    if host.slurm is None:
        return
    asked = ["--partition", host.slurm.partition] if host.slurm.partition else []
    rows = session.agent_json("the cluster's partitions", "slurm-check", "--workdir", session.paths.workdir,
                              "--partition-only", *asked, timeout=PARTITION_S)
    first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
    doctor = command_hint("doctor", host=host)
    if first.get("id") == COMMANDS_ROW:
        fix = login_shell_fix(host.name, config_file(host)) if first.get("fix") == LOGIN_SHELL_FIX else doctor
        raise ThrustError(f"{host.name}: {first.get('detail')}", fix, ExitCode.UNAVAILABLE)
    if NO_PARTITION in first:
        have = ", ".join(first[NO_PARTITION]) or "none"
        asked = f"no partition {host.slurm.partition!r}" if host.slurm.partition else "no default partition"
        raise ConfigError(f"{config_file(host)}: hosts.{host.name}.partition: {host.name} has {asked}; its "
                          f"partitions: {have}",
                          f"set partition: under hosts.{host.name} to one of them ({have}); see {doctor}")


def preflight(report: envcheck.Report, spec: JobSpec, args: Sequence[str], session: HostSession) -> None:
    """Stop before launching when the host cannot run the job at all."""
    host = session.host
    # a command job brings its own interpreter and libraries: only the agent's python must be there
    critical = ("python",) if spec.get("kind") == "command" else CRITICAL_CHECKS
    for cid in critical:
        try:
            check = report.check(cid)
        except KeyError:
            continue
        if check.status == "fail":
            raise ThrustError(
                f"{host.name}: {check.title}: {check.detail}",
                check.fix or "run: " + command_hint("doctor", host=host),
                ExitCode.UNAVAILABLE,
            )
    if asks_for_cuda(str(spec.get("kind")), args) and not report.facts.get("cuda_available"):
        check = report.check("cuda-available")
        raise ThrustError(
            f"{host.name}: the job asks for CUDA but it is not available there: {check.detail}",
            check.fix or "train on the CPU (drop --device cuda) or fix the driver: "
            + command_hint("doctor", host=host),
            ExitCode.UNAVAILABLE,
        )


def asks_for_cuda(kind: str, args: Sequence[str]) -> bool:
    """Only flags whose meaning we know: the built-in trainer's `--device cuda[:N]`, a tch-rs example's
    `--cuda`. Your own code's flags are its own (`--cuda false` turns CUDA off; `cuda` may be any
    word): it is never refused for them."""
    if kind == "trainer":
        words = list(args)
        devices = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "--device"]
        devices += [w.split("=", 1)[1] for w in words if w.startswith("--device=")]
        return any(d.lower().startswith("cuda") for d in devices)
    return kind == "cargo" and "--cuda" in args


def envcheck_report(session: HostSession, spec: JobSpec, *, checkout: str | None = None) -> envcheck.Report:
    """envcheck.run_doctor, reusing the host's cached report of a non-cargo job while nothing it depends on
    changed (the agent's `preflight`: one short command instead of a torch import). Cargo jobs are
    always checked afresh, in `checkout` (the run's tree): their facts include the crate and its build."""
    runner, host, paths = session.runner, session.host, session.paths
    if spec.get("kind") == "cargo":
        return envcheck.run_doctor(runner, host, spec, workdir=checkout or paths.workdir)
    # env names only: a value never reaches the host's cache (and cannot change a report of a job that is
    # not cargo); on stdin all the same, like everything job-shaped
    extra = json.dumps([without_env_values(spec), envcheck.payload_path(), paths.workdir], sort_keys=True)
    probe = session.agent("preflight", "--cache-dir", paths.thrust, "--extra", "-", stdin=extra.encode(), timeout=60)
    cache_path = None
    if probe.ok:
        try:
            doc = json.loads(probe.stdout)
        except ValueError:
            doc = {}
        if "checks" in doc and "facts" in doc:
            return envcheck.Report.from_json(doc)
        cache_path = doc.get("miss")
    report = envcheck.run_doctor(runner, host, spec, workdir=paths.workdir)
    if cache_path and not report.failed:
        runner.write_text(cache_path, json.dumps(report.to_json()))
    return report
