"""A `setup:` that runs a script the repository lacks is refused on the laptop, before anything is sent
(issue 53, item 8), like `script:`: exit 78 naming thrust.yaml's line. Only words that clearly name a
repository file are judged: a command on PATH, `sh -c`, `python -m` pass unjudged."""

from __future__ import annotations

import pytest
from helpers import commit, new_project, remote_tempdir

from thrust_remote.run.data import setup_script


@pytest.mark.parametrize(("argv", "script"), [
    (("python", "data/prepare.py"), "data/prepare.py"),
    (("python3", "-u", "prep.py", "--out", "x"), "prep.py"),
    (("/usr/bin/python3", "./data/prep.py"), "data/prep.py"),
    (("./scripts/get.sh", "--all"), "scripts/get.sh"),
    (("bash", "-x", "get.sh"), "get.sh"),
    (("sh", "-c", "python data/prepare.py"), None),  # a shell's own text: not judged
    (("python", "-m", "data.prepare"), None),
    (("python", "-W", "ignore", "prep.py"), None),  # an option's value first: not clearly the script
    (("make", "data"), None),
    (("python", "../outside.py"), None),
    (("python", "/abs/prep.py"), None),
    (("python", "$HOME/prep.py"), None),
    (("pip", "install", "-r", "requirements.txt"), None),
])
def test_the_word_a_setup_runs_as_a_repository_script(argv, script):
    assert setup_script(argv) == script


def test_a_setup_naming_a_script_the_repository_lacks_is_refused_before_anything_is_sent(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    jobs = "jobs:\n  j:\n    command: [sh, -c, 'echo ran']\n    setup: [python3, data/prepare.py, --small]\n"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=jobs, files={"data/other.py": "print(1)\n"})
    done = cli("train", "j", cwd=proj)
    assert done.returncode == 78, done.stderr
    assert "thrust.yaml:" in done.stderr and "jobs.j.setup: data/prepare.py does not exist" in done.stderr
    assert "Traceback" not in done.stderr
    assert not workdir.exists()  # nothing was sent
    assert "git add data/prepare.py && git commit" in done.stderr
    (proj / "data" / "prepare.py").write_text("print('prepared')\n")
    commit(proj, "the script setup: runs", "data/prepare.py")  # what the hint says
    done = cli("train", "j", cwd=proj)
    assert done.returncode == 0, done.stderr
