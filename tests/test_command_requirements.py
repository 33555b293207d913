"""A command job's `requirements:` (issue 53 item 3), over a real sshd: its venv is made as a python
job's, and the command runs with the venv's bin first on PATH (VIRTUAL_ENV set), so `python` in a shell
script, or as the command itself, has them; the host's own python never installs them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir
from test_host_venv import make_wheel

from thrust_remote.core.config import load_config

USE_REQ_SH = '''\
#!/bin/sh
set -e
python -c "import cmdtiny; print(cmdtiny.VERSION)" > "$THRUST_RUN_DIR/imported.txt"
echo "$VIRTUAL_ENV" > "$THRUST_RUN_DIR/venv.txt"
'''

USE_REQ_PY = '''\
import os
import sys

import cmdtiny

with open(os.path.join(os.environ["THRUST_RUN_DIR"], "direct.txt"), "w") as fh:
    fh.write(f"{cmdtiny.VERSION} {sys.prefix}")
'''

JOBS = """\
jobs:
  withreq:
    command: [sh, use_req.sh]
    requirements: [{wheel}]
  directreq:
    command: [python, use_req.py]
    requirements: [{wheel}]
"""


def test_a_command_job_takes_requirements(tmp_path):
    path = tmp_path / "thrust.yaml"
    path.write_text("jobs:\n  c:\n    command: [sh, run.sh]\n    requirements: [numpy]\n"
                    "  f:\n    command: [sh, run.sh]\n    requirements: reqs.txt\n")
    config = load_config(path, environ={})
    assert config.job("c").requirements == ("numpy",) and config.job("f").requirements_file == "reqs.txt"


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir): a shell script and a python file that import the wheel's package."""
    wheel = make_wheel(tmp_path_factory.mktemp("wheel"), "cmdtiny", "0.7")
    workdir = remote_tempdir(sshd) / "cmdreq"
    proj = new_project(tmp_path_factory.mktemp("cmdreq") / "project", sshd, workdir,
                       files={"use_req.sh": USE_REQ_SH, "use_req.py": USE_REQ_PY},
                       jobs=JOBS.format(wheel=wheel), message="a command job with requirements")
    return proj, workdir


def _train(cli, proj: Path, job: str):
    result = cli("train", job, "--no-fetch", cwd=proj)
    match = re.search(r"launching run (\S+)", result.stderr)
    return result, (match.group(1) if match else None)


@pytest.mark.slow
def test_a_command_job_runs_with_its_requirements_in_its_venv(cli, project, sshd):
    proj, workdir = project
    venvs = workdir / ".thrust" / "venvs"
    for job, name in (("withreq", "imported.txt"), ("directreq", "direct.txt")):
        result, run_id = _train(cli, proj, job)
        assert result.returncode == 0, result.stderr
        run_dir = workdir / ".thrust" / "runs" / run_id
        if name == "imported.txt":
            assert (run_dir / name).read_text().strip() == "0.7"
            assert Path((run_dir / "venv.txt").read_text().strip()).parent == venvs
        else:
            version, prefix = (run_dir / name).read_text().split()
            assert version == "0.7" and Path(prefix).parent == venvs
    host_python = sshd.host_config().python
    probe = subprocess.run([host_python, "-c", "import cmdtiny"], capture_output=True)
    assert probe.returncode != 0  # the host's own python never had it installed
