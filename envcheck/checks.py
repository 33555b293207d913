"""The checklist: facts in, one result per stable check id out. Pure functions, no I/O.

Each check returns status ok | warn | fail | skip, the evidence (`detail`) and the exact fix (a
command, or a line for thrust.yaml), or None when there is nothing to do. `skip` always says why.
The ids are a contract (scripts and tests use them): add new ones, never rename.
"""

from __future__ import annotations

import re
import shlex

from . import buildenv, tables

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
LOCAL_HOST = "local"  # thrust.yaml's name for this machine (thrust_remote/core/config/model.py LOCAL): doctor passes it

# (id, title) in report order: the GPU box checklist (python, torch, CUDA, the tch-rs link) first, then
# what a run over SSH needs besides.
CHECKS = (
    ("python", "Host python runs envcheck"),
    ("torch-import", "PyTorch imports"),
    ("torch-version", "PyTorch version matches the tch-rs pin"),
    ("cuda-available", "CUDA available and a kernel runs"),
    ("rust-toolchain", "Rust toolchain the job asks for (+nightly) is installed"),
    ("libtorch-use-pytorch", "LIBTORCH_USE_PYTORCH=1 in the build env"),
    ("ld-library-path", "LD_LIBRARY_PATH starts with torch's lib directory"),
    ("ld-preload", "LD_PRELOAD has libtorch_cuda.so and libtorch.so"),
    ("rustflags-no-as-needed", "RUSTFLAGS keep libtorch linked (--no-as-needed)"),
    ("stale-build", "No stale build: the env is the one the last build used"),
    ("release-build", "Built with +TOOLCHAIN --release"),
    ("cuda-flag", "Training command passes --cuda"),
    ("gpu-utilization", "GPU utilization seen during a probe run"),
    ("nvidia-smi", "nvidia-smi lists the GPUs"),
    ("driver-cuda", "Driver new enough for the wheel's CUDA"),
    ("binary-links-cuda", "Binary's NEEDED list keeps libtorch(_cuda)"),
    ("build-rs-no-as-needed", "build.rs passes --no-as-needed and -ltorch"),
    ("cxx-abi", "C++ ABI consistent with torch"),
    ("torch-libs", "torch/lib has the libtorch libraries"),
    ("ssh-python", "The session's python is the one with torch"),
    ("cuda-visible-devices", "CUDA_VISIBLE_DEVICES and configured GPUs are valid"),
    ("nccl", "NCCL available for multi-GPU"),
    ("disk-space", "Disk space in the workdir"),
    ("git", "git present; workdir state"),
)
CHECK_IDS = tuple(cid for cid, _ in CHECKS)
# the checks that only a tch-rs (cargo) job has anything to say about: for any other job they skip
# (Ctx.not_cargo), and doctor leaves those skips out of its table when no job of the project is cargo
CARGO_ONLY = ("rust-toolchain", "libtorch-use-pytorch", "ld-library-path", "ld-preload", "rustflags-no-as-needed",
              "stale-build", "release-build", "cuda-flag", "binary-links-cuda", "build-rs-no-as-needed")
TITLES = dict(CHECKS)

GIB = 1 << 30
DISK_FAIL = 2 * GIB  # a tch-rs release build alone takes ~1-2 GB of target/
DISK_WARN = 10 * GIB


# PyTorch's CUDA wheel indices (WHEEL_INDEX + tag), one per CUDA toolkit, with the first and last
# torch minor each carries (None: still carried by the newest release when this was written, 2.9).
# A driver runs wheels built for its own CUDA version or an older one, so a fix takes the newest
# index <= the driver's CUDA (nvidia-smi's "CUDA Version"); a host without a GPU takes .../whl/cpu.
# Source: pytorch.org/get-started/previous-versions. This table is the only place to update.
WHEEL_INDEX = "https://download.pytorch.org/whl/"
TORCH_CUDA_INDICES = (
    ("cu118", (11, 8), (2, 0), (2, 7)),
    ("cu121", (12, 1), (2, 1), (2, 5)),
    ("cu124", (12, 4), (2, 4), (2, 6)),
    ("cu126", (12, 6), (2, 6), None),
    ("cu128", (12, 8), (2, 7), None),
    ("cu129", (12, 9), (2, 8), None),
    ("cu130", (13, 0), (2, 9), None),
)
VENV = "~/venv"  # where doctor's fix makes a venv when the host's python refuses pip (PEP 668)


def wheel_tag(driver_cuda: str | None, torch: str | None = None) -> str | None:
    """The newest index in TORCH_CUDA_INDICES at or below the driver's CUDA that carries `torch` (a
    version like "2.5", when one is pinned). When a pinned torch is only built for a newer CUDA of the
    same major, its oldest such index (CUDA minor-version compatibility: a 12.x driver >= 525 runs
    12.y wheels); None when the driver's CUDA is unknown or too old."""
    cuda = tables.parse_version(driver_cuda)
    if not cuda or len(cuda) < 2:
        return None
    want = tables.parse_version(torch)
    carries = [
        (tag, need) for tag, need, first, last in TORCH_CUDA_INDICES
        if not want or (first <= want[:2] and (last is None or want[:2] <= last))
    ]
    fits = [tag for tag, need in carries if need <= cuda[:2]]
    if fits:
        return fits[-1]
    compatible = [tag for tag, need in carries if want and need[0] == cuda[0]]
    return compatible[0] if compatible else None


def driver_cuda(smi: dict) -> str | None:
    """The newest CUDA the driver runs: nvidia-smi's header, else the driver table (tables.CUDA_DRIVER)."""
    if smi.get("cuda_version"):
        return smi["cuda_version"]
    driver = smi.get("driver_version")
    ok = [cuda for cuda, need in tables.CUDA_DRIVER.items() if tables.version_at_least(driver, need)]
    return tables.fmt(max(ok)) if ok else None


def display_path(path: str, home: str | None) -> str:
    """`~/x` for a path under the host's home: what a thrust.yaml line should say (portable, short)."""
    if home and home != "/" and path.startswith(home.rstrip("/") + "/"):
        return "~" + path[len(home.rstrip("/")):]
    return path


def choose_python(others: list, home: str | None) -> str | None:
    """The interpreter to put in `python:`: the first with torch, in probe order (probe.python_candidates:
    the workdir's venv, venvs under home, conda envs, then system ones), shown as `~/...` when under home."""
    for other in others:
        if other.get("torch"):
            return display_path(other["path"], home)
    return None


def result(cid: str, status: str, detail: str, fix: str | None = None) -> dict:
    return {"id": cid, "title": TITLES[cid], "status": status, "detail": detail, "fix": fix}


class Ctx:
    """Derived views of the facts that several checks share."""

    def __init__(self, facts: dict, job: dict | None) -> None:
        self.facts = facts
        self.job = job or {}
        self.probe = facts.get("torch_probe") or {}
        self.smi = facts.get("nvidia_smi") or {}
        self.crate = facts.get("crate") or {}
        self.rust = facts.get("rust") or {}
        self.env = facts.get("env") or {}
        self.host = facts.get("host") or "HOST"
        self.python = facts.get("python_path") or "python3"
        self.is_cargo = self.job.get("kind") == "cargo"
        self.torch_ok = bool(self.probe.get("ok") or self.probe.get("version"))
        self.lib = self.probe.get("lib_dir") if self.torch_ok else None
        self.cuda_libs = buildenv.has_cuda_libs(facts)
        self.gpu_count = int(self.smi.get("gpu_count") or 0)
        self.has_gpu = bool(self.gpu_count or self.smi.get("dev_nodes") or self.probe.get("cuda_available"))
        self.build_env = buildenv.cargo_env(facts, self.job) if self.is_cargo else {}
        self.job_name = self.job.get("name") or "JOB"
        self.crate_dir = self.crate.get("dir") or "."

    def not_cargo(self, cid: str, why: str = "") -> dict:
        if self.job:
            detail = f"for tch-rs (cargo) jobs; {self.job_name!r} is a {self.job.get('kind', 'python')} job"
        else:
            detail = "for tch-rs (cargo) jobs: pass --job NAME"
        return result(cid, SKIP, detail + (f" ({why})" if why else ""))

    def index_url(self, version: str | None = None) -> str | None:
        """The wheel index for this host: CPU without a GPU, else wheel_tag of the driver's CUDA."""
        if not self.has_gpu:
            return WHEEL_INDEX + "cpu"
        tag = wheel_tag(driver_cuda(self.smi), version)
        return WHEEL_INDEX + tag if tag else None

    def pip_args(self, version: str | None = None) -> list[str]:
        """`-m pip install torch[==X.*] [--index-url URL]`: what follows the interpreter."""
        url = self.index_url(version)
        return ["-m", "pip", "install", f"torch=={version}.*" if version else "torch",
                *(["--index-url", url] if url else [])]

    def pip_torch(self, version: str | None = None) -> str:
        return shlex.join([self.python, *self.pip_args(version)])

    def install_torch(self, version: str | None = None) -> str:
        """A command that gives this host a working torch: into `python:` when pip may write there (a venv,
        a conda env), else into a new venv, which `python:` must then name (a distribution's python
        refuses pip: PEP 668)."""
        env = self.facts.get("python_env") or {}
        if env.get("venv") or env.get("conda") or (env and not env.get("externally_managed")):
            return self.pip_torch(version)
        venv_python = f"{VENV}/bin/python"
        # `~` stays unquoted so the user's shell expands it; everything else is quoted
        steps = [f"{shlex.quote(self.python)} -m venv {VENV}", f"{venv_python} {shlex.join(self.pip_args(version))}"]
        if env and not env.get("ensurepip"):
            steps.insert(0, "sudo apt-get install -y python3-venv")
        return " && ".join(steps) + f"   # then in thrust.yaml: hosts.{self.host}.python: {venv_python}"

    def doctor_cmd(self, *args: str) -> str:
        """A thrust-remote command for this host (the laptop adds --config: thrust_remote/core/hints.py)."""
        return shlex.join(["thrust-remote", "doctor", *args, "--host", self.host])

    def cd_crate(self, cmd: list[str]) -> str:
        return f"cd {shlex.quote(self.crate_dir)} && {shlex.join(cmd)}"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def check_python(c: Ctx) -> dict:
    version = c.facts.get("python") or "?"
    parsed = tables.parse_version(version) or (0,)
    detail = f"{c.python} is Python {version}"
    if parsed < (3, 10):
        return result("python", WARN, detail + "; the trainer needs 3.10+",
                      f"set hosts.{c.host}.python in thrust.yaml to a Python 3.10+ interpreter")
    return result("python", OK, detail)


def check_torch_import(c: Ctx) -> dict:
    p = c.probe
    if p.get("version"):  # the import itself worked, even if CUDA init hung afterwards
        return result("torch-import", OK, f"torch {p.get('version')} from {p.get('file')} "
                      f"(import {p.get('import_s', '?')} s){_reused(c)}")
    err = p.get("error") or "unknown error"
    if p.get("timed_out"):
        return result("torch-import", FAIL, f"{c.python}: {err}",
                      f"{c.python} -c 'import torch'   # run by hand to see where it hangs")
    if "No module named 'torch'" in err or "ModuleNotFoundError" in err:
        other = choose_python(c.facts.get("other_pythons") or [], c.facts.get("home"))
        fix = (f"set `python: {other}` under hosts.{c.host} in thrust.yaml (it has torch; see ssh-python)"
               if other else c.install_torch(_wanted_torch(c)))
        return result("torch-import", FAIL, f"{c.python} has no torch: {err}", fix)
    return result("torch-import", FAIL, f"import torch failed in {c.python}: {err}",
                  c.pip_torch(_wanted_torch(c)).replace(" install ", " install --force-reinstall ", 1))


def _reused(c: Ctx, short: bool = False) -> str:
    """Said beside every answer taken from a kept probe (torchprobe.REUSE_S), with how to redo it
    (short: the rows after torch-import, which says the rest)."""
    reused = c.probe.get("reused")
    if not reused:
        return ""
    if short:
        return f"; probed {_ago(reused.get('age_s'))} ago and reused (see torch-import)"
    host = "" if c.host == LOCAL_HOST else f" --host {c.host}"
    return (f"; probed {_ago(reused.get('age_s'))} ago and reused: its python, packages, driver and GPUs are "
            f"unchanged (`thrust-remote doctor{host} --fresh` probes again)")


def _ago(seconds: object) -> str:
    s = float(seconds) if isinstance(seconds, (int, float)) else 0.0
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min"


def _wanted_torch(c: Ctx) -> str | None:
    want = tables.torch_for_tch(c.crate.get("tch_version")) if c.is_cargo else None
    return tables.fmt(want) if want else None


def check_torch_version(c: Ctx) -> dict:
    cid = "torch-version"
    have = c.probe.get("version")
    if not have:
        return result(cid, SKIP, "torch does not import (see torch-import)")
    if not c.is_cargo:
        parsed = tables.parse_version(have) or (0,)
        if parsed < (2, 4):
            return result(cid, WARN, f"torch {have}; thrust-remote's trainer needs torch >= 2.4", c.pip_torch())
        return result(cid, OK, f"torch {have} (python job: no tch-rs pin; >= 2.4 needed)")
    tch = c.crate.get("tch_version")
    if not tch:
        where = "Cargo.lock has no `tch` package" if c.crate.get("cargo_lock") else f"no Cargo.lock in {c.crate_dir}"
        return result(cid, SKIP, f"{where}; set jobs.{c.job_name}.tch_version or build once to create it")
    want = tables.torch_for_tch(tch)
    if want is None:
        return result(cid, WARN, f"tch {tch} ({c.crate.get('tch_source')}) is not in the tch->torch table; "
                      f"torch is {have}", None)
    match = tables.torch_matches_tch(have, tch)
    detail = f"tch {tch} ({c.crate.get('tch_source')}) needs torch {tables.fmt(want)}.x; host has {have}"
    if match:
        return result(cid, OK, detail)
    if c.job.get("bypass_version_check"):
        return result(cid, WARN, detail + "; LIBTORCH_BYPASS_VERSION_CHECK=1 is set (bypass_version_check), "
                      "so the build proceeds and may fail on changed C++ APIs", c.pip_torch(tables.fmt(want)))
    return result(cid, FAIL, detail + "; torch-sys refuses to build against it", c.pip_torch(tables.fmt(want)))


def check_cuda(c: Ctx) -> dict:
    cid = "cuda-available"
    p = c.probe
    if not c.torch_ok:
        return result(cid, SKIP, "torch does not import (see torch-import)")
    if p.get("timed_out") and p.get("stage") in ("cuda init", "cuda matmul", "nccl"):
        return result(cid, FAIL, f"{p.get('error')}: the driver or a GPU is wedged",
                      "nvidia-smi   # if it hangs too, the driver needs a reset or the host a reboot")
    if p.get("cuda_available"):
        names = ", ".join(f"{d['name']} ({d['memory_mib']} MiB)" for d in p.get("devices") or [])
        mm = p.get("matmul") or {}
        if not mm.get("ok"):
            return result(cid, FAIL, f"torch.cuda.is_available() is True ({names}) but a 256x256 matmul failed: "
                          f"{mm.get('error') or 'wrong result, max error ' + str(mm.get('max_abs_err'))}",
                          f"{c.python} -c 'import torch; print(torch.ones(1, device=\"cuda\") * 2)'")
        return result(cid, OK, f"{p.get('device_count')} device(s): {names}; 256x256 matmul ran in "
                      f"{mm.get('ms')} ms, max error {mm.get('max_abs_err'):.1e}{_reused(c, short=True)}")
    if not c.has_gpu:
        return _no_gpu(c)
    if not p.get("cuda_version"):
        return result(cid, FAIL, f"the host has {c.gpu_count or 'a'} GPU(s) but torch {p.get('version')} is a "
                      "CPU-only build", c.pip_torch().replace(" install ", " install --force-reinstall ", 1))
    why = p.get("cuda_error") or "torch.cuda.is_available() is False"
    cvd = c.env.get("CUDA_VISIBLE_DEVICES")
    hint = f"; CUDA_VISIBLE_DEVICES={cvd!r}" if cvd is not None else ""
    return result(cid, FAIL, f"{why} (torch built for CUDA {p.get('cuda_version')}, driver "
                  f"{c.smi.get('driver_version') or 'unknown'}{hint})",
                  "nvidia-smi   # then see the driver-cuda and cuda-visible-devices rows")


def _no_gpu(c: Ctx) -> dict:
    """No NVIDIA driver or GPU at all. The fix depends on where doctor looked: this machine (`local`)
    is not a GPU host, so another one goes under hosts:; a configured host is one already, so what
    it lacks is said as it is (a CUDA build of torch there shows it was meant for a GPU)."""
    p = c.probe
    build = f"a CUDA {p.get('cuda_version')} build" if p.get("cuda_version") else "a CPU build"
    detail = (f"no NVIDIA driver or GPU on {c.host} (torch {p.get('version')} is {build}; no nvidia-smi GPUs, "
              "no /dev/nvidia*): training runs on the CPU")
    if c.host == LOCAL_HOST:
        return result("cuda-available", WARN, detail,
                      "train on a GPU host: add it under hosts: in thrust.yaml and pass --host")
    # a CPU build stays one after the driver is in: say that the torch must change too
    then = "" if p.get("cuda_version") else (", then a CUDA build of torch there (doctor gives its pip command "
                                             "once the driver is in)")
    return result("cuda-available", WARN, detail,
                  f"{c.host} has no NVIDIA driver or GPU: train on a GPU host (another one under hosts:, with --host), "
                  f"or install the NVIDIA driver on {c.host} if it has a GPU (`lspci | grep -i nvidia` lists it)"
                  + then)


def check_nvidia_smi(c: Ctx) -> dict:
    cid = "nvidia-smi"
    s = c.smi
    if not s.get("found"):
        if s.get("dev_nodes") or c.probe.get("cuda_available"):
            return result(cid, FAIL, f"nvidia-smi is not on PATH ({c.env.get('PATH', '')}) nor in the usual places, "
                          "but the host has NVIDIA devices", "sudo apt-get install nvidia-utils-$(cat "
                          "/sys/module/nvidia/version | cut -d. -f1)   # or add its directory to PATH")
        return result(cid, SKIP, "nvidia-smi not found on PATH or in /usr/bin, and no /dev/nvidia* devices: "
                      "no NVIDIA GPU here")
    if s.get("error"):
        if s["error"] == "No devices were found":
            return result(cid, FAIL, f"{s.get('path')}: No devices were found (driver loaded, no GPU visible)",
                          "lspci | grep -i nvidia   # is a GPU attached? then check dmesg for NVRM errors")
        return result(cid, FAIL, f"{s.get('path')} failed (exit {s.get('exit_code')}): {s['error']}",
                      "sudo modprobe nvidia   # or reinstall the driver / reboot after a driver upgrade")
    gpus = "; ".join(
        f"{g['index']}: {g['name']}, {_pct(g.get('utilization_pct'))} util, "
        f"{g.get('memory_used_mib', '?')}/{g.get('memory_total_mib', '?')} MiB"
        + (f", MIG {len(g['mig_devices'])} instance(s)" if g.get("mig_devices") else "")
        for g in s.get("gpus") or []
    )
    detail = f"driver {s.get('driver_version')}; {gpus}"
    if not s.get("on_path"):
        return result(cid, WARN, f"{detail}; found at {s.get('path')}, not on the SSH session's PATH",
                      f"export PATH=$PATH:{s.get('path', '').rsplit('/', 1)[0]}   # in ~/.profile on the host")
    return result(cid, OK, detail)


def _pct(v: int | None) -> str:
    return "N/A" if v is None else f"{v}%"


def check_driver(c: Ctx) -> dict:
    cid = "driver-cuda"
    cuda = c.probe.get("cuda_version")
    driver = c.smi.get("driver_version")
    if not cuda:
        return result(cid, SKIP, "torch is not a CUDA build" if c.torch_ok else "torch does not import")
    if not driver:
        return result(cid, SKIP, f"torch needs CUDA {cuda}; driver version unknown (no nvidia-smi GPUs)")
    exact, floor = tables.driver_requirement(cuda)
    if exact is None:
        return result(cid, WARN, f"driver {driver}; CUDA {cuda} is not in the driver table", None)
    detail = f"driver {driver}; torch's CUDA {cuda} ships with >= {exact}"
    if tables.version_at_least(driver, exact):
        return result(cid, OK, detail)
    if floor and tables.version_at_least(driver, floor):
        return result(cid, WARN, detail + f"; runs through minor-version compatibility (>= {floor}), "
                      "but PTX JIT and newer CUDA APIs fail",
                      f"upgrade the NVIDIA driver to >= {exact}, or install a torch wheel for an older CUDA")
    older = c.pip_torch() if c.index_url() else None
    return result(cid, FAIL, detail + (f" (minimum {floor} for CUDA {cuda.split('.')[0]}.x)" if floor else ""),
                  f"upgrade the NVIDIA driver to >= {exact}" + (f", or {older}" if older else ""))


_CVD_TOKEN = re.compile(r"^(\d+|GPU-[0-9A-Fa-f-]+|MIG-[0-9A-Za-z/-]+)$")


def check_visible_devices(c: Ctx) -> dict:
    cid = "cuda-visible-devices"
    raw = c.env.get("CUDA_VISIBLE_DEVICES")
    gpus = c.smi.get("gpus") or []
    count = len(gpus) if c.smi.get("found") and not c.smi.get("error") else None
    problems: list[str] = []
    status = OK
    parts: list[str] = []
    if raw is not None:
        tokens = [t.strip() for t in raw.split(",")]
        if raw.strip() == "":
            status, problems = WARN, ["CUDA_VISIBLE_DEVICES is set but empty: it hides every GPU"]
        elif tokens == ["-1"]:
            status, problems = WARN, ["CUDA_VISIBLE_DEVICES=-1 hides every GPU"]
        else:
            uuids = {g.get("uuid") for g in gpus if g.get("uuid")}
            uuids |= {m["uuid"] for g in gpus for m in g.get("mig_devices") or []}
            seen = set()
            for tok in tokens:
                if not _CVD_TOKEN.match(tok):
                    problems.append(f"{tok!r} is not an index or GPU-/MIG- UUID (CUDA ignores it and everything after)")
                elif tok in seen:
                    problems.append(f"{tok} is listed twice (CUDA then sees no device at all)")
                elif tok.isdigit() and count is not None and int(tok) >= count:
                    problems.append(f"index {tok} does not exist (nvidia-smi lists {count} GPU(s))")
                elif not tok.isdigit() and uuids and sum(u.startswith(tok) for u in uuids) != 1:
                    # CUDA takes any unique prefix of a UUID (its docs: CUDA_VISIBLE_DEVICES=GPU-8932f937)
                    matches = sum(u.startswith(tok) for u in uuids)
                    problems.append(f"{tok} matches {matches} of the UUIDs nvidia-smi -L lists (needs exactly one)"
                                    if matches else f"{tok} is not a UUID (or UUID prefix) that nvidia-smi -L lists")
                seen.add(tok)
            if problems:
                status = FAIL
        parts.append(f"CUDA_VISIBLE_DEVICES={raw!r}")
    else:
        parts.append("CUDA_VISIBLE_DEVICES unset (all GPUs visible)")
    configured = c.facts.get("gpus_config")
    if configured:
        parts.append(f"hosts.{c.host}.gpus={list(configured)}")
        missing = [g for g in configured if count is not None and g >= count]
        if missing or (count is None and c.smi.get("found") is False):
            problems.append(f"configured GPUs {missing or list(configured)} do not exist "
                            f"(nvidia-smi lists {count if count is not None else 'no'} GPU(s))")
            status = FAIL
    detail = "; ".join(parts + problems)
    if status == OK:
        return result(cid, OK, detail)
    fix = "unset CUDA_VISIBLE_DEVICES   # in the host's ~/.bashrc / ~/.profile" if raw is not None else None
    if configured and any("configured" in p for p in problems):
        fix = f"edit hosts.{c.host}.gpus in thrust.yaml to indices from `nvidia-smi -L`"
    return result(cid, status, detail, fix)


def check_gpu_util(c: Ctx) -> dict:
    cid = "gpu-utilization"
    p = c.probe
    if not p.get("cuda_available") or not (p.get("matmul") or {}).get("ok"):
        return result(cid, SKIP, "no working CUDA device to load (see cuda-available)")
    if c.smi.get("mig"):
        return result(cid, SKIP, "MIG mode: nvidia-smi reports no per-GPU utilization")
    probe = p.get("gpu_probe") or {}
    if "error" in probe:
        return result(cid, WARN, f"probe run failed: {probe['error']}", None)
    if not probe.get("samples"):
        return result(cid, SKIP, "nvidia-smi gave no utilization samples during the probe run")
    if probe.get("max_pct", 0) > 0:
        return result(cid, OK, f"{probe['max_pct']}% peak during {probe.get('matmuls')} queued 4096^2 matmuls "
                      f"(samples: {[s['utilization_pct'] for s in probe['samples']]}){_reused(c, short=True)}")
    return result(cid, WARN, "0% utilization while a matmul burst was queued: the GPU is not the one doing "
                  "the work (another CUDA_VISIBLE_DEVICES, or the probe was too short)", "nvidia-smi dmon -c 5")


def check_nccl(c: Ctx) -> dict:
    cid = "nccl"
    n = int(c.probe.get("device_count") or 0)
    if n < 2:
        return result(cid, SKIP, f"{n} CUDA device(s): NCCL only matters for multi-GPU runs")
    if c.probe.get("nccl_available"):
        return result(cid, OK, f"NCCL {c.probe.get('nccl_version')} with {n} devices{_reused(c, short=True)}")
    return result(cid, FAIL, f"{n} GPUs but torch has no NCCL ({c.probe.get('nccl_error') or 'not built in'}): "
                  "multi-GPU training would fall back to gloo, far slower", c.pip_torch())


def check_abi(c: Ctx) -> dict:
    cid = "cxx-abi"
    abi = c.probe.get("cxx11_abi")
    if abi is None:
        return result(cid, SKIP, "torch does not import" if not c.torch_ok else "torch does not report its ABI")
    flag = int(bool(abi))
    detail = f"torch built with _GLIBCXX_USE_CXX11_ABI={flag}"
    env_abi = (c.build_env or c.env).get("LIBTORCH_CXX11_ABI")
    if env_abi is not None and env_abi.strip() not in (str(flag),):
        return result(cid, FAIL, detail + f" but LIBTORCH_CXX11_ABI={env_abi}",
                      "unset LIBTORCH_CXX11_ABI   # torch-sys reads the ABI from the PyTorch install")
    if not c.is_cargo:
        return result(cid, OK, detail + " (matters for native builds only)")
    stored = ((c.crate.get("fingerprint") or {}).get("inputs") or {}).get("cxx11_abi")
    if stored is not None and bool(stored) != bool(abi):
        return result(cid, FAIL, detail + f"; the last build used ABI={int(bool(stored))}",
                      c.cd_crate([buildenv.cargo_bin(c.facts), "clean"]))
    info = c.crate.get("elf") or {}
    if info.get("undefined") and "error" not in info:
        n = info.get("cxx11_undefined", 0)
        if n and not abi:
            return result(cid, FAIL, detail + f"; the binary references {n} std::__cxx11 symbols (ABI=1)",
                          c.cd_crate([buildenv.cargo_bin(c.facts), "clean"]))
        detail += f"; binary references {n} std::__cxx11 symbol(s)"
    return result(cid, OK, detail)


def check_rust(c: Ctx) -> dict:
    cid = "rust-toolchain"
    r = c.rust
    if not c.is_cargo:
        have = ", ".join(r.get("toolchains") or []) or ("cargo without rustup" if r.get("cargo") else "none")
        return c.not_cargo(cid, f"installed: {have}")
    want = c.job.get("toolchain") or "stable"
    install = "curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y"
    if not r.get("cargo"):
        return result(cid, FAIL, f"cargo not found (PATH={c.env.get('PATH', '')}, no ~/.cargo/bin/cargo)",
                      f"{install} --default-toolchain {want}")
    note = "" if r.get("cargo_on_path") else f"; cargo is at {r['cargo']}, not on the SSH session's PATH " \
        "(thrust-remote calls it by that path)"
    if not r.get("rustup"):
        if want == "stable":
            return result(cid, OK, f"{r['cargo']} (no rustup){note}")
        return result(cid, FAIL, f"job asks for +{want} but there is no rustup to select it{note}",
                      f"{install} --default-toolchain {want}")
    toolchains = r.get("toolchains") or []
    if not any(t == want or t.startswith(want + "-") for t in toolchains):
        return result(cid, FAIL, f"job asks for +{want}; installed: {', '.join(toolchains) or 'none'}"
                      + (f" ({r['error']})" if r.get("error") else "") + note,
                      f"rustup toolchain install {want}")
    return result(cid, OK, f"+{want} installed ({', '.join(toolchains)}){note}")


def _cargo_env_check(c: Ctx, cid: str) -> dict | None:
    if not c.is_cargo:
        return c.not_cargo(cid)
    if not c.lib:
        return result(cid, SKIP, "torch does not import, so its lib directory is unknown (see torch-import)")
    return None


def _shell_note(c: Ctx, key: str) -> str:
    value = c.env.get(key)
    return f"; the login shell has {key}={value!r} (thrust-remote sets its own)" if value else \
        f"; the login shell does not set it (manual builds need `export {key}=...`)"


def check_libtorch_use_pytorch(c: Ctx) -> dict:
    cid = "libtorch-use-pytorch"
    if not c.is_cargo:
        return c.not_cargo(cid)
    value = c.build_env.get("LIBTORCH_USE_PYTORCH")
    if value != "1":
        return result(cid, FAIL, f"the job's env sets LIBTORCH_USE_PYTORCH={value!r}: torch-sys would look for a "
                      "standalone libtorch", f"remove LIBTORCH_USE_PYTORCH from jobs.{c.job_name}.env in thrust.yaml")
    if c.build_env.get("LIBTORCH"):
        return result(cid, WARN, "LIBTORCH_USE_PYTORCH=1 but LIBTORCH is also set in the job's env: two libtorch "
                      "sources", f"remove LIBTORCH from jobs.{c.job_name}.env")
    return result(cid, OK, "LIBTORCH_USE_PYTORCH=1 in the build env" + _shell_note(c, "LIBTORCH_USE_PYTORCH"))


def check_ld_library_path(c: Ctx) -> dict:
    cid = "ld-library-path"
    skip = _cargo_env_check(c, cid)
    if skip:
        return skip
    value = c.build_env.get("LD_LIBRARY_PATH", "")
    first = value.split(":")[0]
    if first.rstrip("/") != c.lib.rstrip("/") or not first.rstrip("/").endswith("/lib"):
        return result(cid, FAIL, f"LD_LIBRARY_PATH={value!r} does not start with torch's lib {c.lib}",
                      f"export LD_LIBRARY_PATH={shlex.quote(c.lib)}:$LD_LIBRARY_PATH")
    return result(cid, OK, f"LD_LIBRARY_PATH starts with {c.lib}" + _shell_note(c, "LD_LIBRARY_PATH"))


def check_ld_preload(c: Ctx) -> dict:
    cid = "ld-preload"
    skip = _cargo_env_check(c, cid)
    if skip:
        return skip
    if not c.cuda_libs:
        return result(cid, SKIP, f"{c.lib} has no libtorch_cuda.so (CPU-only torch): nothing to preload")
    value = c.build_env.get("LD_PRELOAD", "")
    entries = value.split(":")
    need = [f"{c.lib}/libtorch_cuda.so", f"{c.lib}/libtorch.so"]
    missing = [n for n in need if n not in entries]
    if missing:
        return result(cid, FAIL, f"LD_PRELOAD={value!r} lacks {', '.join(missing)}: CUDA symbols may be "
                      "missing at run time (undefined symbol _ZNK3c107SymBool...)",
                      f"export LD_PRELOAD={':'.join(need)}")
    return result(cid, OK, f"LD_PRELOAD={value}" + _shell_note(c, "LD_PRELOAD"))


def _rustflags_tokens(env: dict) -> list[str]:
    if env.get("CARGO_ENCODED_RUSTFLAGS"):
        return env["CARGO_ENCODED_RUSTFLAGS"].split("\x1f")
    return (env.get("RUSTFLAGS") or "").split()


def _links_after_no_as_needed(tokens: list[str]) -> tuple[bool, bool]:
    """(has --no-as-needed, names libtorch after it) in a RUSTFLAGS token list."""
    text = " ".join(tokens)
    pos = text.find("--no-as-needed")
    if pos < 0:
        return False, False
    return True, bool(re.search(r"link-args?=-ltorch\b", text[pos:]))


def check_rustflags(c: Ctx) -> dict:
    cid = "rustflags-no-as-needed"
    skip = _cargo_env_check(c, cid)
    if skip:
        return skip
    if c.env.get("CARGO_ENCODED_RUSTFLAGS") and "CARGO_ENCODED_RUSTFLAGS" not in c.build_env:
        return result(cid, FAIL, "the host's environment sets CARGO_ENCODED_RUSTFLAGS, which cargo uses instead "
                      "of RUSTFLAGS: the link flags would be ignored",
                      "unset CARGO_ENCODED_RUSTFLAGS   # in the host's ~/.bashrc / ~/.profile")
    tokens = _rustflags_tokens(c.build_env)
    has, links = _links_after_no_as_needed(tokens)
    br = c.crate.get("build_rs") or {}
    value = c.build_env.get("RUSTFLAGS") or c.build_env.get("CARGO_ENCODED_RUSTFLAGS", "").replace("\x1f", " ")
    if has and links:
        return result(cid, OK, f"RUSTFLAGS={value}" + _shell_note(c, "RUSTFLAGS"))
    if br.get("no_as_needed") and br.get("links_torch_after"):
        return result(cid, OK, f"RUSTFLAGS={value!r}; build.rs passes --no-as-needed and -ltorch itself")
    fix = "export RUSTFLAGS=" + shlex.quote(" ".join(buildenv.rustflags(c.lib, c.cuda_libs)))
    if has:
        return result(cid, FAIL, f"RUSTFLAGS={value!r} has --no-as-needed but no -ltorch after it: rustc puts "
                      "link-args after its -l libraries, so libtorch_cuda is still dropped", fix)
    return result(cid, FAIL, f"RUSTFLAGS={value!r} lacks -Wl,--no-as-needed: the linker drops libtorch_cuda", fix)


BUILD_RS_LINES = (
    'println!("cargo:rustc-link-arg=-Wl,--no-as-needed");',
    'println!("cargo:rustc-link-arg=-ltorch");',
)


def check_build_rs(c: Ctx) -> dict:
    cid = "build-rs-no-as-needed"
    if not c.is_cargo:
        return c.not_cargo(cid)
    if not c.crate.get("cargo_toml"):
        return result(cid, SKIP, f"no Cargo.toml in {c.crate_dir} (not synced yet?)")
    br = c.crate.get("build_rs") or {}
    path = c.crate.get("build_rs_path") or "build.rs"
    fix = c.doctor_cmd("--job", c.job_name, "--fix") + f"   # adds to fn main() in {path}: " + " ".join(BUILD_RS_LINES)
    if br.get("no_as_needed") and br.get("links_torch_after"):
        return result(cid, OK, f"{path} passes -Wl,--no-as-needed then -ltorch")
    why = ("thrust-remote's RUSTFLAGS cover its own builds, but a manual `cargo build` would drop libtorch_cuda")
    if br.get("no_as_needed"):
        return result(cid, WARN, f"{path} passes --no-as-needed but names no libtorch after it; {why}", fix)
    what = "has no --no-as-needed link arg" if br.get("exists") else "does not exist"
    return result(cid, WARN, f"{path} {what}; {why}", fix)


def check_stale(c: Ctx) -> dict:
    cid = "stale-build"
    if not c.is_cargo:
        return c.not_cargo(cid)
    target = c.crate.get("target_dir")
    if not c.crate.get("target_exists"):
        return result(cid, SKIP, f"{target} does not exist: not built yet")
    clean = c.cd_crate([buildenv.cargo_bin(c.facts), "clean"])
    if c.crate.get("job_env_target"):
        clean = f"CARGO_TARGET_DIR={shlex.quote(target)} {clean}"
    stored = c.crate.get("fingerprint")
    current = c.crate.get("current_fingerprint") or buildenv.fingerprint(c.facts, c.job)
    if not stored:
        return result(cid, WARN, f"{target} exists but has no {buildenv.FINGERPRINT_FILE}: built by hand or by "
                      "an older thrust-remote, with an env nobody recorded", clean)
    if stored.get("digest") != current.get("digest"):
        diff = buildenv.fingerprint_diff(stored, current) or ["fingerprint format changed"]
        return result(cid, FAIL, "the env changed since the last build: " + "; ".join(diff), clean)
    return result(cid, OK, f"{c.crate.get('fingerprint_path')} matches the current env "
                  f"(digest {current['digest'][:12]})")


def check_release(c: Ctx) -> dict:
    cid = "release-build"
    if not c.is_cargo:
        return c.not_cargo(cid)
    want = c.job.get("toolchain") or "stable"
    argv = " ".join(buildenv.cargo_build_argv(c.facts, c.job))
    if c.crate.get("binary_exists"):
        stored = ((c.crate.get("fingerprint") or {}).get("inputs") or {}).get("toolchain")
        if stored and stored != want:
            return result(cid, FAIL, f"{c.crate['binary']} was built with +{stored}; the job asks for +{want}",
                          c.cd_crate([buildenv.cargo_bin(c.facts), "clean"]) + f" && {argv}")
        how = f"with +{stored}" if stored else "toolchain not recorded"
        return result(cid, OK, f"{c.crate['binary']} exists (release, {how}); builds run `{argv}`")
    if c.crate.get("debug_binary_exists"):
        return result(cid, FAIL, f"only a debug build exists ({c.crate['debug_binary']}): built without --release "
                      "(10-50x slower)", f"cd {shlex.quote(c.crate_dir)} && {argv}")
    return result(cid, SKIP, f"not built yet; thrust-remote builds with `{argv}`")


def check_binary_links(c: Ctx) -> dict:
    cid = "binary-links-cuda"
    if not c.is_cargo:
        return c.not_cargo(cid)
    binary = c.crate.get("binary")
    if not c.crate.get("binary_exists"):
        return result(cid, SKIP, f"{binary or 'the example'} is not built yet")
    info = c.crate.get("elf") or {}
    if "error" in info:
        return result(cid, WARN, f"could not read {binary}: {info['error']}", None)
    needed = info.get("needed") or []
    rebuild = c.cd_crate([buildenv.cargo_bin(c.facts), "clean"]) + " && rebuild with thrust-remote train"
    detail = f"NEEDED: {', '.join(needed) or 'nothing'}"
    if info.get("runpath") or info.get("rpath"):
        detail += f"; RUNPATH {':'.join(info.get('runpath') or info.get('rpath'))}"
    if c.cuda_libs:
        if "libtorch_cuda.so" in needed:
            return result(cid, OK, detail)
        if "libtorch.so" in needed and "libtorch_cuda.so" in (c.probe.get("libtorch_needed") or []):
            return result(cid, OK, detail + " (libtorch_cuda.so comes through libtorch.so)")
        return result(cid, FAIL, detail + ": libtorch_cuda.so was dropped by --as-needed, the binary will train "
                      "on the CPU", rebuild)
    if "libtorch.so" in needed:
        return result(cid, OK, detail + " (CPU-only torch: libtorch.so kept)")
    if not any(n.startswith(("libtorch", "libc10")) for n in needed):
        return result(cid, WARN, detail + ": the binary does not link libtorch at all", None)
    return result(cid, WARN, detail + ": libtorch.so was dropped by --as-needed; with a CUDA wheel "
                  "libtorch_cuda.so is dropped the same way and training silently runs on the CPU", rebuild)


def check_cuda_flag(c: Ctx) -> dict:
    cid = "cuda-flag"
    if not c.is_cargo:
        if c.job:
            return result(cid, SKIP, f"python job {c.job_name!r}: the trainer picks the device itself")
        return c.not_cargo(cid)
    args = [str(a) for a in c.job.get("args") or []]
    has = "--cuda" in args
    if c.has_gpu and not has:
        return result(cid, FAIL, f"the host has a GPU but jobs.{c.job_name}.args {args} lack --cuda: "
                      "training runs on the CPU", f"add --cuda to jobs.{c.job_name}.args in thrust.yaml")
    if has and not c.has_gpu:
        return result(cid, WARN, "args pass --cuda but this host has no GPU", None)
    return result(cid, OK, f"args {args}" + (" pass --cuda" if has else " (CPU host: no --cuda)"))


def check_torch_libs(c: Ctx) -> dict:
    cid = "torch-libs"
    if not c.lib:
        return result(cid, SKIP, "torch does not import (see torch-import)")
    libs = c.probe.get("libs") or {}
    need = ["libtorch.so", "libtorch_cpu.so", "libc10.so"]
    if c.probe.get("cuda_version"):
        need += ["libtorch_cuda.so", "libc10_cuda.so"]
    missing = [n for n in need if not libs.get(n)]
    have = ", ".join(n for n, ok in libs.items() if ok)
    if missing:
        return result(cid, FAIL, f"{c.lib} lacks {', '.join(missing)} (has: {have or 'none'})",
                      c.pip_torch().replace(" install ", " install --force-reinstall ", 1))
    return result(cid, OK, f"{c.lib}: {have}")


def check_ssh_python(c: Ctx) -> dict:
    cid = "ssh-python"
    others = c.facts.get("other_pythons") or []
    home = c.facts.get("home")
    if c.torch_ok:
        return result(cid, OK, f"{c.python} (hosts.{c.host}.python) has torch {c.probe.get('version')}")
    chosen = choose_python(others, home)
    if chosen:
        with_torch = [display_path(o["path"], home) for o in others if o.get("torch")]
        return result(cid, FAIL, f"{c.python} (hosts.{c.host}.python) has no torch, but "
                      f"{', '.join(with_torch)} {'does' if len(with_torch) == 1 else 'do'}",
                      f"set `python: {chosen}` under hosts.{c.host} in thrust.yaml")
    looked = ", ".join(display_path(o["path"], home) for o in others)
    return result(cid, SKIP, f"no python on this host has torch ({c.python}" + (f", {looked}" if looked else "")
                  + "; looked in ~/venv, ~/.venv, ~/*/.venv, ~/*/venv and conda envs); see torch-import")


def check_disk(c: Ctx) -> dict:
    cid = "disk-space"
    d = c.facts.get("disk") or {}
    if "free_bytes" not in d:
        return result(cid, WARN, f"could not measure free space: {d.get('error')}", None)
    detail = f"{_gib(d['free_bytes'])} free of {_gib(d.get('total_bytes'))} at {d.get('path')}"
    if d["free_bytes"] < DISK_FAIL:
        return result(cid, FAIL, detail + " (a tch-rs build needs ~2 GiB, checkpoints more)",
                      f"du -sh {shlex.quote(str(d.get('path')))}/* | sort -h | tail   # then remove old runs/targets")
    if d["free_bytes"] < DISK_WARN:
        return result(cid, WARN, detail, f"du -sh {shlex.quote(str(d.get('path')))}/* | sort -h | tail")
    return result(cid, OK, detail)


def check_git(c: Ctx) -> dict:
    cid = "git"
    g = c.facts.get("git") or {}
    if not g.get("found"):
        return result(cid, FAIL, f"git not found (PATH={c.env.get('PATH', '')}): code sync needs it",
                      "sudo apt-get install -y git")
    err = g.get("error") or ""
    if "dubious ownership" in err:
        workdir = (c.facts.get("workdir") or {}).get("path") or "WORKDIR"
        return result(cid, FAIL, f"git refuses the workdir: {err.splitlines()[0]}",
                      f"git config --global --add safe.directory {shlex.quote(workdir)}")
    if not g.get("repo"):
        return result(cid, OK, f"{g.get('path')}; the workdir is not a git checkout yet (the first sync creates it)")
    if g.get("store"):
        return result(cid, OK, f"{g.get('path')}; the workdir holds the project's git objects, "
                               f"{g.get('trees', 0)} run tree(s) in .thrust/trees")
    return result(cid, OK, f"{g.get('path')}; workdir on {g.get('branch')}, {g.get('dirty_files')} changed file(s)")


RUNNERS = {
    "python": check_python,
    "torch-import": check_torch_import,
    "torch-version": check_torch_version,
    "cuda-available": check_cuda,
    "rust-toolchain": check_rust,
    "libtorch-use-pytorch": check_libtorch_use_pytorch,
    "ld-library-path": check_ld_library_path,
    "ld-preload": check_ld_preload,
    "rustflags-no-as-needed": check_rustflags,
    "stale-build": check_stale,
    "release-build": check_release,
    "cuda-flag": check_cuda_flag,
    "gpu-utilization": check_gpu_util,
    "nvidia-smi": check_nvidia_smi,
    "driver-cuda": check_driver,
    "binary-links-cuda": check_binary_links,
    "build-rs-no-as-needed": check_build_rs,
    "cxx-abi": check_abi,
    "torch-libs": check_torch_libs,
    "ssh-python": check_ssh_python,
    "cuda-visible-devices": check_visible_devices,
    "nccl": check_nccl,
    "disk-space": check_disk,
    "git": check_git,
}
assert tuple(RUNNERS) == CHECK_IDS


def evaluate(facts: dict, job: dict | None = None) -> list[dict]:
    """Every check, in CHECK_IDS order. A bug in one check becomes that check's `warn`, not a crash."""
    ctx = Ctx(facts, job if job is not None else facts.get("job"))
    out = []
    for cid in CHECK_IDS:
        try:
            out.append(RUNNERS[cid](ctx))
        except Exception as exc:  # keep the other checks: the report is what the user needs
            out.append(result(cid, WARN, f"check crashed: {type(exc).__name__}: {exc}", None))
    return out
