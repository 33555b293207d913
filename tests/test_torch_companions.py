"""torch's companions (torchvision, torchaudio, a wheel whose native code links libtorch) in the job's
venv are the builds for the host's torch (issue 56 item 1; agent/venv.py fit_companions).

For real: this machine's torch is 2.13.0+cpu and the torchvision pip finds (PyPI's, or the local copy
of it) is 0.28.0 built for CUDA, whose import beside a CPU torch fails ('operator torchvision::nms does
not exist'). That build is replaced by the `+cpu` one from the variant's index, or the run is refused
before launch, naming the package, the two builds and the fix.
"""

from __future__ import annotations

import base64
import hashlib
import socket
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest
from helpers import commit, new_project

from thrust_remote.core.config import load_config
from thrust_remote.core.config.hosts import TORCH_INDEX, torch_index
from thrust_remote.core.errors import ConfigError, ExitCode

MARKER = "vision-job-ran"
TRAIN = f"""\
import pathlib, torch, torchvision
keep = torchvision.ops.nms(torch.tensor([[0., 0., 1., 1.]]), torch.tensor([1.]), 0.5)
print("torchvision", torchvision.__version__, "kept", keep.tolist())
pathlib.Path({MARKER!r}).write_text(torchvision.__version__)
"""


def _project(tmp_path: Path, sshd, remote_dir: Path, index: str | None, python: Path | None = None) -> Path:
    jobs = "jobs:\n  vision:\n    script: train.py\n    requirements: [torchvision]\n"
    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust", jobs=jobs, files={"train.py": TRAIN},
                          python=python)
    if index is not None:
        config = project / "thrust.yaml"
        config.write_text(config.read_text().replace("    connect_timeout: 5\n",
                                                     f"    connect_timeout: 5\n    torch_index: {index}\n"))
        commit(project, "a mirror of PyTorch's index")
    return project


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ran(remote_dir: Path) -> list[Path]:
    return list(remote_dir.rglob(MARKER))


def _venvs(remote_dir: Path) -> list[Path]:
    """The job venvs made on the host (a refusal before pip makes none: only its lock file)."""
    return [p for p in (remote_dir / "thrust" / ".thrust" / "venvs").glob("*") if not p.name.endswith(".lock")]


@pytest.mark.slow
def test_a_cpu_torch_whose_variants_index_is_down_is_refused_before_pip_naming_both_builds(
        tmp_path, sshd, remote_dir, cli):
    import torch

    index = f"http://127.0.0.1:{_closed_port()}/whl/{{variant}}"  # a mirror that is down
    project = _project(tmp_path, sshd, remote_dir, index)
    started = time.monotonic()
    result = cli("train", "vision", cwd=project)
    took = time.monotonic() - started
    err = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    url = index.replace("{variant}", "cpu")
    assert f"torchvision from PyPI does not fit sandbox's torch {torch.__version__}: PyPI's Linux builds of it " \
           "are CUDA ones, whose native code needs libtorch_cuda.so, which a +cpu torch lacks" in err
    assert f"torchvision built for torch {torch.__version__} comes from {url}, which sandbox cannot reach " \
           "(connection refused)" in err
    assert f"let sandbox reach {url}, or set `torch_index:` under hosts.sandbox to a mirror of it" in err
    assert "drop torchvision from jobs.vision.requirements" in err and "nothing was launched" in err
    assert "Traceback" not in result.stderr and not _ran(remote_dir)
    assert not _venvs(remote_dir), "pip ran: the refusal came after the venv's install"
    # the sync, the preflight and the 5 s connect: never the install's 35-45 s, even on 2 busy cores
    assert took < 30, took


@pytest.mark.slow
def test_pytorchs_own_index_unreachable_here_is_refused_in_seconds_without_an_install(
        tmp_path, sshd, remote_dir, cli):
    """The default torch_index (download.pytorch.org, which this machine cannot reach): what a new user
    meets first. The refusal came 45 s into the run, after pip had installed the venv, on every retry."""
    url = TORCH_INDEX.replace("{variant}", "cpu")
    if _reachable(url + "/torchvision/"):
        pytest.skip(f"{url} can be reached from this machine: its build is tested below")
    project = _project(tmp_path, sshd, remote_dir, None)
    for _ in range(2):  # a retry is as quick: nothing was made the first time
        started = time.monotonic()
        result = cli("train", "vision", cwd=project)
        took = time.monotonic() - started
        err = " ".join(result.stderr.split())
        assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
        assert f"comes from {url}, which sandbox cannot reach" in err and "torchvision from PyPI" in err
        assert not _venvs(remote_dir) and not _ran(remote_dir) and "Traceback" not in result.stderr
        assert took < 30, took


@pytest.mark.slow
def test_an_index_without_the_variants_build_is_78_before_pip(tmp_path, sshd, remote_dir, cli):
    empty = tmp_path / "index"
    (empty / "cpu").mkdir(parents=True)  # reachable, and serves nothing
    project = _project(tmp_path, sshd, remote_dir, f"file://{empty}/{{variant}}")
    result = cli("train", "vision", cwd=project)
    err = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert f"file://{empty}/cpu lists no torchvision built for torch " in err
    assert f"({empty}/cpu/torchvision/index.html: No such file or directory)" in err
    assert "set `torch_index:` under hosts.sandbox to an index that has it" in err
    assert "conflicting dependencies" not in err
    assert "Traceback" not in result.stderr and not _ran(remote_dir) and not _venvs(remote_dir)


@pytest.mark.slow
def test_an_index_with_another_release_of_the_variant_is_78_after_pip_saying_what_it_lists(
        tmp_path, sshd, remote_dir, cli):
    """The index lists +cpu builds (so the check before pip lets it through), not the release pip chose:
    the setup's own replacement fails, and says so plainly, never pip's 'conflicting dependencies'."""
    mirror = tmp_path / "mirror"
    _cpu_torchvision(mirror, "0.27.0+cpu")
    project = _project(tmp_path, sshd, remote_dir, f"file://{mirror}/{{variant}}")
    result = cli("train", "vision", cwd=project)
    err = " ".join(result.stderr.split())
    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert f"file://{mirror}/cpu lists no torchvision==0.28.0+cpu (it lists 0.27.0+cpu)" in err, err
    assert "conflicting dependencies" not in err
    assert "Traceback" not in result.stderr and not _ran(remote_dir)


def _cpu_torchvision(index: Path, version: str = "0.28.0+cpu") -> None:
    """A stand-in for PyTorch's `torchvision 0.28.0+cpu` wheel (pure python; its nms runs on the CPU
    torch), in a local index laid out as PyTorch's: INDEX/cpu/torchvision/<wheel>."""
    name = "torchvision"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"import torch\n__version__ = {version!r}\nfrom . import ops\n".encode(),
        f"{name}/ops.py": b"import torch\ndef nms(boxes, scores, iou):\n    return torch.zeros(1, dtype=torch.long)\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                            "Requires-Dist: torch==2.13.0\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    where = index / "cpu" / name
    where.mkdir(parents=True)
    wheel = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(where / wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    (where / "index.html").write_text(f'<html><body><a href="{wheel}">{wheel}</a></body></html>\n')


@pytest.mark.slow
def test_the_cuda_build_is_replaced_by_the_variants_from_the_hosts_mirror_and_the_job_runs(
        tmp_path, sshd, remote_dir, cli):
    import torch

    mirror = tmp_path / "mirror"
    _cpu_torchvision(mirror)
    project = _project(tmp_path, sshd, remote_dir, f"file://{mirror}/{{variant}}")
    result = cli("train", "vision", cwd=project)
    assert result.returncode == 0, result.stderr
    err = " ".join(result.stderr.split())
    assert f"torchvision 0.28.0 -> torchvision==0.28.0+cpu from file://{mirror}/cpu: the build for sandbox's " \
           f"torch {torch.__version__}" in err
    assert [p.read_text() for p in _ran(remote_dir)] == ["0.28.0+cpu"]
    venv = next((remote_dir / "thrust" / ".thrust" / "venvs").glob("*/lib/python*/site-packages"))
    assert not list(venv.glob("torch-*.dist-info"))  # the host's torch, never one pulled into the venv


def _reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


@pytest.mark.slow
def test_pytorchs_own_index_serves_the_cpu_torchvision_and_the_job_runs_with_it(tmp_path, sshd, remote_dir, cli):
    url = TORCH_INDEX.replace("{variant}", "cpu")
    if not _reachable(url + "/torchvision/"):
        pytest.skip(f"{url} cannot be reached from this machine (only PyPI can): the refusal is tested above")
    project = _project(tmp_path, sshd, remote_dir, None)
    result = cli("train", "vision", cwd=project)
    assert result.returncode == 0, result.stderr
    assert [p.read_text() for p in _ran(remote_dir)] == ["0.28.0+cpu"]


def test_the_variants_index_is_the_hosts_mirror_or_pytorchs():
    assert torch_index(None, "2.13.0+cpu") == "https://download.pytorch.org/whl/cpu"
    assert torch_index(None, "2.13.0+cu128") == "https://download.pytorch.org/whl/cu128"
    assert torch_index("https://mirror.lab/pytorch/{variant}/", "2.13.0+rocm6.4") == \
        "https://mirror.lab/pytorch/rocm6.4/"
    assert torch_index("https://mirror.lab/whl/cpu", "2.13.0+cpu") == "https://mirror.lab/whl/cpu"
    assert torch_index("https://mirror.lab/{variant}", "2.13.0") is None  # PyPI's own build: PyPI's companions
    assert torch_index(None, None) is None


def test_a_torch_index_that_is_not_a_url_is_refused_at_its_line(tmp_path):
    config = tmp_path / "thrust.yaml"
    config.write_text("hosts:\n  box:\n    address: box\n    torch_index: download.pytorch.org/whl/cpu\n")
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert f"{config.name}:4: hosts.box.torch_index: expected a package index URL" in str(caught.value)
    assert "https://download.pytorch.org/whl/{variant}" in str(caught.value)


@pytest.mark.slow
def test_doctor_job_fails_when_the_cpu_variants_index_cannot_be_reached(tmp_path, sshd, remote_dir, cli):
    import json

    import torch

    index = f"http://127.0.0.1:{_closed_port()}/whl/{{variant}}"
    project = _project(tmp_path, sshd, remote_dir, index)
    started = time.monotonic()
    result = cli("doctor", "--job", "vision", "--json", cwd=project)
    assert time.monotonic() - started < 60
    assert result.returncode == ExitCode.FAILED, result.stderr
    row = next(c for c in json.loads(result.stdout)["checks"] if c["id"] == "torch-companions")
    url = index.replace("{variant}", "cpu")
    assert row["status"] == "fail"
    assert row["detail"] == f"torchvision for torch {torch.__version__} comes from {url}, which sandbox cannot " \
                            "reach (connection refused); PyPI's builds are CUDA ones: a run of this job is " \
                            "refused before its venv's install"
    assert "set `torch_index:` under hosts.sandbox to a mirror of it (`{variant}` stands for cpu)" in row["fix"]
    # a job without a companion has no such row
    result = cli("doctor", "--json", cwd=project)
    assert "torch-companions" not in {c["id"] for c in json.loads(result.stdout)["checks"]}
