"""A misspelled `python:` on a host (issue 53, item 12): the error offers the interpreter doctor finds
there with torch (envcheck's probe of the workdir's .venv, the venvs under home, the system's) and a
command that shows it works, as printed; never "check with: doctor", which stops at the same python."""

from __future__ import annotations

import shlex

from conftest import VENV_BIN
from helpers import new_project, remote_tempdir


def test_a_misspelled_python_offers_the_one_with_torch_there_and_a_command_that_works(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    # the workdir's .venv: what doctor probes first; it runs this suite's python, which has torch
    venv = workdir / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(f'#!/bin/sh\nexec {VENV_BIN / "python"} "$@"\n')
    (venv / "python").chmod(0o755)
    proj = new_project(tmp_path / "project", sshd, workdir, python=VENV_BIN / "pythn",  # one letter dropped
                       jobs="jobs:\n  j:\n    script: j.py\n", files={"j.py": "print('ran')\n"})
    for argv in (["doctor", "--host", "sandbox"], ["train", "j"]):
        done = cli(*argv, cwd=proj)
        assert done.returncode == 69, (argv, done.stdout + done.stderr)
        hint = done.stderr.split("hint:", 1)[1]
        assert f"set `python: {venv / 'python'}` under hosts.sandbox in thrust.yaml" in hint, hint
        assert "check with" not in hint and "doctor" not in hint, hint
        check = shlex.split(hint.split("(it has torch there: ", 1)[1].split(" prints its version)", 1)[0])
        assert check[:2] == ["thrust-remote", "exec"], check
        shown = cli(*check[1:], cwd=proj)  # as printed
        assert shown.returncode == 0 and shown.stdout.strip()[:1].isdigit(), (check, shown.stdout, shown.stderr)
