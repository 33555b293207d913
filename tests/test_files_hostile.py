"""`files:` and what may leave the laptop (docs/architecture.md, "Trees" and "Security"), over a real sshd:
nothing leaves that is not inside the project once its links are resolved. A link inside a `files:`
directory that leads outside the project is refused as the same link named at the top level is (78,
file:line of the `files:` entry, naming the link and where it leads), one that leads to a file of the
project goes as that file's content, a dangling one is a clear 78; a file swapped for a link after it
was hashed is never read nor sent. Around them: the files `files:` sends are not called untracked and
unsent, and the hint after a failed `setup:` is a command that pastes as the argv it ran."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers import as_account, commit, new_project, remote_tempdir, throwaway_account

from thrust_remote.core.errors import ExitCode, ThrustError

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not-for-the-host 7f3a\n"
JOBS = """\
jobs:
  reader:
    kind: command
    command: [sh, -c, 'cat data/*.txt data/alias > "$THRUST_RUN_DIR/seen"']
    files: [data/]
"""


def _secret(tmp_path: Path) -> Path:
    """A private key of the laptop's user, outside the project."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    key = ssh / "id_ed25519"
    key.write_text(SECRET)
    key.chmod(0o600)
    return key


def _files_line(proj: Path) -> int:
    return next(n for n, line in enumerate((proj / "thrust.yaml").read_text().splitlines(), 1) if "files:" in line)


def _host_holds(root: Path, text: str) -> list[str]:
    """The files under `root` (the host side) whose bytes hold `text`."""
    found = subprocess.run(["grep", "-rlF", "--", text.strip(), str(root)], capture_output=True, text=True)
    return found.stdout.split()


def test_a_link_in_a_files_directory_leading_outside_is_refused_one_inside_goes_as_its_content(cli, sshd, tmp_path):
    key = _secret(tmp_path)
    with throwaway_account(sshd) as (account, home):
        workdir = home / "thrust"
        proj = new_project(tmp_path / "project", sshd, workdir, jobs=JOBS, files={".gitignore": "data/\n"},
                           python=Path("/usr/bin/python3"))
        cfg = proj / "thrust.yaml"
        cfg.write_text(re.sub(r"address: \w+@", f"address: {account}@", cfg.read_text()))
        commit(proj, "as the account", "thrust.yaml")
        (proj / "data").mkdir()
        (proj / "data" / "ok.txt").write_text("ok\n")
        os.symlink("/etc/shadow", proj / "data" / "leak")
        os.symlink(os.path.relpath(key, proj / "data"), proj / "data" / "key")  # relative: ../../home/.ssh/...
        line = _files_line(proj)
        refused = cli("train", "reader", cwd=proj)
        assert refused.returncode == ExitCode.CONFIG, refused.stderr
        assert f"thrust.yaml:{line}: jobs.reader.files: data/key is a link that leads outside the project " \
               f"({key})" in refused.stderr, refused.stderr
        assert "sending" not in refused.stderr and "Traceback" not in refused.stderr
        assert not _host_holds(home, SECRET)
        (proj / "data" / "key").unlink()
        refused = cli("train", "reader", cwd=proj)  # the other one, alone
        assert refused.returncode == ExitCode.CONFIG, refused.stderr
        assert "data/leak is a link that leads outside the project (/etc/shadow)" in refused.stderr
        (proj / "data" / "leak").unlink()
        # a link to a file of the project: its content goes, at the link's path, as a file
        (proj / "models").mkdir()
        (proj / "models" / "w.bin").write_text("weights\n")
        os.symlink("../models/w.bin", proj / "data" / "alias")
        done = cli("train", "reader", "--json", cwd=proj)
        assert done.returncode == 0, done.stderr
        run_dir = Path(json.loads(done.stdout)["run_dir"])
        assert (run_dir / "seen").read_text() == "ok\nweights\n"
        alias = Path(json.loads((run_dir / "run.json").read_text())["tree"]) / "data" / "alias"
        assert not alias.is_symlink() and alias.read_text() == "weights\n"
        assert as_account(account, "cat", str(alias)).stdout == "weights\n"  # the account's own file
        assert not _host_holds(home, SECRET)


def test_a_dangling_link_in_a_files_directory_is_a_clear_refusal(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=JOBS, files={".gitignore": "data/\n"})
    (proj / "data").mkdir()
    (proj / "data" / "ok.txt").write_text("ok\n")
    os.symlink("../datasets/not-downloaded.bin", proj / "data" / "alias")
    res = cli("train", "reader", cwd=proj)
    assert res.returncode == ExitCode.CONFIG, res.stderr
    assert f"thrust.yaml:{_files_line(proj)}: jobs.reader.files: data/alias is a link to " \
           "../datasets/not-downloaded.bin, which does not exist" in res.stderr, res.stderr
    assert "internal error" not in res.stderr and "sending" not in res.stderr
    assert not (workdir / ".thrust" / "store").exists()  # refused before any file went


@pytest.mark.parametrize("swapped", ["file", "directory"])
def test_a_file_swapped_for_a_link_after_it_was_hashed_is_neither_read_nor_sent(sshd, tmp_path, swapped):
    from thrust_remote.host.session import HostPaths, HostSession
    from thrust_remote.run import data

    key = _secret(tmp_path)
    os.utime(key, (0, key.stat().st_mtime))  # an atime before its mtime: any read of it moves it (relatime)
    probe = tmp_path / "probe"
    probe.write_text("x")
    os.utime(probe, (0, probe.stat().st_mtime))
    probe.read_text()
    if probe.stat().st_atime == 0:
        pytest.skip("this filesystem does not record reads (noatime): the check below would prove nothing")
    proj = tmp_path / "project"
    (proj / "data" / "sub").mkdir(parents=True)
    (proj / "data" / "sub" / key.name).write_text("alpha\n")
    files = data.local_files(proj, ("data/",))
    # swapped between the hash and the send, as a hostile process might: the file for a link to the key,
    # or its directory for a link to the key's directory (the file's own name then leads to the key)
    if swapped == "file":
        (proj / "data" / "sub" / key.name).unlink()
        os.symlink(key, proj / "data" / "sub" / key.name)
    else:
        (proj / "data" / "sub").rename(proj / "data" / "old")
        os.symlink(key.parent, proj / "data" / "sub")
    workdir = remote_tempdir(sshd) / "w"
    runner = sshd.runner(workdir=str(workdir))
    session = HostSession(runner, sshd.host_config(workdir=str(workdir)), HostPaths(str(workdir)))
    try:
        with pytest.raises(ThrustError) as refused:
            data.send_files(session, files, data.Steps())
    finally:
        runner.close()
    assert refused.value.exit_code == ExitCode.TRANSFER
    assert f"data/sub/{key.name} was replaced" in refused.value.message, refused.value.message
    assert key.stat().st_atime == 0, "the private key was read on the laptop"
    assert not _host_holds(workdir.parent, SECRET)


UNTRACKED_JOBS = """\
jobs:
  reader:
    kind: command
    command: [sh, -c, 'wc -c < data/huge.bin > "$THRUST_RUN_DIR/seen"']
    files: [data/huge.bin]
"""


def test_the_files_that_files_sends_are_not_called_untracked_and_unsent(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=UNTRACKED_JOBS)
    (proj / "data").mkdir()
    (proj / "data" / "huge.bin").write_bytes(b"\0" * 4096)
    (proj / "scratch.txt").write_text("notes\n")
    res = cli("train", "reader", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    assert (Path(json.loads(res.stdout)["run_dir"]) / "seen").read_text().strip() == "4096"
    assert "1 untracked file was not sent: scratch.txt" in res.stderr, res.stderr
    assert "huge.bin" not in res.stderr.split("untracked")[1].split("\n")[0], res.stderr


SETUP_JOBS = """\
jobs:
  prepared:
    kind: command
    command: [cat, made.txt]
    setup: [bash, -c, 'echo made > made.txt; echo "it broke" >&2; exit 3']
"""


def test_the_hint_after_a_failed_setup_pastes_as_the_argv_it_ran(cli, sshd, tmp_path):
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=SETUP_JOBS)
    res = cli("train", "prepared", cwd=proj)
    assert res.returncode == ExitCode.FAILED and "it broke" in res.stderr, res.stderr
    hint = res.stderr.split("try it there with: ", 1)[1].splitlines()[0]
    argv = shlex.split(hint)  # what a shell makes of it when pasted
    assert argv[:2] == ["thrust-remote", "exec"], argv
    split = argv.index("--")
    assert argv[split + 1:] == ["bash", "-c", 'echo made > made.txt; echo "it broke" >&2; exit 3']
    options = argv[2:split]
    assert options[options.index("--host") + 1] == "sandbox"
    assert options[options.index("--cwd") + 1].startswith(str(workdir / ".thrust" / "trees"))
    assert not (proj / "made.txt").exists()


LFS_JOBS = """\
jobs:
  lfs:
    kind: command
    command: ["true"]
"""


def test_a_committed_link_among_the_git_lfs_paths_is_not_sent_as_lfs_content(cli, sshd, tmp_path):
    # git stores a symlink as its target's text and never runs a filter on it: it is not LFS content,
    # and the file it leads to on the laptop (a private key here) is not the project's to send
    key = _secret(tmp_path)
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=LFS_JOBS,
                       files={".gitattributes": "*.bin filter=lfs diff=lfs merge=lfs -text\n"})
    os.symlink(key, proj / "weights.bin")
    commit(proj, "a link among the LFS paths", "weights.bin")
    res = cli("train", "lfs", "--json", cwd=proj)
    assert res.returncode == 0, res.stderr
    tree = Path(json.loads((Path(json.loads(res.stdout)["run_dir"]) / "run.json").read_text())["tree"])
    assert (tree / "weights.bin").is_symlink()  # as committed
    assert not _host_holds(workdir, SECRET)  # not in the LFS objects, the tree or anywhere (grep -r: no links)


def test_a_submodule_path_that_is_a_link_to_a_repository_outside_is_not_synced(cli, sshd, tmp_path):
    # the index has a submodule at lib/, the working tree a link there to another repository of the
    # user's: its commits and uncommitted changes are not the project's to send
    other = tmp_path / "home" / "private-repo"
    other.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    (other / "notes.txt").write_text(SECRET)
    subprocess.run(["git", "-C", str(other), "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(other), "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "x"],
                   check=True)
    lib = tmp_path / "lib-origin"
    subprocess.run(["git", "init", "-q", str(lib)], check=True)
    (lib / "lib.py").write_text("X = 1\n")
    subprocess.run(["git", "-C", str(lib), "-c", "user.email=t@e", "-c", "user.name=t", "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(lib), "-c", "user.email=t@e", "-c", "user.name=t", "commit", "-qm", "l"],
                   check=True)
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=LFS_JOBS)
    subprocess.run(["git", "-C", str(proj), "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib),
                    "lib"], check=True, capture_output=True)
    commit(proj, "a submodule")
    subprocess.run(["rm", "-rf", str(proj / "lib")], check=True)
    os.symlink(other, proj / "lib")
    res = cli("train", "lfs", cwd=proj)
    assert res.returncode == 0, res.stderr
    assert not _host_holds(workdir, SECRET)
    assert "submodule path(s) that are links here were not sent" in res.stderr and f"lib -> {other}" in res.stderr
