"""The job's venv on the host (agent `venv ensure`, run/venv.py setup_python) and the built-in trainer
shipped as a payload, so `kind: trainer` jobs run from any project.

The "host" is this machine reached over a real sshd (tests/conftest.py). pip really installs: a tiny
wheel built here by hand (no network, no build backend); the trainer's own requirements (numpy, onnx,
onnxruntime, onnxscript) are already satisfied through the host python's site-packages, which the
venv sees.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import REPO, TINY_TRAIN, commit, new_project

from thrust_remote.core.config import JobConfig, load_config
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.host.session import HostSession
from thrust_remote.run import lifecycle, stages, vocab


def make_wheel(where: Path, name: str, version: str) -> Path:
    """A pure-python wheel of package `name` whose `VERSION` is `version`, written by hand."""
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                              b"Tag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}\n"
        for path, data in files.items()
    ) + f"{name}-{version}.dist-info/RECORD,,\n"
    files[f"{name}-{version}.dist-info/RECORD"] = record.encode()
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


class Steps(vocab.NullReporter):
    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, message: str) -> None:
        self.steps.append(message)


def _prepare(project: Path, sshd, job: JobConfig) -> tuple[stages.Prepared, list[str]]:
    config = load_config(project / "thrust.yaml")
    host = config.host()
    runner = sshd.runner()
    reporter = Steps()
    try:
        prepared = stages.prepare(config, job, HostSession.open(runner, host, config), reporter)
    finally:
        runner.close()
    return prepared, reporter.steps


def _venv_python_import(python: str, module: str) -> str:
    out = subprocess.run([python, "-c", f"import {module}; print({module}.VERSION)"], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


# ------------------------------------------------------------------------------------ the agent alone

def _agent(*args: str) -> subprocess.CompletedProcess:
    # as on a host: -S, like every stdlib-only subcommand (session._flags)
    return subprocess.run([sys.executable, "-S", "-m", "thrust_remote.agent", "venv", "ensure", *args],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)


def test_agent_venv_ensure_once_concurrently_and_a_cut_build_is_redone(tmp_path):
    wheel = make_wheel(tmp_path, "thrusttiny", "0.1")
    root = tmp_path / "venvs"
    args = ["--dir", str(root), "--key", "k1", "--constraint", "torch==0", "--", str(wheel)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-S", "-m", "thrust_remote.agent", "venv", "ensure", *args]
    both = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    answers = [json.loads(p.communicate(timeout=300)[0]) for p in both]
    assert sorted(a["created"] for a in answers) == [False, True]  # the flock: built once
    assert all(a["python"] == str(root / "k1" / "bin" / "python") for a in answers)
    assert _venv_python_import(answers[0]["python"], "thrusttiny") == "0.1"
    # the venv sees the host python's torch (a venv of a venv would not, without the .pth)
    subprocess.run([answers[0]["python"], "-c", "import torch, numpy"], check=True)

    again = _agent(*args)
    assert json.loads(again.stdout)["skipped"] is True

    (root / "k1" / ".thrust-venv.json").unlink()  # as if the install had been cut before the stamp
    redone = json.loads(_agent(*args).stdout)
    assert redone["created"] is True and redone["skipped"] is False


def test_agent_venv_ensure_failing_pip_is_69_with_its_last_lines(tmp_path):
    result = _agent("--dir", str(tmp_path / "venvs"), "--key", "bad", "--", "--no-index")
    assert result.returncode == ExitCode.UNAVAILABLE
    doc = json.loads(result.stdout)
    assert "pip install failed" in doc["error"]
    assert "--no-index" in doc["tail"]  # pip's own words: a spec is never taken as an option
    assert not (tmp_path / "venvs" / "bad" / ".thrust-venv.json").exists()


# ------------------------------------------------------------------------------------ over SSH

@pytest.mark.slow
def test_venv_made_then_skipped_then_new_when_requirements_change(tmp_path, sshd, remote_dir):
    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust")
    job = JobConfig(name="cartpole", args={"env": "cartpole"}, requirements=(str(make_wheel(tmp_path, "thrusttiny",
                                                                                             "0.1")),))
    first, steps = _prepare(project, sshd, job)
    venvs = remote_dir / "thrust" / ".thrust" / "venvs"
    assert first.python.startswith(f"{venvs}/") and first.python.endswith("/bin/python")
    assert first.setup_skipped is False
    assert any("setting up the host's python" in s for s in steps)
    assert any("installing numpy, onnx, onnxruntime, onnxscript, " in s for s in steps)
    assert _venv_python_import(first.python, "thrusttiny") == "0.1"
    assert first.trainer and Path(first.trainer).is_file()  # the trainer payload is on the host

    second, steps = _prepare(project, sshd, job)
    assert second.setup_skipped is True
    assert second.python == first.python
    assert [s for s in steps if "venv" in s] == [f"setup skipped: the job's venv is up to date "
                                                 f"({Path(first.python).parent.parent})"]
    assert not any("installing" in s or "uploading" in s for s in steps)

    changed = replace(job, requirements=(str(make_wheel(tmp_path, "thrusttiny", "0.2")),))
    third, steps = _prepare(project, sshd, changed)
    assert third.setup_skipped is False and third.python != first.python
    assert _venv_python_import(third.python, "thrusttiny") == "0.2"
    assert sorted(p.name for p in venvs.iterdir() if p.is_dir()) == sorted(
        Path(p).parent.parent.name for p in (first.python, third.python))


@pytest.mark.slow
def test_failing_requirement_is_69_with_pips_lines_and_nothing_launched(tmp_path, sshd, remote_dir):
    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust",
                          files={"requirements.txt": "--no-index\nthrust-no-such-package-zz==1.0\n"})
    job = JobConfig(name="cartpole", args={"env": "cartpole"}, requirements_file="requirements.txt")
    config = load_config(project / "thrust.yaml")
    runner = sshd.runner()
    request = vocab.TrainRequest(job=job, host=config.host(), sets=["total-steps=2048"])
    try:
        with pytest.raises(ThrustError) as caught:
            lifecycle.train(config, request, [HostSession.open(runner, config.host(), config)])
    finally:
        runner.close()
    assert caught.value.exit_code == ExitCode.UNAVAILABLE
    assert "thrust-no-such-package-zz" in str(caught.value)  # pip's own last lines
    assert "No matching distribution" in str(caught.value) or "Could not find" in str(caught.value)
    assert "nothing was launched" in (caught.value.hint or "")
    runs = remote_dir / "thrust" / ".thrust" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def externally_managed_python(root: Path) -> Path:
    """A python install whose stdlib carries PEP 668's EXTERNALLY-MANAGED marker (as Debian 12's and
    Ubuntu 24.04's do) and whose site-packages has torch & co: the interpreter under this test's venv,
    copied, with its stdlib linked and this venv's packages named by a .pth (as a distro's would be)."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    lib = root / "lib" / version
    (lib / "site-packages").mkdir(parents=True)
    (root / "bin").mkdir()
    exe = root / "bin" / version
    exe.write_bytes(Path(os.path.realpath(sys._base_executable)).read_bytes())  # type: ignore[attr-defined]
    exe.chmod(0o755)
    for entry in (base / "lib" / version).iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    (lib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=this python is managed by the test\n")
    site = next(p for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    (lib / "site-packages" / "distro-packages.pth").write_text(site + "\n")
    return exe


@pytest.mark.e2e  # the built-in trainer, for real
@pytest.mark.slow
def test_externally_managed_python_gets_its_venv_and_trains(tmp_path, sshd, remote_dir, cli):
    python = externally_managed_python(tmp_path / "system-python")
    wheel = make_wheel(tmp_path, "thrusttiny", "0.1")
    refused = subprocess.run([str(python), "-m", "pip", "install", "--no-index", str(wheel)], capture_output=True,
                             text=True, check=False)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr  # as on Debian 12

    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust", python=python)
    result = cli("train", "cartpole", *TINY_TRAIN, cwd=project)
    assert result.returncode == 0, result.stderr
    assert "setting up the host's python: a venv at" in result.stderr
    assert (project / "web" / "public" / "cartpole.onnx").stat().st_size > 0
    run_dir = next((remote_dir / "thrust" / ".thrust" / "runs").iterdir())
    argv = json.loads((run_dir / "run.json").read_text())["argv"]
    venv = Path(argv[0]).parent.parent
    assert venv.parent == remote_dir / "thrust" / ".thrust" / "venvs"
    assert f"home = {python.parent}\n" in (venv / "pyvenv.cfg").read_text()  # made from that python

    # and a requirement of the job's own installs into that venv, never into the managed python
    job = JobConfig(name="cartpole", args={"env": "cartpole"}, requirements=(str(wheel),))
    prepared, _steps = _prepare(project, sshd, job)
    assert _venv_python_import(prepared.python, "thrusttiny") == "0.1"
    assert subprocess.run([str(python), "-c", "import thrusttiny"], capture_output=True, check=False).returncode


@pytest.mark.e2e  # the built-in trainer, for real
@pytest.mark.slow
def test_builtin_trainer_from_a_fresh_project_trains_cartpole_then_skips_setup(tmp_path, sshd, remote_dir, cli):
    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust")
    assert sorted(p.name for p in project.iterdir()) == [".git", "thrust.yaml"]
    first = cli("train", "cartpole", *TINY_TRAIN, cwd=project)
    assert first.returncode == 0, first.stderr
    assert (project / "web" / "public" / "cartpole.onnx").stat().st_size > 0
    assert "setting up the host's python" in first.stderr
    assert not (remote_dir / "thrust" / "trainer").exists()  # it ran from the payload, not the checkout
    run_dirs = sorted((remote_dir / "thrust" / ".thrust" / "runs").iterdir())
    argv = json.loads((run_dirs[0] / "run.json").read_text())["argv"]
    assert "/.thrust/venvs/" in argv[0] and Path(argv[2]).name.startswith("trainer-")

    second = cli("train", "cartpole", *TINY_TRAIN, cwd=project)
    assert second.returncode == 0, second.stderr
    assert "setup skipped: the job's venv is up to date" in second.stderr
    assert "setting up the host's python" not in second.stderr


def test_the_torch_pin_matches_the_hosts_torch_whatever_its_local_label():
    """A PyPI CUDA wheel reports `2.15.0+cu132` in torch.__version__ but `2.15.0` in its metadata: the
    pin must be satisfied by both (it was `==2.15.0+cu132`, and pip refused a `torch` requirement)."""
    from packaging.specifiers import SpecifierSet

    from thrust_remote.run.venv import torch_release

    pin = SpecifierSet(f"=={torch_release('2.15.0+cu132')}")
    assert pin.contains("2.15.0") and pin.contains("2.15.0+cu132") and pin.contains("2.15.0+cpu")
    assert not pin.contains("2.16.0")
    assert torch_release(None) == ""


# ------------------------------------------------------------------------------------ torch pins, indexes

def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): a connect to it is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agent_venv_ensure_unreachable_index_fails_fast_naming_its_url(tmp_path):
    """pip's own defaults (5 retries with backoff) take ~8 s per package on a refused index before its
    resolver says "No matching distribution"; bounded, one retry, then the index is named."""
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"--index-url {index}   # a mirror that is down\nthrust-unreachable-zz==1.0\n")
    started = time.monotonic()
    result = _agent("--dir", str(tmp_path / "venvs"), "--key", "k", "--requirements", str(requirements))
    wall = time.monotonic() - started
    assert result.returncode == ExitCode.UNAVAILABLE
    doc = json.loads(result.stdout)
    assert doc["index"] == index
    assert doc["error"] == f"pip could not reach the package index {index} (Connection refused)"
    assert doc["tail"].count("Retrying (") == 1  # --retries 1: pip's default would show five
    assert wall < 20


def _pin_project(tmp_path: Path, sshd, remote_dir: Path) -> Path:
    jobs = ("jobs:\n  pinned:\n    script: train.py\n    requirements: requirements.txt\n")
    return new_project(tmp_path / "project", sshd, remote_dir / "thrust", jobs=jobs, files={
        "train.py": "print('never runs')\n",
        # pip's syntax: an index option, a comment, an include relative to this file, a marker
        "requirements.txt": "--extra-index-url https://example.invalid/simple\n# the model's needs\n"
                            "-r reqs/torch.txt\ntorchvision==0.20.1 ; python_version < '3'\n",
        "reqs/torch.txt": "numpy>=1.24\ntorch==2.4.0  # the version the paper used\n",
    })


@pytest.mark.slow
def test_a_torch_pin_is_78_before_any_venv_is_built_and_an_unreachable_index_is_named(tmp_path, sshd, remote_dir, cli):
    import torch

    project = _pin_project(tmp_path, sshd, remote_dir)
    result = cli("train", "pinned", cwd=project)
    assert result.returncode == ExitCode.CONFIG, result.stderr
    err = " ".join(result.stderr.split())
    assert "reqs/torch.txt:2 (from requirements.txt:3): requirement torch==2.4.0 pins another torch than " \
           f"sandbox has ({torch.__version__})" in err
    assert "drop that pin" in err and "`python:` under hosts.sandbox" in err and "that has torch==2.4.0" in err
    assert "Traceback" not in result.stderr and "No matching distribution" not in result.stderr
    assert not (remote_dir / "thrust" / ".thrust" / "venvs").exists()  # refused before any venv was made

    # the pin dropped, the index down: pip fails in seconds, and the error names the index
    index = f"http://127.0.0.1:{_closed_port()}/simple"
    (project / "reqs" / "torch.txt").write_text("numpy>=1.24\n")
    (project / "requirements.txt").write_text(f"-i {index}\nthrust-unreachable-zz==1.0\n")
    commit(project, "a mirror that is down")
    started = time.monotonic()
    result = cli("train", "pinned", cwd=project)
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    err = " ".join(result.stderr.split())
    assert f"pip could not reach the package index {index} (Connection refused)" in err
    assert "nothing was launched; check that URL (the requirements' -i / --extra-index-url" in err
    assert time.monotonic() - started < 60


HOST = {"python": "3.11.2", "machine": "x86_64", "platform": "Linux-6.1.0-x86_64-with-glibc2.36"}


def _why(spec: str, **versions: str | None) -> str | None:
    from thrust_remote.run import pins

    pin = pins.inline_pins([spec], "thrust.yaml:3: jobs.a.requirements")[0]
    return pins.conflict(pin, versions)


def test_torch_pins_follow_pep_440_local_labels_and_the_vision_audio_pairs():
    # a pin without a local label ignores the host's; one with a label must match it exactly
    assert _why("torch==2.13.0", torch="2.13.0+cu128") is None
    assert _why("torch>=2.4,<3", torch="2.13.0+cu128") is None
    assert _why("torch~=2.13.0", torch="2.14.0.dev20260101+cu128") is not None
    assert _why("torch>=2.4", torch="2.14.0.dev20260101+cu128") is None  # a nightly host meets a range
    assert _why("torch==2.13.0+cu126", torch="2.13.0+cu128") == "pins another torch than the host has (2.13.0+cu128)"
    assert _why("torch", torch="2.13.0") is None  # no version asked: nothing to hold against
    # torchvision / torchaudio: the host's own when it has them, else the torch an exact pin is built for
    assert _why("torchvision==0.27.0", torch="2.13.0", torchvision="0.28.0") is not None
    assert _why("torchvision==0.28.0", torch="2.13.0") is None  # 0.28 goes with torch 2.13
    assert _why("torchvision==0.20.1", torch="2.13.0") == "is built for torch 2.5, and the host's torch is 2.13.0"
    assert _why("torchaudio==2.4.1", torch="2.13.0") == "is built for torch 2.4, and the host's torch is 2.13.0"
    assert _why("torchvision>=0.20", torch="2.13.0") is None  # a range: pip's to resolve


def test_requirements_are_read_as_pip_reads_them(tmp_path):
    from thrust_remote.core.errors import ConfigError
    from thrust_remote.run import pins

    (tmp_path / "sub").mkdir()
    (tmp_path / "requirements.txt").write_text(
        "-i https://mirror.example/simple\n--extra-index-url=https://other.example/simple\n"
        "torchx==0.7  # not torch\n#torch==1.0\nurl-thing @ https://x.example/a.whl\n./local.whl\n"
        "-rsub/more.txt\n--constraint sub/c.txt\n")
    (tmp_path / "sub" / "more.txt").write_text("torch==2.4.0 \\\n    --hash=sha256:00\n-r more.txt\n")
    (tmp_path / "sub" / "c.txt").write_text("torchaudio==2.4.1; sys_platform == 'darwin'\ntorch<2.5\n")
    found = pins.read_file(tmp_path, "requirements.txt")
    assert [(p.where, p.display, p.constraint) for p in found] == [
        ("sub/more.txt:1 (from requirements.txt:7)", "torch==2.4.0", False),
        ("sub/c.txt:1 (from requirements.txt:8)", "torchaudio==2.4.1", True),
        ("sub/c.txt:2 (from requirements.txt:8)", "torch<2.5", True)]
    # markers are the host's: a darwin-only pin does not apply on a Linux host
    markers = pins.host_markers(HOST)
    assert [pins.applies(p, markers) for p in found] == [True, False, True]
    with pytest.raises(ConfigError, match=r"sub/more.txt:1 \(from requirements.txt:7\): requirement torch==2.4.0 "
                                          r"pins another torch than gpu has \(2.13.0\+cu128\)"):
        pins.check(found, {"torch": "2.13.0+cu128"}, HOST, "gpu", "thrust.yaml")
    (tmp_path / "requirements.txt").write_text("numpy\n-r gone.txt\n")
    with pytest.raises(ConfigError, match=r"requirements.txt:2: -r gone.txt: gone.txt does not exist"):
        pins.read_file(tmp_path, "requirements.txt")


@pytest.mark.slow
def test_a_requirement_relative_to_the_project_is_the_checkouts_not_the_hosts_home(tmp_path, sshd, remote_dir, cli):
    """A requirements file's `./wheels/x.whl` (or `-e .`) is the project's: pip runs in the checkout."""
    jobs = "jobs:\n  own:\n    script: train.py\n    requirements: requirements.txt\n"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = make_wheel(wheels, "tinyrel", "0.3")
    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust", jobs=jobs, files={
        "train.py": "import tinyrel\nprint('tinyrel', tinyrel.VERSION)\n",
        "requirements.txt": f"./wheels/{wheel.name}\n",
    })
    (project / "wheels").mkdir()
    (project / "wheels" / wheel.name).write_bytes(wheel.read_bytes())
    commit(project, "a wheel of our own")
    result = cli("train", "own", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "tinyrel 0.3" in result.stdout + result.stderr
    # the hint of a failing setup names the job's key and the file, not a key thrust.yaml does not have
    (project / "requirements.txt").write_text("./wheels/not-there-0.1-py3-none-any.whl\n")
    commit(project, "a wheel that is gone")
    failed = cli("train", "own", cwd=project)
    assert failed.returncode == ExitCode.UNAVAILABLE, failed.stderr
    assert "jobs.own.requirements (requirements.txt)" in failed.stderr and "requirements_file" not in failed.stderr
