"""buildenv: the env and argv for a job, proved with a real offline cargo build of tests/native/crate
(dependency-free: crates.io is unreachable) and the stale-build fingerprint it leaves behind."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

import envcheck
from envcheck import checks, elf
from thrust_remote.core.config import JobConfig
from thrust_remote.host.runner import LocalRunner
from thrust_remote.run import buildenv, cargo

CRATE = Path(__file__).parent / "native" / "crate"
pytestmark = pytest.mark.skipif(shutil.which("cargo") is None and not Path("~/.cargo/bin/cargo").expanduser().exists(),
                                reason="needs cargo")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, JobConfig]:
    """A workdir holding a copy of the crate, and a cargo job whose target dir is in tmp."""
    root = tmp_path_factory.mktemp("buildenv")
    shutil.copytree(CRATE, root / "crate")
    job = JobConfig(name="probe-rs", kind="cargo", toolchain="stable", example="train_probe", crate="crate",
                    args=("--mode", "shared", "--cuda"), env={"CARGO_TARGET_DIR": str(root / "target")})
    return root, job


def facts_for(root: Path, job: JobConfig) -> dict:
    return envcheck.report(workdir=str(root), job=buildenv.job_dict(job), host="local")["facts"]


@pytest.fixture(scope="module")
def facts(project) -> dict:
    return facts_for(*project)


def test_cargo_env_points_everything_at_torch_lib(facts: dict, project) -> None:
    _, job = project
    lib = facts["torch_probe"]["lib_dir"]
    env = buildenv.build_env(facts, job)
    assert env["LIBTORCH_USE_PYTORCH"] == "1"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == lib and lib.endswith("/lib")
    flags = env["RUSTFLAGS"]
    # --no-as-needed first, then the libraries it must keep (rustc appends link-args after its -l)
    assert flags.index("-C link-arg=-Wl,--no-as-needed") < flags.index("-C link-arg=-ltorch")
    assert f"-C link-arg=-Wl,-rpath,{lib}" in flags and f"-L native={lib}" in flags
    assert "LIBTORCH_BYPASS_VERSION_CHECK" not in env
    assert env["CARGO_TARGET_DIR"] == job.env["CARGO_TARGET_DIR"]
    if not facts["torch_probe"]["libs"]["libtorch_cuda.so"]:
        assert "LD_PRELOAD" not in env  # CPU wheel: nothing CUDA to preload
    assert buildenv.build_env(facts, replace(job, bypass_version_check=True))["LIBTORCH_BYPASS_VERSION_CHECK"] == "1"


def test_cuda_wheel_gets_ld_preload_and_torch_cuda(facts: dict, project) -> None:
    _, job = project
    lib = "/opt/venv/lib/python3.12/site-packages/torch/lib"
    gpu = {**facts, "torch_probe": {"lib_dir": lib, "libs": {"libtorch.so": True, "libtorch_cuda.so": True}},
           "env": {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64"}}
    env = buildenv.build_env(gpu, replace(job, env={"RUSTFLAGS": "-C target-cpu=native"}))
    assert env["LD_PRELOAD"] == f"{lib}/libtorch_cuda.so:{lib}/libtorch.so"
    assert env["LD_LIBRARY_PATH"] == f"{lib}:/usr/local/cuda/lib64"
    assert env["RUSTFLAGS"].endswith("-C link-arg=-ltorch -C link-arg=-ltorch_cuda -C target-cpu=native")


def test_python_job_env(facts: dict) -> None:
    env = buildenv.build_env(facts, JobConfig(name="snake", env={"OMP_NUM_THREADS": "1"}))
    assert env == {"PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.e2e  # a native build linked against libtorch (~6 s)
def test_cargo_build_with_computed_env_links_libtorch_and_records_fingerprint(facts: dict, project) -> None:
    root, job = project
    runner = LocalRunner()
    plan = cargo.plan(facts, job)  # computed once: the build, the run and the fingerprint share it
    argv = plan.build_argv
    assert argv[1:] == ["+stable", "build", "--release", "--example", "train_probe"]
    assert plan.clean_argv == [argv[0], "clean"] and argv[0].endswith("cargo")
    env = plan.env
    assert env == buildenv.build_env(facts, job)
    crate_dir = plan.crate_dir
    assert crate_dir == str(root / "crate")
    # --offline: the crate has no dependencies, and the tests must not touch the network
    build = runner.run([*argv, "--offline"], env=env, cwd=crate_dir, timeout=240)
    assert build.ok, build.stderr
    binary = plan.run_argv()[0]
    assert binary == str(root / "target" / "release" / "examples" / "train_probe")
    info = elf.read_dynamic(binary)
    lib = facts["torch_probe"]["lib_dir"]
    assert "libtorch.so" in info["needed"], info  # kept by --no-as-needed + -ltorch
    assert lib in info["runpath"]
    # the rpath alone lets it start: no LD_LIBRARY_PATH in the run env
    clean_env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ran = LocalRunner().run(plan.run_argv(), env=clean_env)
    assert ran.ok and "device=cuda args=--mode shared --cuda" in ran.stdout

    path = cargo.write_fingerprint(runner, plan)
    assert path == str(root / "target" / cargo.FINGERPRINT_FILE)

    after = envcheck.report(workdir=str(root), job=buildenv.job_dict(job), host="local")
    checks = {c["id"]: c for c in after["checks"]}
    assert checks["stale-build"]["status"] == "ok", checks["stale-build"]
    assert checks["release-build"]["status"] == "ok" and "+stable" in checks["release-build"]["detail"]
    assert checks["binary-links-cuda"]["status"] == "ok", checks["binary-links-cuda"]
    assert checks["rustflags-no-as-needed"]["status"] == "ok"

    # the env changes (bypass switched on): the build is stale, and the detail says what changed
    changed = replace(job, bypass_version_check=True)
    stale = envcheck.report(workdir=str(root), job=buildenv.job_dict(changed), host="local")
    row = {c["id"]: c for c in stale["checks"]}["stale-build"]
    assert row["status"] == "fail" and "LIBTORCH_BYPASS_VERSION_CHECK: None -> '1'" in row["detail"]
    assert row["fix"].endswith("cargo clean") and f"CARGO_TARGET_DIR={root / 'target'}" in row["fix"]


def test_plain_cargo_build_drops_libtorch(facts: dict, project, tmp_path: Path) -> None:
    """The control: the same crate linked with -ltorch but without --no-as-needed loses it."""
    _, job = project
    lib = facts["torch_probe"]["lib_dir"]
    env = {"CARGO_TARGET_DIR": str(tmp_path / "t"), "RUSTFLAGS": f"-L native={lib} -C link-arg=-ltorch"}
    res = LocalRunner().run(["cargo", "build", "--offline", "--release", "--example", "train_probe"], env=env,
                            cwd=str(project[0] / "crate"), timeout=240)
    assert res.ok, res.stderr
    info = elf.read_dynamic(str(tmp_path / "t" / "release" / "examples" / "train_probe"))
    assert "libtorch.so" not in info["needed"]  # rustc links with --as-needed by default


@pytest.mark.parametrize(("needed", "through_libtorch", "status", "said"), [
    (["libtorch_cuda.so", "libtorch.so", "libc10.so"], False, "ok", "NEEDED: libtorch_cuda.so"),
    (["libtorch.so", "libc10.so"], True, "ok", "comes through libtorch.so"),
    (["libtorch.so", "libc10.so"], False, "fail", "the binary will train on the CPU"),
    (["libc.so.6"], False, "fail", "libtorch_cuda.so was dropped"),
])
def test_on_a_cuda_wheel_a_binary_without_libtorch_cuda_is_a_failure_not_a_silent_cpu_run(
        facts: dict, project, needed, through_libtorch, status, said) -> None:
    """The tch-rs trap, judged from the binary's NEEDED entries (read from its ELF on the host) against a
    CUDA wheel's libraries: libtorch_cuda.so kept, directly or through libtorch.so, is ok; dropped by
    --as-needed, the run would train on the CPU without a word, so the row fails and says to rebuild."""
    _, job = project
    lib = "/opt/venv/lib/python3.12/site-packages/torch/lib"
    probe = {**facts["torch_probe"], "lib_dir": lib, "libs": {"libtorch.so": True, "libtorch_cuda.so": True},
             "libtorch_needed": ["libtorch_cuda.so"] if through_libtorch else []}
    crate = {**(facts.get("crate") or {}), "binary": "target/release/examples/train_probe", "binary_exists": True,
             "elf": {"needed": needed, "runpath": [lib]}}
    judged = checks.evaluate({**facts, "torch_probe": probe, "crate": crate}, buildenv.job_dict(job))
    rows = {c["id"]: c for c in judged}
    row = rows["binary-links-cuda"]
    assert row["status"] == status and said in row["detail"], row
    assert f"RUNPATH {lib}" in row["detail"]
    assert (row["fix"] or "").endswith("rebuild with thrust-remote train") == (status == "fail")
