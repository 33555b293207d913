"""envcheck's pure parts: the tch->torch table, nvidia-smi output, Cargo.lock, ELF, and the checks
evaluated over facts built from captured outputs (one GPU, several, MIG, no devices)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from envcheck import buildenv, checks, elf, nvsmi, probe, tables

DATA = Path(__file__).parent / "data" / "nvidia_smi"


def read(name: str) -> str:
    return (DATA / name).read_text()


# ---------------------------------------------------------------- tch -> torch


@pytest.mark.parametrize(
    ("tch", "torch"),
    [("0.9.0", (1, 13)), ("0.13.0", (2, 0)), ("0.22.0", (2, 9)), ("0.23.1", (2, 10)), ("0.24.0", (2, 11)),
     ("0.25.0", (2, 12)), ("0.26.0", (2, 13)), ("0.14", (2, 1))],
)
def test_tch_table_maps_each_release_to_its_torch(tch: str, torch: tuple[int, int]) -> None:
    assert tables.torch_for_tch(tch) == torch


def test_tch_match_ignores_patch_and_cuda_suffix() -> None:
    assert tables.torch_matches_tch("2.9.0+cu128", "0.22.0") is True
    assert tables.torch_matches_tch("2.9.1", "0.22.0") is True
    assert tables.torch_matches_tch("2.13.0+cpu", "0.22.0") is False
    assert tables.torch_matches_tch("2.10.0", "0.22.0") is False  # 2.10 is not 2.1 or 2.9
    assert tables.torch_matches_tch("2.9.0", "0.99.0") is None  # unknown tch: no verdict
    assert tables.torch_matches_tch(None, "0.22.0") is None


def test_driver_requirement_for_cuda_versions() -> None:
    assert tables.driver_requirement("12.8") == ("570.26", "525.60.13")
    assert tables.driver_requirement("12.7")[0] == "560.28.03"  # unlisted minor: the one below
    assert tables.version_at_least("550.54.15", "525.60.13") is True
    assert tables.version_at_least("470.256.02", "525.60.13") is False


# ---------------------------------------------------------------- nvidia-smi


def test_parse_one_gpu() -> None:
    (gpu,) = nvsmi.parse_query(read("l4_one_gpu.csv"))
    assert gpu == {"index": 0, "name": "NVIDIA L4", "driver_version": "550.54.15", "utilization_pct": 97,
                   "memory_used_mib": 3542, "memory_total_mib": 23034}


def test_parse_several_gpus_with_uuids() -> None:
    s = nvsmi.summarize(read("a100_four_gpus.csv"), 0, read("a100_four_gpus.list"))
    assert s["gpu_count"] == 4 and s["error"] is None and s["mig"] is False
    assert [g["utilization_pct"] for g in s["gpus"]] == [0, 100, 0, 37]
    assert s["gpus"][3]["uuid"] == "GPU-4a0b6d3c-3f2b-11ee-8c90-0242ac120002"
    assert s["driver_version"] == "535.183.01"


def test_parse_mig_gpu_has_no_utilization_and_lists_instances() -> None:
    s = nvsmi.summarize(read("a100_mig.csv"), 0, read("a100_mig.list"))
    assert s["mig"] is True
    assert s["gpus"][0]["utilization_pct"] is None  # "[N/A]"
    assert [m["profile"] for m in s["gpus"][0]["mig_devices"]] == ["3g.20gb", "2g.10gb", "1g.5gb"]
    assert s["gpus"][1]["mig_devices"] == []


def test_parse_no_devices_and_failures() -> None:
    s = nvsmi.summarize(read("no_devices.txt"), 6)
    assert s["gpus"] == [] and s["error"] == "No devices were found"
    s = nvsmi.summarize(read("driver_mismatch.txt"), 18)
    assert s["gpus"] == [] and "Driver/library version mismatch" in s["error"]


def test_parse_name_with_comma() -> None:
    (gpu,) = nvsmi.parse_query("0, NVIDIA RTX 6000 Ada Generation, rev 2, 560.35.03, 5, 100, 49140\n")
    assert gpu["name"] == "NVIDIA RTX 6000 Ada Generation, rev 2" and gpu["memory_total_mib"] == 49140


# ---------------------------------------------------------------- checks over captured facts


def gpu_facts(csv: str, listing: str = "", rc: int = 0, **probe_over) -> dict:
    """Facts as envcheck collects them on a GPU host, from captured nvidia-smi output."""
    smi = {"found": True, "path": "/usr/bin/nvidia-smi", "on_path": True, "dev_nodes": 1, "exit_code": rc,
           **nvsmi.summarize(read(csv), rc, read(listing) if listing else "")}
    lib = "/opt/venv/lib/python3.12/site-packages/torch/lib"
    torch_probe = {"ok": True, "stage": "done", "version": "2.9.0+cu128", "cuda_version": "12.8",
                   "lib_dir": lib, "file": lib[:-4] + "/__init__.py", "cxx11_abi": True,
                   "cuda_available": True, "device_count": smi["gpu_count"],
                   "devices": [{"index": g["index"], "name": g["name"], "memory_mib": g["memory_total_mib"] or 0}
                               for g in smi["gpus"]],
                   "matmul": {"ok": True, "ms": 0.2, "max_abs_err": 1e-5},
                   "gpu_probe": {"samples": [{"index": 0, "utilization_pct": 93}], "max_pct": 93},
                   "libs": dict.fromkeys(buildenv.TORCH_LIBS, True), "nccl_available": True, "nccl_version": "2.27.3",
                   **probe_over}
    return {"host": "gpu", "python": "3.12.3", "python_path": "/opt/venv/bin/python", "torch": "2.9.0+cu128",
            "torch_probe": torch_probe, "nvidia_smi": smi, "env": {"PATH": "/usr/bin"}, "other_pythons": [],
            "disk": {"path": "/home", "free_bytes": 200 << 30, "total_bytes": 500 << 30},
            "git": {"found": True, "path": "/usr/bin/git", "repo": True, "branch": "main", "dirty_files": 0},
            "rust": {"cargo": "/home/u/.cargo/bin/cargo", "cargo_on_path": True, "rustup": "/home/u/.cargo/bin/rustup",
                     "toolchains": ["stable-x86_64-unknown-linux-gnu", "nightly-x86_64-unknown-linux-gnu"]}}


def by_id(facts: dict, job: dict | None = None) -> dict[str, dict]:
    results = checks.evaluate(facts, job)
    assert [r["id"] for r in results] == list(checks.CHECK_IDS)
    assert all(r["status"] in ("ok", "warn", "fail", "skip") for r in results)
    return {r["id"]: r for r in results}


def test_healthy_multi_gpu_host_passes() -> None:
    # driver 535 ships with CUDA 12.2, so a cu121 wheel is what this host should run
    r = by_id(gpu_facts("a100_four_gpus.csv", "a100_four_gpus.list", cuda_version="12.1", version="2.5.1+cu121"))
    for cid in ("cuda-available", "nvidia-smi", "driver-cuda", "gpu-utilization", "nccl", "cuda-visible-devices"):
        assert r[cid]["status"] == "ok", r[cid]
    assert "4 device(s)" in r["cuda-available"]["detail"]


def test_old_driver_fails_with_the_needed_version() -> None:
    r = by_id(gpu_facts("rtx3090_old_driver.csv"))
    assert r["driver-cuda"]["status"] == "fail"
    assert "570.26" in r["driver-cuda"]["detail"] and "570.26" in r["driver-cuda"]["fix"]


def test_mig_skips_utilization() -> None:
    r = by_id(gpu_facts("a100_mig.csv", "a100_mig.list"))
    assert r["gpu-utilization"]["status"] == "skip" and "MIG" in r["gpu-utilization"]["detail"]
    assert "MIG 3 instance(s)" in r["nvidia-smi"]["detail"]


def test_no_devices_fails_nvidia_smi() -> None:
    f = gpu_facts("no_devices.txt", rc=6, cuda_available=False, device_count=0, devices=[])
    r = by_id(f)
    assert r["nvidia-smi"]["status"] == "fail" and "No devices were found" in r["nvidia-smi"]["detail"]
    assert r["cuda-available"]["status"] == "fail"


def test_cpu_wheel_on_gpu_host_names_the_cuda_wheel() -> None:
    f = gpu_facts("l4_one_gpu.csv", "l4_one_gpu.list", cuda_available=False, device_count=0, devices=[],
                  cuda_version=None, version="2.9.0+cpu")
    r = by_id(f)
    assert r["cuda-available"]["status"] == "fail"
    assert "CPU-only build" in r["cuda-available"]["detail"]
    # driver 550 runs CUDA 12.4: the newest wheel index at or below it is cu124
    assert r["cuda-available"]["fix"].endswith("--index-url https://download.pytorch.org/whl/cu124")


def test_no_gpu_fix_says_what_the_host_lacks_and_sends_local_to_a_gpu_host() -> None:
    none = {"found": False, "dev_nodes": 0}
    cuda_build = {"cuda_available": False, "device_count": 0, "devices": [], "matmul": None}
    remote = {**gpu_facts("l4_one_gpu.csv", **cuda_build), "nvidia_smi": none}
    row = by_id(remote)["cuda-available"]
    assert row["status"] == "warn" and "torch 2.9.0+cu128 is a CUDA 12.8 build" in row["detail"]
    assert row["fix"].startswith("gpu has no NVIDIA driver or GPU: train on a GPU host")
    assert "install the NVIDIA driver on gpu" in row["fix"] and "CUDA build of torch" not in row["fix"]
    # a CPU build of torch stays one once the driver is in: the fix says the torch must change too
    cpu = {**remote, "torch_probe": {**remote["torch_probe"], "version": "2.13.0+cpu", "cuda_version": None}}
    cpu_row = by_id(cpu)["cuda-available"]
    assert "is a CPU build" in cpu_row["detail"] and cpu_row["fix"].endswith(
        "then a CUDA build of torch there (doctor gives its pip command once the driver is in)")
    local = by_id({**remote, "host": "local"})["cuda-available"]
    assert local["fix"] == "train on a GPU host: add it under hosts: in thrust.yaml and pass --host"


@pytest.mark.parametrize(
    ("value", "status", "evidence"),
    [("1,3", "ok", "'1,3'"), ("7", "fail", "index 7 does not exist"), ("0,0", "fail", "listed twice"),
     ("", "warn", "hides every GPU"), ("gpu0", "fail", "not an index"),
     ("GPU-2e8b4f1a-3f2b-11ee-8c90-0242ac120002", "ok", "GPU-2e8b"),
     ("GPU-ffffffff-0000-0000-0000-000000000000", "fail", "not a UUID"),
     ("GPU-2e8b4f1a", "ok", "GPU-2e8b4f1a")],  # a unique prefix is what CUDA's own docs show
)
def test_cuda_visible_devices_validity(value: str, status: str, evidence: str) -> None:
    f = gpu_facts("a100_four_gpus.csv", "a100_four_gpus.list")
    f["env"]["CUDA_VISIBLE_DEVICES"] = value
    r = by_id(f)["cuda-visible-devices"]
    assert r["status"] == status, r
    assert evidence in r["detail"]


def test_configured_gpus_must_exist() -> None:
    f = gpu_facts("l4_one_gpu.csv", "l4_one_gpu.list")
    f["gpus_config"] = [0, 1]
    r = by_id(f)["cuda-visible-devices"]
    assert r["status"] == "fail" and "hosts.gpu.gpus" in r["fix"]


def test_torch_version_against_tch_pin() -> None:
    f = gpu_facts("l4_one_gpu.csv")
    f["crate"] = {"dir": "/w", "tch_version": "0.22.0", "tch_source": "Cargo.lock", "cargo_lock": True}
    job = {"name": "snake-rs", "kind": "cargo", "toolchain": "nightly", "example": "x", "args": ["--cuda"]}
    assert by_id(f, job)["torch-version"]["status"] == "ok"
    f["crate"]["tch_version"] = "0.26.0"
    r = by_id(f, job)["torch-version"]
    assert r["status"] == "fail" and "needs torch 2.13.x" in r["detail"]
    assert r["fix"].startswith("/opt/venv/bin/python -m pip install 'torch==2.13.*' --index-url")
    assert by_id(f, {**job, "bypass_version_check": True})["torch-version"]["status"] == "warn"


def test_cuda_flag_and_nightly() -> None:
    f = gpu_facts("l4_one_gpu.csv")
    job = {"name": "snake-rs", "kind": "cargo", "toolchain": "nightly", "example": "x", "args": ["--mode", "shared"]}
    r = by_id(f, job)
    assert r["cuda-flag"]["status"] == "fail" and "--cuda" in r["cuda-flag"]["fix"]
    assert r["rust-toolchain"]["status"] == "ok"
    f["rust"]["toolchains"] = ["stable-x86_64-unknown-linux-gnu"]
    r = by_id(f, job)["rust-toolchain"]
    assert r["status"] == "fail" and r["fix"] == "rustup toolchain install nightly"


def test_cargo_env_checks_on_a_cuda_wheel() -> None:
    f = gpu_facts("l4_one_gpu.csv")
    job = {"name": "snake-rs", "kind": "cargo", "toolchain": "nightly", "example": "x", "args": ["--cuda"]}
    r = by_id(f, job)
    for cid in ("libtorch-use-pytorch", "ld-library-path", "ld-preload", "rustflags-no-as-needed"):
        assert r[cid]["status"] == "ok", r[cid]
    # a job env that points LIBTORCH_USE_PYTORCH elsewhere is caught
    r = by_id(f, {**job, "env": {"LIBTORCH_USE_PYTORCH": "0"}})
    assert r["libtorch-use-pytorch"]["status"] == "fail"
    # a host that exports CARGO_ENCODED_RUSTFLAGS overrides RUSTFLAGS: flagged
    f["env"]["CARGO_ENCODED_RUSTFLAGS"] = "-Copt-level=3"
    assert by_id(f, job)["rustflags-no-as-needed"]["status"] == "fail"


def test_every_check_survives_empty_facts() -> None:
    """A host where every probe failed still gets one row per id, none crashed."""
    for job in (None, {"name": "j", "kind": "cargo", "example": "x"}):
        r = by_id({}, job)
        assert not any("check crashed" in x["detail"] for x in r.values()), r


# ---------------------------------------------------------------- Cargo.lock, build.rs, ELF

CARGO_LOCK = """# This file is automatically @generated by Cargo.
version = 4

[[package]]
name = "tch"
version = "0.22.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
dependencies = [
 "torch-sys",
]

[[package]]
name = "torch-sys"
version = "0.22.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
"""


def test_cargo_lock_versions() -> None:
    v = probe.lock_versions(CARGO_LOCK)
    assert v["tch"] == ["0.22.0"] and v["torch-sys"] == ["0.22.0"]


def test_build_rs_state() -> None:
    assert probe.build_rs_state(None) == {"exists": False, "no_as_needed": False, "links_torch_after": False}
    only = 'fn main() { println!("cargo:rustc-link-arg=-Wl,--no-as-needed"); }'
    assert probe.build_rs_state(only)["links_torch_after"] is False
    full = only.replace("); }", '); println!("cargo:rustc-link-arg=-ltorch"); }')
    assert probe.build_rs_state(full) == {"exists": True, "no_as_needed": True, "links_torch_after": True}


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf to compare")
def test_elf_reader_agrees_with_readelf() -> None:
    import torch

    lib = Path(torch.__file__).parent / "lib" / "libtorch_python.so"
    ours = elf.read_dynamic(str(lib))
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    theirs = [line.split("[", 1)[1].rstrip("]") for line in out.splitlines() if "(NEEDED)" in line]
    assert ours["needed"] == theirs
    assert ours["cxx11_undefined"] > 0  # torch wheels are built with the cxx11 ABI
    with pytest.raises(elf.NotElf):
        elf.read_dynamic(__file__)


def test_envcheck_sources_parse_as_python_38() -> None:
    """envcheck runs with whatever python3 a host has: no syntax newer than 3.8 in it."""
    import ast

    root = Path(checks.__file__).parent
    for path in sorted(root.glob("*.py")):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 8))
        assert "removeprefix" not in path.read_text(), path  # 3.9+


@pytest.mark.skipif(shutil.which("python3.8") is None, reason="no python3.8 here")
def test_envcheck_runs_on_python_38(tmp_path: Path) -> None:
    """A real old interpreter (pyenv has one on these machines): the report comes out whole."""
    import json

    repo = Path(checks.__file__).parent.parent
    proc = subprocess.run(["python3.8", "-m", "envcheck", "--json"], capture_output=True, text=True,
                          cwd=repo, timeout=120, env={**os.environ, "PYENV_VERSION": "3.8.18"})
    if proc.returncode != 0 and "version" in proc.stderr and "not installed" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["facts"]["python"].startswith("3.8")
    assert [c["id"] for c in doc["checks"]] == list(checks.CHECK_IDS)


def test_git_dubious_ownership_names_the_safe_directory_fix() -> None:
    f = gpu_facts("l4_one_gpu.csv")
    f["workdir"] = {"path": "/srv/thrust", "exists": True}
    f["git"] = {"found": True, "path": "/usr/bin/git", "repo": False,
                "error": "fatal: detected dubious ownership in repository at '/srv/thrust'"}
    r = by_id(f)["git"]
    assert r["status"] == "fail" and r["fix"] == "git config --global --add safe.directory /srv/thrust"


# ---------------------------------------------------------------- doctor's torch fix: wheel index, venv, which python


def test_driver_cuda_from_the_header_else_from_the_driver_table() -> None:
    assert nvsmi.parse_cuda_version(read("l4_one_gpu.txt")) == "12.4"
    assert nvsmi.parse_cuda_version(read("no_devices.txt")) is None
    assert checks.driver_cuda({"cuda_version": "12.9", "driver_version": "550.54.15"}) == "12.9"
    assert checks.driver_cuda({"driver_version": "550.54.15"}) == "12.4"  # no header: the driver table
    assert checks.driver_cuda({"driver_version": "535.183.01"}) == "12.2"
    assert checks.driver_cuda({}) is None


@pytest.mark.parametrize(
    ("cuda", "torch", "tag"),
    [("12.4", None, "cu124"),  # the newest index at or below the driver's CUDA
     ("12.2", None, "cu121"), ("12.8", None, "cu128"), ("12.9", None, "cu129"), ("13.0", None, "cu130"),
     ("13.2", None, "cu130"), ("11.8", None, "cu118"), ("11.4", None, None), (None, None, None),
     ("12.8", "2.5", "cu124"),  # a pinned torch: only the indices that carry it
     ("12.4", "2.13", "cu126"),  # built only for newer 12.x: CUDA minor-version compatibility
     ("11.8", "2.13", None)],
)
def test_wheel_index_for_the_drivers_cuda(cuda: str | None, torch: str | None, tag: str | None) -> None:
    assert checks.wheel_tag(cuda, torch) == tag


def _no_torch(**python_env: bool) -> dict:
    """A GPU host (driver 550: CUDA 12.4) whose `python:` has no torch."""
    f = gpu_facts("l4_one_gpu.csv", "l4_one_gpu.list", ok=False, version=None, cuda_version=None,
                  cuda_available=False, error="ModuleNotFoundError: No module named 'torch'", lib_dir=None)
    f["nvidia_smi"]["cuda_version"] = nvsmi.parse_cuda_version(read("l4_one_gpu.txt"))
    f["python_path"] = "/usr/bin/python3"
    f["python_env"] = {"venv": False, "conda": False, "externally_managed": True, "ensurepip": True, **python_env}
    return f


def test_missing_torch_in_a_system_python_is_a_venv_with_the_drivers_wheels() -> None:
    fix = by_id(_no_torch())["torch-import"]["fix"]
    assert fix == ("/usr/bin/python3 -m venv ~/venv && ~/venv/bin/python -m pip install torch --index-url "
                   "https://download.pytorch.org/whl/cu124"
                   "   # then in thrust.yaml: hosts.gpu.python: ~/venv/bin/python")
    no_ensurepip = by_id(_no_torch(ensurepip=False))["torch-import"]["fix"]
    assert no_ensurepip.startswith("sudo apt-get install -y python3-venv && /usr/bin/python3 -m venv ~/venv && ")


def test_missing_torch_in_a_venv_or_conda_env_installs_into_it() -> None:
    for kind in ("venv", "conda"):
        fix = by_id(_no_torch(**{kind: True}))["torch-import"]["fix"]
        assert fix == "/usr/bin/python3 -m pip install torch --index-url https://download.pytorch.org/whl/cu124"


def test_missing_torch_without_a_gpu_takes_the_cpu_index() -> None:
    f = _no_torch(venv=True)
    f["nvidia_smi"] = {"found": False, "gpus": [], "gpu_count": 0, "dev_nodes": 0}
    assert by_id(f)["torch-import"]["fix"].endswith("--index-url https://download.pytorch.org/whl/cpu")


def test_ssh_python_names_the_venv_under_home_that_has_torch() -> None:
    f = _no_torch()
    f["home"] = "/home/ann"
    f["other_pythons"] = [{"path": "/home/ann/venv/bin/python", "torch": False},
                          {"path": "/home/ann/proj/.venv/bin/python", "torch": True},
                          {"path": "/home/ann/miniconda3/envs/rl/bin/python", "torch": True},
                          {"path": "/usr/local/bin/python3", "torch": True}]
    r = by_id(f)
    assert r["ssh-python"]["status"] == "fail"
    assert r["ssh-python"]["fix"] == "set `python: ~/proj/.venv/bin/python` under hosts.gpu in thrust.yaml"
    assert "~/miniconda3/envs/rl/bin/python" in r["ssh-python"]["detail"]
    assert "~/proj/.venv/bin/python" in r["torch-import"]["fix"]  # switching beats installing
    assert checks.display_path("/home/ann2/x", "/home/ann") == "/home/ann2/x"
    assert checks.choose_python([{"path": "/usr/bin/python3", "torch": False}], "/home/ann") is None


def test_python_candidates_search_the_users_environments_in_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    for d in ("venv", ".venv", "b/.venv", "a/venv", ".hidden/venv", "miniforge3/envs/rl", "anaconda3/envs/x",
              "miniconda3"):
        (home / d).mkdir(parents=True)
    found = probe.python_candidates(str(tmp_path / "wd"), str(home))
    rel = [os.path.relpath(p, home) for p in found if p.startswith(str(home))]
    assert rel == ["venv/bin/python", ".venv/bin/python", "b/.venv/bin/python", "a/venv/bin/python",
                   "anaconda3/envs/x/bin/python", "miniforge3/envs/rl/bin/python",
                   "miniconda3/bin/python", "anaconda3/bin/python", "miniforge3/bin/python"]  # conda bases last
    assert found[0] == str(tmp_path / "wd" / ".venv" / "bin" / "python")
