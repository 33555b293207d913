"""`doctor --job` reads the companions' pages of the host torch's variant index (a file:// mirror on the
host's disk, or over http) for a build of that variant, as the run's setup will ask it; reaching the index
said nothing of what it serves (issue 56, found trying lightning-hydra-template: a mirror without the +cpu
build had no row, or an ok one, then the train was refused 78 after its whole install)."""

from __future__ import annotations

import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_torch_companions import _closed_port, _cpu_torchvision, _project

from thrust_remote.core.errors import ExitCode

CUDA_WHEEL = "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl"


def _row(cli, project) -> tuple[int, dict]:
    result = cli("doctor", "--job", "vision", "--json", cwd=project)
    checks = json.loads(result.stdout)["checks"]
    return result.returncode, next((c for c in checks if c["id"] == "torch-companions"), {})


def _cuda_only(index: Path) -> Path:
    """A mirror of PyPI: torchvision's page lists its CUDA build only."""
    page = index / "cpu" / "torchvision"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="../../files/{CUDA_WHEEL}">{CUDA_WHEEL}</a>\n')
    return page


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[Path, str]]:
    """A directory served over http on 127.0.0.1, as a lab's mirror of PyTorch's index is."""
    root = tmp_path / "served"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


@pytest.mark.slow
def test_a_file_index_without_the_variants_build_fails_naming_its_page(tmp_path, sshd, remote_dir, cli):
    index = tmp_path / "index"
    page = _cuda_only(index)
    project = _project(tmp_path, sshd, remote_dir, f"file://{index}/{{variant}}")
    code, row = _row(cli, project)
    assert code == ExitCode.FAILED, row
    assert row["status"] == "fail"
    assert row["detail"].startswith(f"file://{index}/cpu on sandbox lists no +cpu build of torchvision "
                                    f"({page}/index.html lists none); PyPI's builds are CUDA ones: "
                                    "a run of this job is refused before its venv's install")
    assert "set `torch_index:` under hosts.sandbox to an index that has it" in row["fix"]


@pytest.mark.slow
def test_a_file_index_with_the_variants_build_is_ok(tmp_path, sshd, remote_dir, cli):
    index = tmp_path / "index"
    _cpu_torchvision(index)
    project = _project(tmp_path, sshd, remote_dir, f"file://{index}/{{variant}}")
    _, row = _row(cli, project)
    assert row["status"] == "ok", row
    assert row["detail"] == f"torchvision for torch {torch.__version__} comes from file://{index}/cpu, " \
                            "which sandbox holds, listing +cpu builds"


@pytest.mark.slow
def test_an_http_index_that_answers_without_the_variants_build_fails(tmp_path, sshd, remote_dir, cli, served):
    root, url = served
    _cuda_only(root)
    project = _project(tmp_path, sshd, remote_dir, f"{url}/{{variant}}")
    code, row = _row(cli, project)
    assert code == ExitCode.FAILED and row["status"] == "fail", row
    assert row["detail"].startswith(f"{url}/cpu on sandbox lists no +cpu build of torchvision "
                                    f"({url}/cpu/torchvision/ lists none); PyPI's builds are CUDA ones: "
                                    "a run of this job is refused before its venv's install")


@pytest.mark.slow
def test_an_http_index_with_the_variants_build_is_ok(tmp_path, sshd, remote_dir, cli, served):
    root, url = served
    _cpu_torchvision(root)
    project = _project(tmp_path, sshd, remote_dir, f"{url}/{{variant}}")
    _, row = _row(cli, project)
    assert row["status"] == "ok", row
    assert row["detail"] == f"torchvision for torch {torch.__version__} comes from {url}/cpu, " \
                            "which sandbox reaches, listing +cpu builds"


@pytest.mark.slow
def test_a_companion_the_hosts_python_already_loads_beside_its_torch_is_ok_with_the_index_down(
        tmp_path, sshd, remote_dir, cli):
    """The host's python has its own torchvision, which loads beside its torch (the venv keeps it: pip
    has it already): the variant's index is not needed, so its being down is no warning (it was one)."""
    own = tmp_path / "own" / "torchvision"
    own.mkdir(parents=True)
    (own / "__init__.py").write_text("from . import ops\n__version__ = '0.28.0+cpu'\n")
    (own / "ops.py").write_text("import torch\n"
                                "def nms(boxes, scores, iou):\n    return torch.zeros(1, dtype=torch.long)\n")
    python = tmp_path / "python"  # the sshd's python, with that torchvision on its path
    python.write_text(f"#!/bin/sh\nPYTHONPATH={own.parent}${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec {sshd.host_config().python} \"$@\"\n")
    python.chmod(0o755)
    index = f"http://127.0.0.1:{_closed_port()}/whl/{{variant}}"
    project = _project(tmp_path, sshd, remote_dir, index, python=python)
    code, row = _row(cli, project)
    assert row["status"] == "ok", row
    assert row["detail"] == f"torchvision in sandbox's python loads beside its torch {torch.__version__}: the " \
                            f"job's venv uses it, needing nothing from {index.replace('{variant}', 'cpu')}"
