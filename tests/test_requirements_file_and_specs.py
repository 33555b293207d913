"""`requirements: [-r requirements.txt, tensorboard]`: a project's own requirements file and the specs a
thrust.yaml adds, together (found trying lightning-hydra-template, whose file lacks the tensorboard a
`metrics: {tensorboard:}` needs: the list form refused `-r` and the file form took no extras). Parsed
with its mistakes at their lines, and a real job over the sshd host imports a package from each."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir
from test_host_venv import make_wheel

from thrust_remote.core.config import load_config
from thrust_remote.core.errors import ConfigError

USES_BOTH_PY = '''\
import os

import fromfile
import fromlist

with open(os.path.join(os.environ["THRUST_RUN_DIR"], "both.txt"), "w") as fh:
    fh.write(f"{fromfile.VERSION} {fromlist.VERSION}")
'''


def _job(tmp_path: Path, requirements: str):
    path = tmp_path / "thrust.yaml"
    path.write_text(f"jobs:\n  j:\n    script: train.py\n    requirements: {requirements}\n")
    return load_config(path, environ={}).job("j")


@pytest.mark.parametrize("spelling", ["-r requirements.txt", "--requirement requirements.txt",
                                      "--requirement=requirements.txt"])
def test_a_list_names_one_file_as_pip_does_beside_its_specs(tmp_path, spelling):
    job = _job(tmp_path, f"['{spelling}', tensorboard]")
    assert (job.requirements_file, job.requirements) == ("requirements.txt", ("tensorboard",))


@pytest.mark.parametrize(("requirements", "message"), [
    ("['-r a.txt', '-r b.txt']", "one requirements file per job"),
    ("['-r ../outside.txt', numpy]", "a path inside the repository"),
    ("['-e .', numpy]", "expected a pip requirement"),
])
def test_a_list_with_a_file_pip_could_not_take_is_78_at_its_line(tmp_path, requirements, message):
    with pytest.raises(ConfigError) as err:
        _job(tmp_path, requirements)
    assert message in str(err.value) and "thrust.yaml:4" in str(err.value), str(err.value)


@pytest.mark.slow
def test_the_files_specs_and_the_lists_both_reach_the_jobs_venv(cli, sshd, tmp_path_factory):
    wheels = tmp_path_factory.mktemp("wheels")
    from_file, from_list = make_wheel(wheels, "fromfile", "1.1"), make_wheel(wheels, "fromlist", "2.2")
    workdir = remote_tempdir(sshd) / "reqboth"
    proj = new_project(tmp_path_factory.mktemp("reqboth") / "project", sshd, workdir,
                       files={"uses_both.py": USES_BOTH_PY, "requirements.txt": f"{from_file}\n"},
                       jobs=f"jobs:\n  both:\n    script: uses_both.py\n"
                            f"    requirements: [-r requirements.txt, '{from_list}']\n",
                       message="a requirements file and a spec beside it")
    result = cli("train", "both", "--no-fetch", cwd=proj)
    assert result.returncode == 0, result.stderr
    run_id = re.search(r"launching run (\S+)", result.stderr).group(1)  # type: ignore[union-attr]
    assert (workdir / ".thrust" / "runs" / run_id / "both.txt").read_text() == "1.1 2.2"
