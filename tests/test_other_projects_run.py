"""A run another project launched on a shared host (issue 53): `runs --all` of this project lists it, and
`fetch` of it says whose it is and the command to run from there, not "add it under `jobs:`"."""

from __future__ import annotations

import re
import shlex

from helpers import new_project, remote_tempdir

WIDE = {"COLUMNS": "1000"}


def test_fetch_of_another_projects_run_says_whose_it_is_and_the_fetch_from_there(cli, sshd, tmp_path) -> None:
    workdir = remote_tempdir(sshd) / "w"  # one workdir on the host for both, as two projects of one user have
    mine = new_project(tmp_path / "a", sshd, workdir, files={"nap.py": "print('napped')\n"},
                       jobs="jobs:\n  nap:\n    script: nap.py\n    artifacts: ['*.txt']\n")
    theirs = new_project(tmp_path / "b", sshd, workdir, files={"zoo.py": "open('out.txt', 'w').write('1')\n"},
                         jobs="jobs:\n  zoo:\n    script: zoo.py\n    artifacts: ['*.txt']\n",
                         message="another project")
    ran = cli("train", "zoo", "--no-fetch", cwd=theirs, env=WIDE)
    assert ran.returncode == 0, ran.stderr
    run_id = re.search(r"launching run (\S+)", ran.stderr).group(1)
    listed = cli("runs", "--all", cwd=mine, env=WIDE)
    assert run_id in listed.stdout + listed.stderr, listed.stdout
    fetched = cli("fetch", run_id, cwd=mine, env=WIDE)
    said = fetched.stdout + fetched.stderr
    assert fetched.returncode == 64, said
    assert "add it under `jobs:`" not in said, said
    assert (f"run {run_id} on sandbox is another project's run: its job 'zoo' is not in {mine / 'thrust.yaml'}"
            in said), said
    assert "is not in this repository, so another project launched it" in said, said
    hint = said.split("hint: ", 1)[1].splitlines()[0]
    assert "the one whose thrust.yaml has job zoo" in hint, hint
    # run.json says where the run was launched from, and that directory is on this laptop: the hint goes there
    cd, fetch = hint.rsplit(": ", 1)[1].split(" && ")
    assert shlex.split(cd) == ["cd", str(theirs)], hint
    words = shlex.split(fetch)
    assert words == ["thrust-remote", "fetch", run_id, "--host", "sandbox"], words
    # a launching directory that is not on this laptop (another machine's, moved): the hint is as before
    moved = theirs.rename(tmp_path / "b-moved")
    elsewhere = cli("fetch", run_id, cwd=mine, env=WIDE)
    assert elsewhere.returncode == 64, elsewhere.stderr
    hint = (elsewhere.stdout + elsewhere.stderr).split("hint: ", 1)[1].splitlines()[0]
    assert "&&" not in hint and shlex.split(hint.rsplit(": ", 1)[1]) == words, hint
    moved.rename(theirs)
    followed = cli(*words[1:], cwd=shlex.split(cd)[1], env=WIDE)  # pasted as the hint says: cd there, fetch
    assert followed.returncode == 0, followed.stderr
