"""envcheck run for real on this machine as `python -m envcheck --json`: every check id, and the
broken hosts (no torch, a torch whose import hangs, a broken PATH, a GPU host's nvidia-smi) become
report rows with reasons — never a crash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envcheck.checks import CHECK_IDS

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "nvidia_smi"


def base_python() -> str:
    """The interpreter the venv was made from: a python3 without torch."""
    return getattr(sys, "_base_executable", None) or sys.executable


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real venv without torch (no pip either: only the standard library, like a fresh host)."""
    path = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def envcheck(python: str | Path, *args: str, env: dict | None = None, timeout: float = 120) -> tuple[dict, float]:
    started = time.monotonic()
    proc = subprocess.run([str(python), "-m", "envcheck", "--json", *args], capture_output=True, text=True,
                          cwd=REPO, env=env if env is not None else os.environ.copy(), timeout=timeout)
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), wall


def rows(doc: dict) -> dict[str, dict]:
    assert [c["id"] for c in doc["checks"]] == list(CHECK_IDS)
    for c in doc["checks"]:
        assert set(c) == {"id", "title", "status", "detail", "fix"}
        assert c["status"] in ("ok", "warn", "fail", "skip") and c["detail"]
        assert "check crashed" not in c["detail"], c
    return {c["id"]: c for c in doc["checks"]}


def test_report_has_every_check_and_the_torch_facts() -> None:
    doc, wall = envcheck(sys.executable, "--host", "here")
    assert set(doc) == {"host", "facts", "checks"} and doc["host"] == "here"
    r = rows(doc)
    import torch

    assert doc["facts"]["torch"] == torch.__version__
    assert doc["facts"]["torch_probe"]["cxx11_abi"] == bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    assert r["torch-import"]["status"] == "ok" and r["torch-libs"]["status"] == "ok"
    assert wall < 10


def test_python_without_torch_is_a_failing_row_with_the_fix(bare_venv: Path, tmp_path: Path) -> None:
    # an empty home and workdir: no other python with torch to point at instead
    doc, _ = envcheck(bare_venv, "--workdir", str(tmp_path), env={**os.environ, "HOME": str(tmp_path)})
    r = rows(doc)
    assert doc["facts"]["torch"] is None
    assert r["torch-import"]["status"] == "fail"
    assert "No module named 'torch'" in r["torch-import"]["detail"]
    # a venv takes pip: torch goes into it, from the wheel index for this host (cpu without a GPU)
    assert r["torch-import"]["fix"].startswith(f"{bare_venv} -m pip install torch --index-url "
                                               "https://download.pytorch.org/whl/")
    assert r["cuda-available"]["status"] == "skip"


def test_hanging_torch_import_times_out_into_a_row(tmp_path: Path, bare_venv: Path) -> None:
    """A torch whose import never returns (what a wedged CUDA init looks like from outside)."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import time\ntime.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    doc, wall = envcheck(bare_venv, "--torch-timeout", "2", env=env)
    r = rows(doc)
    assert wall < 8
    assert r["torch-import"]["status"] == "fail"
    assert "timed out after 2 s during 'import torch'" in r["torch-import"]["detail"]


def test_broken_path_gives_rows_with_reasons() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CARGO_HOME",)}
    env["PATH"] = "/nonexistent"
    doc, _ = envcheck(sys.executable, "--job-json", json.dumps({"name": "rs", "kind": "cargo", "example": "x"}),
                      env=env)
    r = rows(doc)
    assert r["nvidia-smi"]["status"] == "skip" and "not found" in r["nvidia-smi"]["detail"]
    assert r["git"]["status"] == "fail" and "PATH=/nonexistent" in r["git"]["detail"]
    rust = r["rust-toolchain"]
    if Path("~/.cargo/bin/cargo").expanduser().exists():
        # rustup's usual place is found even when a non-login shell's PATH lacks it, and said so
        assert "not on the SSH session's PATH" in rust["detail"]
    else:
        assert rust["status"] == "fail"


def test_gpu_host_facts_through_nvidia_smi_on_path(tmp_path: Path) -> None:
    """nvidia-smi as found on an L4 host (its captured output, on PATH), with this machine's CPU
    torch: envcheck sees the GPU and fails cuda-available with the CUDA wheel to install."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'case "$1" in -L) cat {DATA / "l4_one_gpu.list"};; "") cat {DATA / "l4_one_gpu.txt"};; '
        f'*) cat {DATA / "l4_one_gpu.csv"};; esac\n'
    )
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "1"}
    doc, _ = envcheck(sys.executable, "--gpus", "0", env=env)
    r = rows(doc)
    assert doc["facts"]["nvidia_smi"]["gpus"][0]["name"] == "NVIDIA L4"
    assert r["nvidia-smi"]["status"] == "ok" and "driver 550.54.15" in r["nvidia-smi"]["detail"]
    cvd = r["cuda-visible-devices"]
    assert cvd["status"] == "fail" and "index 1 does not exist" in cvd["detail"]
    import torch

    if torch.version.cuda is None:
        assert r["cuda-available"]["status"] == "fail" and "CPU-only build" in r["cuda-available"]["detail"]
        # the header's "CUDA Version: 12.4": the newest wheel index at or below it
        assert r["cuda-available"]["fix"].endswith("--index-url https://download.pytorch.org/whl/cu124")
    assert doc["facts"]["nvidia_smi"]["cuda_version"] == "12.4"


# ------------------------------------------------------------------------------ a kept torch probe


def _probe_of(doc: dict) -> tuple[dict, dict]:
    return doc["facts"]["torch_probe"], rows(doc)["torch-import"]


def test_a_passing_torch_probe_is_kept_and_reused_until_something_changes(tmp_path: Path) -> None:
    """`--cache-dir`: the second report reuses the first's `import torch` (and says so, with how to
    redo it); --fresh and a new package on sys.path each probe again. Each probe here is a real `import
    torch` in a child. A changed CUDA_VISIBLE_DEVICES and age: the test after it, on the kept record."""
    cache, site = tmp_path / "cache", tmp_path / "site"
    site.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    kept = ["--cache-dir", str(cache), "--host", "gpu1"]

    first, _ = _probe_of(envcheck(sys.executable, *kept, env=env)[0])
    assert "reused" not in first
    [record] = list(cache.glob("torch-probe-*.json"))
    assert record.stat().st_mode & 0o077 == 0  # the account's own, like the rest of its cache

    doc, wall = envcheck(sys.executable, *kept, env=env)
    probe, row = _probe_of(doc)
    assert probe["reused"]["age_s"] >= 0 and probe["version"] == first["version"]
    assert row["status"] == "ok" and "reused" in row["detail"]
    assert "thrust-remote doctor --host gpu1 --fresh" in row["detail"]
    print(f"\nreport with the kept probe: {wall:.2f} s (import torch was {first['import_s']} s)")

    def probes_again(*args: str, **extra: str) -> None:
        probe, row = _probe_of(envcheck(sys.executable, *kept, *args, env={**env, **extra})[0])
        assert "reused" not in probe and "reused" not in row["detail"]

    probes_again("--fresh")
    (site / "newpkg.py").write_text("")  # what any install does: its sys.path directory changes
    probes_again()
    assert "reused" in _probe_of(envcheck(sys.executable, *kept, env=env)[0])[0]  # nothing changed since


def test_a_kept_probe_is_not_reused_once_a_steering_variable_changes_or_it_is_old_or_damaged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a report does with a kept record (`ReusedProbe.load`, in this process: the real probe's
    keep-and-reuse is the test above), without an `import torch` for each case: a changed
    CUDA_VISIBLE_DEVICES, an hour's age and a record that is not JSON each mean probing again."""
    from envcheck import torchprobe

    path = tmp_path / "torch-probe-x.json"
    # a pass on a GPU host too (CUDA up, its matmul ok): on a CPU host a pass needs no GPU facts, on a
    # GPU host a pass without them is no pass (`torchprobe.passing`)
    data = {"stage": "done", "ok": True, "version": "2.13.0", "file": None, "cuda_available": True,
            "matmul": {"ok": True}}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def kept() -> None:
        before = torchprobe._without_torch(json.loads(json.dumps(torchprobe.depends_on(None, None))))
        torchprobe.keep(str(path), dict(data), None, before)

    kept()
    assert torchprobe.ReusedProbe.load(str(path), None) is not None  # as kept
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert torchprobe.ReusedProbe.load(str(path), None) is None
    kept()
    assert torchprobe.ReusedProbe.load(str(path), None) is not None  # kept again under the new value
    record = json.loads(path.read_text())
    record["at"] -= 3600  # an hour old
    path.write_text(json.dumps(record))
    assert torchprobe.ReusedProbe.load(str(path), None) is None
    path.write_bytes(b"\xff{not json")
    assert torchprobe.ReusedProbe.load(str(path), None) is None


def test_two_environments_of_one_python_each_reuse_their_own_probe_in_turn(tmp_path: Path) -> None:
    """An account's ssh sessions and a run on host `local` (another group list, a PYTHON* variable set)
    are two environments of one interpreter, often in turn: each reuses its own kept probe rather than
    replacing the other's record with its own."""
    cache = tmp_path / "cache"
    kept = ["--cache-dir", str(cache)]
    plain = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    other = {**plain, "PYTHONUNBUFFERED": "1"}
    for env in (plain, other):
        assert "reused" not in _probe_of(envcheck(sys.executable, *kept, env=env)[0])[0]
    for env in (plain, other, plain):
        assert "reused" in _probe_of(envcheck(sys.executable, *kept, env=env)[0])[0]
    assert len(list(cache.glob("torch-probe-*.json"))) == 2


def test_a_failing_torch_probe_is_never_kept(bare_venv: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for _ in range(2):
        doc, _ = envcheck(bare_venv, "--cache-dir", str(cache), "--workdir", str(tmp_path),
                          env={**os.environ, "HOME": str(tmp_path)})
        probe, row = _probe_of(doc)
        assert row["status"] == "fail" and "reused" not in probe
    assert not list(cache.glob("torch-probe-*"))


def test_a_failing_probe_forgets_the_pass_before_it(tmp_path: Path) -> None:
    """After `--fresh` fails (here: a 10 ms deadline, as a hung CUDA init would), the next report does
    not bring back the earlier pass. (A damaged record: the unit test above.)"""
    cache = tmp_path / "cache"
    kept = ["--cache-dir", str(cache)]
    envcheck(sys.executable, *kept)
    [record] = list(cache.glob("torch-probe-*.json"))
    probe, row = _probe_of(envcheck(sys.executable, *kept, "--fresh", "--torch-timeout", "0.01")[0])
    assert probe.get("timed_out") and row["status"] == "fail"
    assert not record.exists()
    probe, row = _probe_of(envcheck(sys.executable, *kept)[0])
    assert "reused" not in probe and row["status"] == "ok"


def test_a_probe_is_not_kept_when_what_it_depends_on_moved_while_it_ran(tmp_path: Path) -> None:
    from envcheck import torchprobe

    path = tmp_path / "torch-probe-x.json"
    data = {"stage": "done", "ok": True, "version": "2.13.0", "file": None}
    before = torchprobe._without_torch(json.loads(json.dumps(torchprobe.depends_on(None, None))))
    torchprobe.keep(str(path), data, None, {**before, "env": {"PYTHONPATH": "elsewhere"}})
    assert not path.exists()
    torchprobe.keep(str(path), data, None, before)
    assert json.loads(path.read_text())["result"]["version"] == "2.13.0"


def test_a_torch_planted_in_the_temporary_directory_is_not_imported(tmp_path: Path) -> None:
    """The probe runs in the shared temporary directory; what anyone left there is not torch."""
    (tmp_path / "torch.py").write_text("raise SystemExit('planted torch ran')\n")
    doc, _ = envcheck(sys.executable, env={**os.environ, "TMPDIR": str(tmp_path)})
    probe, row = _probe_of(doc)
    import torch

    assert row["status"] == "ok" and probe["version"] == torch.__version__


def test_each_stage_of_the_torch_child_turns_a_failure_into_a_fact_on_a_cpu_host() -> None:
    """The probe's child program (envcheck/torch_child.py; it runs as `python -c`, its stages are called
    here with this process's real torch): on a host without CUDA the CUDA stages record why they
    failed, and nothing raises, so a broken GPU stack is a row of the report and never a crash."""
    import torch

    from envcheck import torch_child

    if torch.cuda.is_available():  # its GPU stages are test_trainer_gpu's and the GPU suite's there
        pytest.skip("a CPU host's test: this one has CUDA")
    out: dict = {}
    torch_child._torch_facts(out, torch, 0.0)
    assert out["version"] == str(torch.__version__) and Path(out["lib_dir"]).is_dir()
    assert out["cxx11_abi"] in (True, False)
    torch_child._cuda(out, torch)
    assert (out["cuda_available"], out["device_count"], out["devices"]) == (False, 0, [])
    torch_child._matmul(out, torch)
    torch_child._nccl(out, torch)
    assert out["matmul"]["ok"] is False and out["matmul"]["error"]
    assert out["nccl_available"] is False
    torch_child._utilization(out, torch, "/nonexistent/nvidia-smi")
    assert set(out["gpu_probe"]) == {"error"}


def test_the_git_row_says_what_the_workdir_is_a_store_of_run_trees_or_a_checkout(tmp_path: Path) -> None:
    """A host's workdir holds the project's objects and runs run in trees of their own: its (empty)
    branch and untracked `.thrust/` are not shown as a checkout's state; a checkout's still are."""
    from helpers import commit, git, git_init

    from envcheck import checks
    from envcheck.probe import probe_git

    def row(workdir: Path) -> str:
        facts = {"git": probe_git(str(workdir)), "workdir": {"path": str(workdir), "exists": workdir.exists()}}
        return next(r for r in checks.evaluate(facts) if r["id"] == "git")["detail"]

    assert "not a git checkout yet (the first sync creates it)" in row(tmp_path / "none")
    store = git_init(tmp_path / "store")
    for run_id in ("a-1", "a-2"):
        (store / ".thrust" / "trees" / run_id).mkdir(parents=True)
    assert row(store).endswith("the workdir holds the project's git objects, 2 run tree(s) in .thrust/trees")
    project = git_init(tmp_path / "project")  # host `local`: the project itself
    (project / "a.txt").write_text("1\n")
    commit(project, "one")
    (project / "a.txt").write_text("2\n")
    assert row(project).endswith(f"workdir on {git(project, 'branch', '--show-current')}, 1 changed file(s)")
