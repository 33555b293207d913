"""`thrust-remote train JOB`: sync → preflight → setup → launch → follow → fetch.

The core takes a Runner and a Reporter and never prints; the CLI renders. Every stage is a function
so optimize (many runs) and tests can use them one by one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from . import artifacts, buildenv, doctor, runs
from .config import Config, HostConfig, JobConfig
from .errors import ConfigError, ExitCode, ThrustError, UsageError
from .names import valid_id
from .runner import Runner
from .sync import LocalState, SyncResult, local_state, sync

# What the built-in trainer imports besides torch; torch itself is never installed by us.
TRAINER_REQUIREMENTS = ("numpy", "onnx", "onnxruntime", "onnxscript")
CRITICAL_CHECKS = ("python", "torch-import")


class Reporter(Protocol):
    def step(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...


class NullReporter:
    def step(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass


@dataclass
class TrainRequest:
    job: JobConfig
    host: HostConfig
    gpus: str | None = None  # "N" (first N free) or "0,2" (those)
    nproc: int | None = None  # processes under torchrun; default: one per selected GPU
    sets: Sequence[str] = ()  # KEY=VALUE overrides of the job's args
    params_file: Path | None = None  # YAML of parameters (optimize's best params)
    run_id: str | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Launched:
    run_id: str
    run_dir: str
    pid: int
    host: str
    job: str
    commit: str | None
    paths: runs.HostPaths
    sync: SyncResult | None
    setup_skipped: bool
    timings: dict[str, float]

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "host": self.host, "run_dir": self.run_dir, "pid": self.pid,
                "job": self.job, "commit": self.commit}


# ------------------------------------------------------------------------------------------ args

def parse_sets(sets: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in sets:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not sep or not valid_id(key) or key.startswith("-"):
            raise UsageError(f"--set {item!r}: expected KEY=VALUE with KEY like total-steps")
        out[key] = value
    return out


def load_params(path: Path) -> dict[str, Any]:
    """A params file: a YAML mapping of trainer flag -> value (what `optimize` writes)."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read params file: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if isinstance(data, dict) and isinstance(data.get("params"), dict):
        data = data["params"]
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of parameter: value")
    for key in data:
        if not isinstance(key, str) or not valid_id(key) or key.startswith("-"):
            raise ConfigError(f"{path}: {key!r} is not a parameter name")
    return data


def job_arguments(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    """The job's own args, then the params file, then --set (last wins: argparse keeps the last)."""
    if job.kind == "cargo":
        out = list(job.args)  # type: ignore[arg-type]
        merged: dict[str, Any] = {**params, **sets}
    else:
        out = []
        merged = {**dict(job.args), **params, **sets}  # type: ignore[arg-type]
    for key, value in merged.items():
        if value is None or value is False:
            continue
        if value is True:
            out.append(f"--{key}")
        else:
            out += [f"--{key}", str(value)]
    return out


def select_gpus(spec: str | None, facts: Mapping[str, Any], host: HostConfig) -> list[int]:
    """`--gpus 2` → the first two free; `--gpus 0,2` → those (checked against the host's list)."""
    if not spec:
        return []
    smi = facts.get("nvidia_smi") or {}
    gpus = smi.get("gpus") or []
    have = [int(g.get("index", i)) for i, g in enumerate(gpus)]
    if host.gpus:
        have = [g for g in have if g in host.gpus]
    if not have:
        raise UsageError(f"--gpus {spec}: {host.name} has no GPUs that nvidia-smi lists",
                         "leave --gpus out to train on the CPU, or use --nproc N for several CPU processes")
    if spec.isdigit():
        want = int(spec)
        if want < 1 or want > len(have):
            raise UsageError(f"--gpus {spec}: {host.name} has {len(have)} GPU(s): {have}")

        def busy(g: dict) -> float:
            return float(g.get("utilization_pct") or 0) + float(g.get("memory_used_mib") or 0) / 1024

        by_load = sorted((g for g in gpus if int(g.get("index", -1)) in have), key=busy)
        return sorted(int(g["index"]) for g in by_load[:want])
    try:
        chosen = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {spec!r}: expected a count like 2 or a list like 0,2") from None
    bad = [g for g in chosen if g not in have]
    if bad or len(set(chosen)) != len(chosen):
        raise UsageError(f"--gpus {spec}: {host.name} has GPUs {have}; {bad or 'duplicates'} not among them")
    return chosen


def python_argv(host: HostConfig, args: Sequence[str], run_dir: str, nproc: int, export: bool = True) -> list[str]:
    entry = ["-m", "trainer.train", *args, "--run-dir", run_dir]
    if export:
        entry += ["--export", f"{run_dir}/model.onnx"]
    if nproc > 1:
        # --standalone: a private rendezvous on a free port, so two runs on one host never collide
        return [host.python, "-u", "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "--max-restarts=0", *entry]
    return [host.python, "-u", *entry]


# ------------------------------------------------------------------------------------------ stages

def preflight(report: doctor.Report, job: JobConfig, args: Sequence[str], host: HostConfig) -> None:
    """Stop before launching when the host cannot run the job at all."""
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


# A cheap look at what the envcheck report depends on, without importing torch (which is most of
# envcheck's time): the interpreter, where torch is installed and when, the NVIDIA driver, the GPUs
# visible. While none of that changed, the last passing report of this job is still true.
_PREFLIGHT_PROBE = r"""
import hashlib, importlib.util, json, os, sys
spec = importlib.util.find_spec("torch")
loc = spec.origin if spec and spec.origin else None
def mtime(p):
    try:
        return os.stat(p).st_mtime_ns
    except OSError:
        return None
try:
    driver = open("/proc/driver/nvidia/version").read()
except OSError:
    driver = None
try:
    gpus = sorted(os.listdir("/proc/driver/nvidia/gpus"))  # a GPU added or removed: check afresh
except OSError:
    gpus = None
key = json.dumps({"exe": os.path.realpath(sys.executable), "version": sys.version, "torch": loc,
                  "torch_mtime": mtime(os.path.join(os.path.dirname(loc), "version.py")) if loc else None,
                  "driver": driver, "gpus": gpus, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                  "extra": sys.argv[2]},
                 sort_keys=True)
path = os.path.join(sys.argv[1], "preflight-" + hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
try:
    with open(path) as fh:
        print(fh.read())
except OSError:
    print(json.dumps({"miss": path}))
"""


def envcheck_report(runner: Runner, host: HostConfig, job: JobConfig, paths: runs.HostPaths) -> doctor.Report:
    """doctor.run_doctor, reusing the host's cached report of a python job while nothing it depends on
    changed (one short command instead of a torch import). Cargo jobs are always checked afresh: their
    facts include the build itself."""
    if job.kind != "python":
        return doctor.run_doctor(runner, host, job, workdir=paths.workdir)
    extra = json.dumps([buildenv.job_dict(job), doctor.payload_path(), paths.workdir], sort_keys=True)
    probe = runner.run([host.python, "-c", _PREFLIGHT_PROBE, paths.thrust, extra], timeout=60)
    cache_path = None
    if probe.ok:
        try:
            doc = json.loads(probe.stdout)
        except ValueError:
            doc = {}
        if "checks" in doc and "facts" in doc:
            return doctor.Report.from_json(doc)
        cache_path = doc.get("miss")
    report = doctor.run_doctor(runner, host, job, workdir=paths.workdir)
    if cache_path and not report.failed:
        runner.run(["mkdir", "-p", "--", paths.thrust])
        runner.run(["sh", "-c", 'cat > "$1.tmp" && mv -f "$1.tmp" "$1"', "sh", cache_path],
                   stdin=json.dumps(report.to_json()).encode())
    return report


def setup_python(runner: Runner, host: HostConfig, paths: runs.HostPaths, facts: Mapping[str, Any],
                 local: LocalState | None, reporter: Reporter) -> bool:
    """Make sure the host's python has the trainer's requirements. Returns True when skipped (cached).

    Torch comes from the host as it is: pip runs with `torch==<host version>` as a constraint, so it
    fails rather than replace it.
    """
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
    cached = runner.run(["cat", "--", stamp])
    if cached.ok:
        try:
            if json.loads(cached.stdout).get("key") == key:
                return True
        except ValueError:
            pass
    reporter.step("setting up the host's python (first run, or something it depends on changed)")
    probe = runner.run(
        [host.python, "-c",
         "import importlib.util,json,sys\n"
         "print(json.dumps([m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]))",
         *TRAINER_REQUIREMENTS],
        timeout=60,
    )
    missing = json.loads(probe.stdout) if probe.ok else list(TRAINER_REQUIREMENTS)
    if missing:
        reporter.step(f"installing {', '.join(missing)} into {host.python} (torch pinned to {torch_version})")
        constraint = f"{paths.thrust}/constraints.txt"
        runner.run(["mkdir", "-p", "--", paths.thrust]).check("mkdir .thrust")
        runner.run(["sh", "-c", 'printf "%s\\n" "$1" > "$2"', "sh", f"torch=={torch_version}", constraint]).check(
            "write constraints"
        )
        result = runner.run([host.python, "-m", "pip", "install", "-q", "-c", constraint, *missing], timeout=1800)
        if not result.ok:
            raise ThrustError(
                f"installing {', '.join(missing)} on {host.name} failed: {result.stderr.strip()[-400:]}",
                f"install them into {host.python} by hand, or point hosts.{host.name}.python at a venv that has them",
                ExitCode.UNAVAILABLE,
            )
    runner.run(["mkdir", "-p", "--", paths.thrust]).check("mkdir .thrust")
    runner.run(["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", json.dumps({"key": key, **spec}), stamp]).check(
        "write setup stamp"
    )
    return False


def setup_cargo(runner: Runner, host: HostConfig, job: JobConfig, report: doctor.Report, sync_result: SyncResult | None,
                reporter: Reporter) -> bool:
    """cargo +TOOLCHAIN build --release --example X under buildenv's env; clean first when the env changed.

    Skipped when the same commit/patch was already built with the same env fingerprint.
    """
    facts = report.facts
    env = buildenv.build_env(facts, job)
    crate = buildenv.crate_dir(facts, job)
    fp = buildenv.fingerprint(facts, job)
    build_key = hashlib.sha256(
        json.dumps([fp.get("digest"), sync_result.commit if sync_result else None,
                    sync_result.patch_sha256 if sync_result else None, job.example, job.toolchain]).encode()
    ).hexdigest()
    stamp = f"{buildenv.target_dir(facts, job)}/.thrust-build-key"
    binary = buildenv.cargo_run_argv(facts, job)[0]
    if runner.run(["cat", "--", stamp]).stdout.strip() == build_key and runner.exists(binary):
        return True
    stale = report.check("stale-build")
    if stale.status in ("fail", "warn"):
        reporter.step(f"the build env changed since the last build ({stale.detail}): cargo clean")
        runner.run(buildenv.cargo_clean_argv(facts, job), env=env, cwd=crate, timeout=600).check("cargo clean")
    reporter.step("building: " + " ".join(buildenv.cargo_build_argv(facts, job)))
    result = runner.run(buildenv.cargo_build_argv(facts, job), env=env, cwd=crate, timeout=3600,
                        stream=lambda _n, line: None)
    if not result.ok:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise ThrustError(f"cargo build failed on {host.name} (exit {result.exit_code}):\n{tail}",
                          f"reproduce with: thrust-remote doctor --host {host.name} --job {job.name}")
    buildenv.write_fingerprint(runner, facts, job)
    runner.run(["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", build_key, stamp]).check("write build stamp")
    return False


@dataclass
class Prepared:
    """A host ready to run a job: synced, checked, set up. Launch any number of runs from it."""

    config: Config
    job: JobConfig
    host: HostConfig
    paths: runs.HostPaths
    report: doctor.Report
    env: dict[str, str]
    cwd: str
    local: LocalState | None
    sync: SyncResult | None
    setup_skipped: bool
    timings: dict[str, float]


def prepare(config: Config, job: JobConfig, host: HostConfig, runner: Runner, reporter: Reporter | None = None,
            *, args_for_preflight: Sequence[str] = ()) -> Prepared:
    """sync (remote hosts) → envcheck preflight → setup (python deps / cargo build), each timed."""
    reporter = reporter or NullReporter()
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    paths = runs.host_paths(runner, host, config)
    # what we run: the exact local commit (synced to a remote host; the project itself when local)
    local: LocalState | None
    try:
        local = local_state(config.root)
    except ThrustError:
        if not host.is_local:
            raise
        local = None
    sync_result: SyncResult | None = None
    if not host.is_local:
        assert local is not None
        reporter.step(f"syncing {local.commit[:12]} to {host.name}:{paths.workdir}")
        sync_result = sync(runner, paths, local, step=reporter.step,
                           busy=lambda: [r["run_id"] for r in runs.list_runs(runner, host, paths)
                                         if r["state"] == "RUNNING"])
        for w in sync_result.warnings:
            reporter.warn(w)
    elif local is not None:
        sync_result = SyncResult(local.commit, "local", local.dirty, local.patch_sha256, local.untracked)
        if local.dirty:
            reporter.warn("the working tree has uncommitted changes: they are what runs (recorded in run.json)")
    timings["sync"] = time.monotonic() - t0

    t1 = time.monotonic()
    reporter.step(f"checking {host.name} (envcheck)")
    report = envcheck_report(runner, host, job, paths)
    preflight(report, job, [*job_arguments(job, {}, {}), *args_for_preflight], host)
    timings["preflight"] = time.monotonic() - t1

    t2 = time.monotonic()
    env = dict(buildenv.build_env(report.facts, job))
    if sync_result is not None:
        env.setdefault("THRUST_COMMIT", sync_result.commit)
    if job.kind == "cargo":
        skipped = setup_cargo(runner, host, job, report, sync_result, reporter)
        cwd = buildenv.crate_dir(report.facts, job)
    else:
        skipped = setup_python(runner, host, paths, report.facts, local, reporter)
        cwd = paths.workdir
    timings["setup"] = time.monotonic() - t2
    return Prepared(config, job, host, paths, report, env, cwd, local, sync_result, skipped, timings)


def launch_prepared(prepared: Prepared, runner: Runner, *, args: Sequence[str], run_id: str | None = None,
                    gpus: Sequence[int] = (), nproc: int | None = None, extra_env: Mapping[str, str] | None = None,
                    lock_job: str | None = None, reporter: Reporter | None = None, export: bool = True,
                    meta_extra: Mapping[str, Any] | None = None) -> Launched:
    """Start one detached run. `args` are the trainer's flags (job_arguments); `gpus` become
    CUDA_VISIBLE_DEVICES; `lock_job` names the lock (default: the job's name); `export=False` skips
    the ONNX export (seconds per run that a hyperparameter trial does not need); `meta_extra` goes
    into run.json."""
    reporter = reporter or NullReporter()
    t3 = time.monotonic()
    job, host, paths = prepared.job, prepared.host, prepared.paths
    env = dict(prepared.env)
    env.update(extra_env or {})
    if gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    run_id = runs.check_run_id(run_id) if run_id else runs.new_run_id(job.name)
    run_dir = paths.run(run_id)
    if job.kind == "cargo":
        argv = [*buildenv.cargo_run_argv(prepared.report.facts, job)[:1], *args]
    else:
        argv = python_argv(host, args, run_dir, nproc or max(1, len(gpus)), export=export)
    sync_result = prepared.sync
    meta = {
        "argv": argv,
        "env_keys": sorted(env),
        # the values thrust-remote computed (CUDA_VISIBLE_DEVICES, LD_*, RUSTFLAGS...); the job's own
        # `env:` may hold secrets (API keys): only their names are recorded
        "env": {k: v for k, v in env.items() if k not in job.env},
        "facts": {k: prepared.report.facts.get(k)
                  for k in ("hostname", "python", "python_path", "torch", "cuda_available")},
        "gpus": list(gpus),
        **(sync_result.as_meta() if sync_result else {"commit": None}),
        **(meta_extra or {}),
    }
    reporter.step(f"launching run {run_id}")
    answer = runs.launch(runner, host, paths, run_id=run_id, job=lock_job or job.name, argv=argv,
                         cwd=prepared.cwd, env=env, meta={**meta, "job": job.name})
    timings = {**prepared.timings, "launch": time.monotonic() - t3}
    if sync_result is not None and sync_result.dirty and prepared.local is not None:
        _save_patch(runner, run_dir, prepared.local)
    return Launched(run_id, run_dir, int(answer["pid"]), host.name, job.name,
                    sync_result.commit if sync_result else None, paths, sync_result, prepared.setup_skipped, timings)


def start(config: Config, request: TrainRequest, runner: Runner, reporter: Reporter | None = None) -> Launched:
    """Everything up to a running, detached job on the host."""
    sets = parse_sets(request.sets)
    params = load_params(request.params_file) if request.params_file else {}
    args = job_arguments(request.job, sets, params)
    prepared = prepare(config, request.job, request.host, runner, reporter, args_for_preflight=args)
    gpus = select_gpus(request.gpus, prepared.report.facts, request.host)
    return launch_prepared(prepared, runner, args=args, run_id=request.run_id, gpus=gpus, nproc=request.nproc,
                           extra_env=request.extra_env, reporter=reporter)


def _save_patch(runner: Runner, run_dir: str, local: LocalState) -> None:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".patch") as tmp:
        tmp.write(local.patch)
        tmp.flush()
        runner.put(tmp.name, f"{run_dir}/uncommitted.patch")



def export_target(config: Config, job: JobConfig) -> tuple[Path, str]:
    """(directory, stem) where the job's model lands: job.export, else web/public/<job>.onnx."""
    target = config.root / (job.export or f"web/public/{job.name}.onnx")
    return target.parent, target.stem


def finish(config: Config, runner: Runner, launched_job: JobConfig, run_dir: str, paths: runs.HostPaths,
           python: str = "python3") -> artifacts.FetchResult:
    """Fetch the run's model into web/public (verified, atomic). Cargo jobs fetch `artifact:`."""
    dest, stem = export_target(config, launched_job)
    if launched_job.kind == "cargo":
        if not launched_job.artifact:
            raise ThrustError(f"job {launched_job.name} has no `artifact:` to fetch", exit_code=ExitCode.USAGE)
        _stage_cargo_artifact(runner, run_dir, launched_job, paths, python)
    return artifacts.fetch_run_model(runner, run_dir, stem, dest)


def _stage_cargo_artifact(runner: Runner, run_dir: str, job: JobConfig, paths: runs.HostPaths, python: str) -> None:
    """Copy the crate's artifact into the run dir with a manifest, so fetch treats both kinds alike.
    The artifact path is relative to the crate in the host's workdir (never to a shell's cwd)."""
    crate = os.path.normpath(os.path.join(paths.workdir, job.crate))
    src = os.path.normpath(os.path.join(crate, job.artifact or ""))
    script = (
        "import hashlib,json,os,shutil,sys\n"
        "src,run=sys.argv[1],sys.argv[2]\n"
        "dst=os.path.join(run,'model.onnx')\n"
        "shutil.copyfile(src,dst)\n"
        "data=open(dst,'rb').read()\n"
        "m={'sha256':hashlib.sha256(data).hexdigest(),'bytes':len(data),'job':sys.argv[3],'source':src}\n"
        "open(os.path.join(run,'manifest.json'),'w').write(json.dumps(m))\n"
    )
    result = runner.run([python, "-c", script, src, run_dir, job.name])
    if not result.ok:
        raise ThrustError(
            f"the cargo job's artifact {src} could not be staged on the host: {result.stderr.strip()[-300:]}",
            f"check `artifact:` of job {job.name} (relative to the crate, {crate}) and that the run wrote it",
        )
