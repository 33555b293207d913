"""The native-link logic proved on a real libtorch program (tests/native/libtorch_probe.cpp, built
with g++ against the torch wheel: tch-rs itself cannot be built without crates.io): it fails to start without buildenv's
env (exit 127) and runs with it; doctor's link check reads its NEEDED list and flags the
--as-needed build while the --no-as-needed one passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import envcheck
from thrust_remote.core.config import JobConfig
from thrust_remote.run import buildenv, cargo

NATIVE = Path(__file__).parent / "native"
# e2e: a native build, one libtorch program compiled with g++ (~10 s) for all the module's tests, on one
# worker
pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++"),
              pytest.mark.xdist_group("test_native_link")]


# ~10-20 s quiet (about 30 s beside three other workers): two programs compiled and linked against
# libtorch by g++, once for the module; the link is the subject.
@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Compile once (~8 s), link twice: with -Wl,--as-needed and with -Wl,--no-as-needed."""
    import torch

    torch_dir = Path(torch.__file__).parent
    out = tmp_path_factory.mktemp("native")
    obj = out / "probe.o"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    subprocess.run(
        ["g++", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", str(torch_dir / "include"),
         "-I", str(torch_dir / "include" / "torch" / "csrc" / "api" / "include"), "-c",
         str(NATIVE / "libtorch_probe.cpp"), "-o", str(obj)],
        check=True, timeout=600,
    )
    built = {}
    for mode in ("as-needed", "no-as-needed"):
        exe = out / mode / "train_probe"
        exe.parent.mkdir()
        subprocess.run(["g++", str(obj), "-o", str(exe), "-L", str(torch_dir / "lib"), f"-Wl,--{mode}",
                        "-ltorch", "-ltorch_cpu", "-lc10"], check=True, timeout=300)
        built[mode] = exe
    return built


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "LD_PRELOAD")}


def project(root: Path, binary: Path) -> JobConfig:
    """A crate layout with the program where cargo would have put the example."""
    crate = root / "crate"
    crate.mkdir(parents=True)
    (crate / "Cargo.toml").write_text('[package]\nname = "probe"\nversion = "0.1.0"\nedition = "2021"\n')
    dest = crate / "target" / "release" / "examples" / "train_probe"
    dest.parent.mkdir(parents=True)
    shutil.copy2(binary, dest)
    return JobConfig(name="probe-rs", kind="cargo", example="train_probe", crate="crate")


def test_program_needs_the_env_to_start(binaries: dict[str, Path]) -> None:
    res = subprocess.run([str(binaries["no-as-needed"])], capture_output=True, text=True, env=clean_env(),
                         timeout=60)
    assert res.returncode == 127
    assert "libtorch.so: cannot open shared object file" in res.stderr


def test_program_runs_with_buildenv_env(binaries: dict[str, Path], tmp_path: Path) -> None:
    job = project(tmp_path, binaries["no-as-needed"])
    facts = envcheck.report(workdir=str(tmp_path), job=buildenv.job_dict(job), host="local")["facts"]
    env = {**clean_env(), **buildenv.build_env(facts, job)}
    argv = cargo.plan(facts, job).run_argv()
    assert argv == [str(tmp_path / "crate" / "target" / "release" / "examples" / "train_probe")]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "libtorch_probe sum=24" in res.stdout


@pytest.mark.parametrize(("mode", "status"), [("as-needed", "warn"), ("no-as-needed", "ok")])
def test_doctor_reads_needed(cli, binaries: dict[str, Path], tmp_path: Path, mode: str, status: str) -> None:
    project(tmp_path, binaries[mode])
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(
        f"hosts:\n  local:\n    python: {sys.executable}\n    workdir: {tmp_path}\n"
        "jobs:\n  probe-rs:\n    kind: cargo\n    example: train_probe\n    crate: crate\n"
    )
    proc = cli("--config", str(cfg), "doctor", "--job", "probe-rs", "--json")
    doc = json.loads(proc.stdout)
    row = {c["id"]: c for c in doc["checks"]}["binary-links-cuda"]
    needed = doc["facts"]["crate"]["elf"]["needed"]
    assert row["status"] == status, row
    if mode == "as-needed":
        assert "libtorch.so" not in needed and "libtorch.so was dropped by --as-needed" in row["detail"]
        assert "cargo clean" in row["fix"]
    else:
        assert "libtorch.so" in needed
