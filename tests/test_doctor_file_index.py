"""`doctor --job` over a `torch_index:` on the host's own disk (file://): the row says whether that index
lists a build of the companions for the host torch's variant, as the run's setup will ask it (issue 56,
found trying lightning-hydra-template: a mirror without the +cpu build had no row at all, then the
train was refused 78 after its whole install)."""

from __future__ import annotations

import json

import pytest
import torch
from test_torch_companions import _cpu_torchvision, _project

from thrust_remote.core.errors import ExitCode


def _row(cli, project) -> tuple[int, dict]:
    result = cli("doctor", "--job", "vision", "--json", cwd=project)
    checks = json.loads(result.stdout)["checks"]
    return result.returncode, next((c for c in checks if c["id"] == "torch-companions"), {})


@pytest.mark.slow
def test_a_file_index_without_the_variants_build_fails_naming_its_page(tmp_path, sshd, remote_dir, cli):
    index = tmp_path / "index"
    page = index / "cpu" / "torchvision"
    page.mkdir(parents=True)  # PyPI's CUDA build only, as a local mirror of PyPI holds it
    wheel = "torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    (page / "index.html").write_text(f'<a href="../../files/{wheel}">{wheel}</a>\n')
    project = _project(tmp_path, sshd, remote_dir, f"file://{index}/{{variant}}")
    code, row = _row(cli, project)
    assert code == ExitCode.FAILED, row
    assert row["status"] == "fail"
    assert row["detail"].startswith(f"file://{index}/cpu on sandbox lists no +cpu build of torchvision "
                                    f"({page}/index.html); PyPI's builds are CUDA ones")
    assert "set `torch_index:` under hosts.sandbox to an index that has them" in row["fix"]


@pytest.mark.slow
def test_a_file_index_with_the_variants_build_is_ok(tmp_path, sshd, remote_dir, cli):
    index = tmp_path / "index"
    _cpu_torchvision(index)
    project = _project(tmp_path, sshd, remote_dir, f"file://{index}/{{variant}}")
    _, row = _row(cli, project)
    assert row["status"] == "ok", row
    assert row["detail"] == f"torchvision for torch {torch.__version__} come from file://{index}/cpu, " \
                            "which lists +cpu builds on sandbox"
