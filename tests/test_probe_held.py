"""What issue 51's probe found held, kept as regression tests (docs/architecture.md, "Security", "Trees",
"Job kinds", "Slurm clusters"), over a real sshd with real non-root accounts where an account matters:

- file names with a newline, `$(id)`, backquotes and quotes arrive exact in the run's tree (committed, in
  the patch, as `files:`) and come back exact as artifacts, and no shell ever reads one;
- `--set` values reach the job byte for byte under every flag style (`flags: {style: ...}`);
- links the commit tracks into the account's `~/.ssh` are never fetched, as artifacts or checkpoints;
- an `ext::` origin (a command in a URL) is never run on the host: the commit goes as a bundle;
- a commit that holds a `.git/config` is refused on the host, whose own config stays as it was;
- a run id with `..` is refused (64) by every command that takes one, before any host file is read;
- another account on the host reads nothing of the workdir: the store, the trees, the run dirs;
- hostile Slurm `partition:`/`account:`/`time:` values are config errors at their line (78);
- a laptop killed (SIGKILL) during the sync, the tree, the `files:`, the launch or the fetch leaves no
  process of the account running on the host.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from helpers import EXE, as_account, commit, git, new_project, remote_tempdir, throwaway_account, wait_until

from thrust_remote.core.errors import ExitCode
from thrust_remote.core.names import valid_env_key, valid_host, valid_id, valid_user

QUICK = """\
jobs:
  quick:
    kind: command
    command: [sh, -c, 'true']
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    return env


def _run_id(result: subprocess.CompletedProcess) -> str:
    match = re.search(r"launching run (\S+)", result.stderr)
    assert match, result.stderr
    return match.group(1)


def _owned(sshd, account: str, workdir: Path, path: Path, *, jobs: str, files: dict | None = None) -> Path:
    """A project whose host `sandbox` is this sshd logged in as `account` (the system's python), its
    workdir `workdir`."""
    proj = new_project(path, sshd, workdir, files=files, jobs=jobs, python="/usr/bin/python3")
    cfg = proj / "thrust.yaml"
    cfg.write_text(re.sub(r"address: \w+@", f"address: {account}@", cfg.read_text()))
    commit(proj, "the host's account", "thrust.yaml")
    return proj


# ------------------------------------------------------------------------------------------ odd file names

# names a shell would split, expand or run; each is a plain file name to git, the store and the fetch
ODD = ["new\nline.txt", "$(id).txt", "`id`.txt", "q'\"; touch {mark} #.txt", "x$(touch {mark})y.txt",
       "-n.txt", "tab\there.txt", "back\\slash.txt", "caf\u00e9 \u2713.txt"]
SEE_PY = """\
import json, os, sys

def contents(top):
    found = {}
    for root, _dirs, files in os.walk(top):
        for name in files:
            with open(os.path.join(root, name), encoding="utf-8") as fh:
                found[os.path.relpath(os.path.join(root, name), top)] = fh.read()
    return found

os.makedirs("out", exist_ok=True)
for i, name in enumerate(json.loads(sys.argv[1])):
    with open(os.path.join("out", name), "w", encoding="utf-8") as fh:
        fh.write("made %d" % i)
with open(os.path.join(os.environ["THRUST_RUN_DIR"], "seen.json"), "w", encoding="utf-8") as fh:
    json.dump({"in": contents("in"), "data": contents("data")}, fh)
"""


def test_odd_file_names_arrive_exact_in_the_tree_and_come_back_exact_as_artifacts(cli, sshd, tmp_path):
    """Committed, changed in the patch, sent as `files:`, written by the job and fetched: every name
    is the same bytes at each end, and the `touch` in two of them never ran anywhere."""
    mark = f"PWNED-{secrets.token_hex(4)}"
    names = [n.format(mark=mark) for n in ODD]
    workdir = remote_tempdir(sshd) / "w"
    jobs = ("jobs:\n  see:\n    kind: command\n    command: [python, see.py, " + json.dumps(json.dumps(names))
            + "]\n    files: [data/]\n    artifacts: ['out/**']\n")
    files = {"see.py": SEE_PY, ".gitignore": "data/\n", **{f"in/{n}": f"committed {i}" for i, n in enumerate(names)}}
    proj = new_project(tmp_path / "project", sshd, workdir, files=files, jobs=jobs, message="odd names")
    (proj / "data").mkdir()
    for i, name in enumerate(names):
        (proj / "data" / name).write_text(f"data {i}")
    (proj / "in" / names[0]).write_text("changed, not committed")  # the newline's name in the patch
    result = cli("train", "see", cwd=proj)
    assert result.returncode == 0, result.stderr
    run_id = _run_id(result)
    seen = json.loads((workdir / ".thrust" / "runs" / run_id / "seen.json").read_text())
    committed = {n: f"committed {i}" for i, n in enumerate(names)}
    assert seen["in"] == {**committed, names[0]: "changed, not committed"}
    assert seen["data"] == {n: f"data {i}" for i, n in enumerate(names)}
    fetched = proj / ".thrust" / "fetched" / run_id / "artifacts" / "out"
    assert {p.name: p.read_text() for p in fetched.iterdir()} == {n: f"made {i}" for i, n in enumerate(names)}
    # where a shell would have run it: the job's tree, the host account's home (the agent's cwd), the project
    assert not list(workdir.rglob(f"{mark}*")) and not list(proj.rglob(f"{mark}*"))
    assert not list(Path.home().glob(f"{mark}*"))


# ------------------------------------------------------------------------------------------ --set, every style

ARGV_PY = """\
import json, os, sys
with open(os.path.join(os.environ["THRUST_RUN_DIR"], "argv.json"), "w", encoding="utf-8") as fh:
    json.dump(sys.argv[1:], fh)
"""
STYLES = {"spaced": "--key value", "joined": "--key=value", "bare": "key=value", "single": "-k value"}
# values a shell, a YAML reader or a flag parser would change; true/false are switches (documented)
VALUES = {"spaces": "a b  c", "pad": "  padded  ", "subst": "$(id)", "ticks": "`id`", "quotes": "'\"\\",
          "semi": "x; touch {mark}", "newline": "line 1\nline 2", "dash": "--help", "star": "*", "tilde": "~/x",
          "unicode": "caf\u00e9 \u2713", "tab": "\t", "empty": "", "equals": "a=b=c", "ops": "a && b | c > d",
          "num": "007", "yamlish": "{a: [1, 2]}", "null": "null"}


def _words(style: str, values: dict[str, str]) -> list[str]:
    """What the job must see: each value one word, as given (docs/architecture.md, "Job kinds")."""
    out: list[str] = []
    for key, value in values.items():
        out += {"--key value": [f"--{key}", value], "--key=value": [f"--{key}={value}"],
                "key=value": [f"{key}={value}"], "-k value": [f"-{key}", value]}[style]
    return out


@pytest.mark.slow
def test_set_values_reach_the_job_byte_for_byte_in_every_flag_style(cli, sshd, tmp_path):
    """Each `--set` value is one argv word of the job's, the same bytes under each `flags: {style:}` and a
    command job's default: nothing on the way (the host's command line, the launch, a shell) reads it."""
    mark = f"PWNED-{secrets.token_hex(4)}"
    values = {k: v.replace("{mark}", mark) for k, v in VALUES.items()}
    jobs = "jobs:\n" + "".join(f"  {name}:\n    script: argv.py\n    flags: {{style: '{style}'}}\n"
                               for name, style in STYLES.items())
    jobs += "  cmd:\n    kind: command\n    command: [python, argv.py]\n"  # a command job's own default
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, files={"argv.py": ARGV_PY}, jobs=jobs, message="argv")
    sets = [w for k, v in values.items() for w in ("--set", f"{k}={v}")]
    for job, style in [*STYLES.items(), ("cmd", "key=value")]:
        result = cli("train", job, "--no-fetch", *sets, cwd=proj)
        assert result.returncode == 0, result.stderr
        seen = json.loads((workdir / ".thrust" / "runs" / _run_id(result) / "argv.json").read_text())
        assert seen == _words(style, values), (job, style)
    assert not list(workdir.rglob(f"{mark}*")) and not list(proj.rglob(f"{mark}*"))
    assert not list(Path.home().glob(f"{mark}*"))


# ------------------------------------------------------------------------------------------ links to ~/.ssh

LINKS_JOBS = """\
jobs:
  links:
    kind: command
    command: [sh, -c, 'mkdir -p ckpt && printf state > ckpt/step-1.pt && printf weights > models/real.pt']
    artifacts: ['keys', 'keys/**', 'models/*']
    checkpoints: ckpt/*.pt
"""


def test_links_the_commit_tracks_into_the_accounts_ssh_dir_are_never_fetched(cli, sshd, tmp_path):
    """A repository may point any path of its tree at any directory of the host account (git keeps a
    link's text): artifacts and checkpoints that are such links, absolute or relative, to ~/.ssh or a key
    in it, are refused by their real path and named; the run's own files come."""
    with throwaway_account(sshd) as (owner, home):
        secret = f"PRIVATE-KEY-{secrets.token_hex(8)}"
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        for name in ("id_ed25519", "authorized_keys"):
            (ssh_dir / name).write_text(f"{secret} {name}\n")
        subprocess.run(["chown", "-R", f"{owner}:{owner}", str(ssh_dir)], check=True)
        workdir = home / "thrust"
        proj = _owned(sshd, owner, workdir, tmp_path / "project", jobs=LINKS_JOBS)
        (proj / "models").mkdir()
        (proj / "ckpt").mkdir()
        (proj / "keys").symlink_to(ssh_dir)
        (proj / "models" / "abs.pt").symlink_to(ssh_dir / "id_ed25519")
        # from <workdir>/.thrust/trees/<run>/models: five levels up is the account's home
        (proj / "models" / "rel.pt").symlink_to("../../../../../.ssh/id_ed25519")
        (proj / "ckpt" / "step-9.pt").symlink_to(ssh_dir / "authorized_keys")  # the newest name
        (proj / "ckpt" / "keys.pt").symlink_to(ssh_dir)
        commit(proj, "links into the host account's ~/.ssh")
        trained = cli("train", "links", cwd=proj)
        assert trained.returncode == 0, trained.stderr
        run_id = _run_id(trained)
        tree = workdir / ".thrust" / "trees" / run_id
        assert (tree / "models" / "rel.pt").resolve() == ssh_dir / "id_ed25519"  # the link is live on the host
        fetched_again = cli("fetch", run_id, cwd=proj)
        assert fetched_again.returncode == 0, fetched_again.stderr
        for result in (trained, fetched_again):
            refused = [line for line in result.stderr.splitlines() if "outside the run's directories" in line]
            assert any("models/abs.pt" in line for line in refused), result.stderr
            assert any("models/rel.pt" in line for line in refused), result.stderr
            assert any("step-9.pt" in line for line in refused), result.stderr
            assert secret not in result.stdout + result.stderr
        got = proj / ".thrust" / "fetched" / run_id
        assert (got / "artifacts" / "models" / "real.pt").read_bytes() == b"weights"
        assert sorted(p.name for p in (got / "checkpoints").iterdir()) == ["step-1.pt"]
        here = [p for p in (proj / ".thrust").rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
        assert here == [] and not any(p.is_symlink() for p in got.rglob("*"))


# ------------------------------------------------------------------------------------------ ext:: origins


def test_an_ext_origin_is_never_run_on_the_host_and_the_commit_goes_as_a_bundle(cli, sshd, tmp_path):
    """The host clones (first sync) and fetches (a later one) from the laptop's origin when it can: an
    `ext::` origin is a command for git to run; the host's git refuses it, and the commit goes as a bundle."""
    mark = tmp_path / f"PWNED-{secrets.token_hex(4)}"
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=QUICK)
    git(proj, "remote", "add", "origin", f"ext::sh -c touch% {mark}")
    for round_ in ("first sync: a clone", "a later sync: a fetch"):
        result = cli("train", "quick", cwd=proj)
        assert result.returncode == 0, (round_, result.stderr)
        assert "from origin on the host" in result.stderr and "as a git bundle" in result.stderr, result.stderr
        run_json = json.loads((workdir / ".thrust" / "runs" / _run_id(result) / "run.json").read_text())
        assert run_json["sync"] == "bundle", round_
        assert not mark.exists(), f"{round_}: the origin's command ran"
        (proj / "next.txt").write_text(round_)
        commit(proj, "a commit the host lacks")
    assert "ext::" not in (workdir / ".git" / "config").read_text()


# ------------------------------------------------------------------------------------------ .git/config


def _tree_with(proj: Path, path: str, text: str) -> str:
    """HEAD's tree with a blob at `path` added (a crafted tree: git itself never stages `.git`)."""

    def run(*args: str, stdin: str) -> str:
        return subprocess.run(["git", "-C", str(proj), *args], input=stdin, capture_output=True, text=True,
                              check=True).stdout.strip()

    *dirs, leaf = path.split("/")
    entry = f"100644 blob {run('hash-object', '-w', '--stdin', stdin=text)}\t{leaf}\n"
    for depth in range(len(dirs), 0, -1):
        entry = f"040000 tree {run('mktree', stdin=entry)}\t{dirs[depth - 1]}\n"
    top = git(proj, "ls-tree", "HEAD")
    return run("mktree", stdin=f"{top}\n{entry}")


@pytest.mark.parametrize("path", [".git/config", "sub/.git/config"])
def test_a_commit_that_holds_a_git_config_is_refused_and_the_hosts_own_config_stays(cli, sshd, tmp_path, path):
    """A commit with `.git/config` (a hook or fsmonitor command in it) would, checked out, configure the
    host's git for the account. The tree is refused with the path named; the workdir's config, its trees
    and its runs stay as they were, and the command in the crafted config never runs."""
    mark = tmp_path / f"PWNED-{secrets.token_hex(4)}"
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=QUICK)
    first = cli("train", "quick", cwd=proj)
    assert first.returncode == 0, first.stderr
    config_before = (workdir / ".git" / "config").read_bytes()
    trees_before = sorted(p.name for p in (workdir / ".thrust" / "trees").iterdir())
    runs_before = sorted(p.name for p in (workdir / ".thrust" / "runs").iterdir())
    evil = f'[core]\n\tfsmonitor = "touch {mark}; false"\n\thooksPath = {tmp_path}\n'
    (tmp_path / "post-checkout").write_text(f"#!/bin/sh\ntouch {mark}\n")
    (tmp_path / "post-checkout").chmod(0o755)
    crafted = git(proj, "commit-tree", _tree_with(proj, path, evil), "-p", "HEAD", "-m", "a .git/config")
    git(proj, "update-ref", "HEAD", crafted)
    for attempt in ("first", "again"):
        result = cli("train", "quick", cwd=proj)
        assert result.returncode != 0, (attempt, result.stderr)
        assert f"invalid path '{path}'" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and "launching run" not in result.stderr
        assert (workdir / ".git" / "config").read_bytes() == config_before
        assert sorted(p.name for p in (workdir / ".thrust" / "trees").iterdir()) == trees_before
        assert sorted(p.name for p in (workdir / ".thrust" / "runs").iterdir()) == runs_before
        assert not mark.exists()


# ------------------------------------------------------------------------------------------ run ids with ..

BAD_IDS = ["../x", "..", ".", "a/../../x", "../../../etc", "x/y", "..%2fx"]
ID_COMMANDS = [("logs",), ("logs", "--follow"), ("status",), ("status", "--json"), ("stop",), ("fetch",),
               ("resume",), ("wait",)]


def test_a_run_id_with_dots_or_a_slash_is_refused_by_every_command_and_reads_nothing(cli, sshd, tmp_path):
    """`.thrust/x` beside `.thrust/runs` holds a copy of a real run with a decoy log: `../x` would name it.
    Every command that takes a run id refuses such an id (64) and the decoy is neither shown nor changed."""
    workdir = remote_tempdir(sshd) / "w"
    proj = new_project(tmp_path / "project", sshd, workdir, jobs=QUICK)
    trained = cli("train", "quick", cwd=proj)
    assert trained.returncode == 0, trained.stderr
    decoy = workdir / ".thrust" / "x"
    subprocess.run(["cp", "-a", str(workdir / ".thrust" / "runs" / _run_id(trained)), str(decoy)], check=True)
    (decoy / "log").write_text("DECOY-LOG\n")

    def snapshot() -> dict:
        return {str(p.relative_to(workdir / ".thrust")): p.read_bytes() if p.is_file() else None
                for p in (workdir / ".thrust").rglob("*") if "venvs" not in p.parts}

    fetched = proj / ".thrust" / "fetched"
    before, fetched_before = snapshot(), sorted(fetched.rglob("*"))
    for command in ID_COMMANDS:
        for run_id in BAD_IDS:
            result = cli(*command, run_id, cwd=proj)
            said = result.stdout + result.stderr
            assert result.returncode == ExitCode.USAGE, (command, run_id, said)
            assert f"run id {run_id!r} is not valid" in result.stderr, (command, run_id, said)
            assert "DECOY" not in said and "Traceback" not in said
    assert snapshot() == before
    assert sorted(fetched.rglob("*")) == fetched_before and not (proj / ".thrust" / "x").exists()


# ------------------------------------------------------------------------------------------ another account

SHARED_JOBS = """\
jobs:
  keep:
    kind: command
    command: [sh, -c, 'cat data/secret.txt > "$THRUST_RUN_DIR/copy.txt"; echo {secret}']
    files: [data/]
"""


def _denied(account: str, *argv: str) -> None:
    done = as_account(account, *argv)
    assert done.returncode != 0 and "Permission denied" in done.stderr, (argv, done.stdout, done.stderr)


def test_another_account_reads_nothing_of_the_workdir_its_store_trees_or_run_dirs(cli, sshd, tmp_path):
    """As made, and again with the workdir and .thrust loosened to 0755 (an older version's, or a user's
    chmod): the store, the trees and the run dirs are each owner-only; the next run tightens the workdir."""
    secret = f"secret-{secrets.token_hex(6)}"
    with throwaway_account(sshd) as (owner, home), throwaway_account(sshd) as (other, _):
        workdir = home / "thrust"
        proj = _owned(sshd, owner, workdir, tmp_path / "project", jobs=SHARED_JOBS.format(secret=secret),
                      files={".gitignore": "data/\n", "code.py": f"TOKEN = {secret!r}\n"})
        (proj / "data").mkdir()
        (proj / "data" / "secret.txt").write_text(secret)
        trained = cli("train", "keep", "--json", cwd=proj)
        assert trained.returncode == 0, trained.stderr
        run_id = json.loads(trained.stdout)["run_id"]
        thrust = workdir / ".thrust"
        tree, run_dir = thrust / "trees" / run_id, thrust / "runs" / run_id
        stored = [p for p in (thrust / "store").rglob("*") if p.is_file() and p.read_bytes() == secret.encode()]
        assert len(stored) == 1 and (run_dir / "copy.txt").read_text() == secret
        # each guarded by its own mode too; the workdir's .git (the project's code) by the workdir's alone
        files = [tree / "code.py", tree / "data" / "secret.txt", tree / "thrust.yaml", stored[0],
                 run_dir / "copy.txt", run_dir / "log", run_dir / "run.json"]
        dirs = [thrust / "store", thrust / "trees", tree, run_dir]
        for path in files + [workdir / ".git" / "config"]:
            _denied(other, "cat", str(path))
        for path in dirs + [workdir, workdir / ".git" / "objects"]:
            _denied(other, "ls", str(path))
        for path in (workdir, thrust):
            path.chmod(0o755)
        for path in files:
            _denied(other, "cat", str(path))
        for path in dirs:
            _denied(other, "ls", str(path))
        again = cli("train", "keep", cwd=proj)
        assert again.returncode == 0, again.stderr
        for path in (workdir, thrust):
            assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
        _denied(other, "cat", str(workdir / ".git" / "config"))


# ------------------------------------------------------------------------------------------ Slurm keys

SLURM = """default_host: hpc
hosts:
  hpc:
    address: me@login
    scheduler: slurm
    {key}: {value}
jobs:
  j:
    command: [echo, hi]
"""
HOSTILE_NAMES = ["-p", "--wrap=id", "gpu --wrap=id", "gpu;id", "$(id)", "`id`", "gpu\n#SBATCH --wrap=id",
                 "gpu\n--wrap=id", "../x", "gpu debug", "gpu\tx", "a" * 65, "", "gpu\n"]
HOSTILE_TIMES = ["--wrap=id", "1:00 --wrap=id", "$(id)", "`id`", "1:00;id", "-1", "1:00\n#SBATCH --wrap=id",
                 "forever", "1:00:00:00:00", "", "1:00\n"]


@pytest.mark.parametrize(("key", "value", "says"), [
    *[("partition", v, "expected a Slurm partition name") for v in HOSTILE_NAMES],
    *[("account", v, "expected a Slurm account name") for v in HOSTILE_NAMES],
    *[("time", v, "expected a Slurm time limit") for v in HOSTILE_TIMES],
])
def test_a_hostile_slurm_partition_account_or_time_is_a_config_error_at_its_line(cli, tmp_path, key, value, says):
    """These become sbatch's options: a value that is another option, a shell word or a second line is
    refused as thrust.yaml is read (78, file:line), before any host is asked."""
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "thrust.yaml").write_text(SLURM.format(key=key, value=json.dumps(value)))  # JSON is YAML: "\n" a newline
    for argv in (["runs"], ["train", "j", "--detach"]):
        result = cli(*argv, cwd=proj)
        assert result.returncode == ExitCode.CONFIG, (argv, result.stderr)
        assert f"thrust.yaml:6: hosts.hpc.{key}: {says}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize("check", [valid_host, valid_user, valid_env_key, valid_id])
def test_a_name_with_a_trailing_newline_is_not_valid(check):
    """`$` in a pattern also matches before a final newline: every name check anchors at the very end."""
    assert check("name")
    assert not check("name\n")


# ------------------------------------------------------------------------------------------ SIGKILL of the laptop

BIG = 48 << 20  # enough that the stage's transfer or checkout is still under way when the kill comes
KILL_JOBS = """\
jobs:
  plain:
    kind: command
    command: [sh, -c, 'true']
  data:
    kind: command
    command: [sh, -c, 'true']
    files: [data/]
  out:
    kind: command
    command: [sh, -c, 'mkdir -p out && head -c {big} /dev/urandom > out/big.bin']
    artifacts: ['out/*']
"""
# stage -> (job, the CLI's line as the stage begins, what the project holds)
STAGES = {
    "sync": ("plain", "sending the missing commits as a git bundle", "commit"),
    "tree": ("plain", "making the run's tree at", "commit"),
    "files": ("data", "sending 1 of 1 files:", "files"),
    "launch": ("plain", "launching run", ""),
    "fetch": ("out", "fetching the artifacts", ""),
}
GONE_S = 30.0  # a request still running when its link closed finishes by itself (a bundle's fetch, a checkout)


def _left(sshd, uid: int, since: float) -> list[str]:
    """The account's processes on the host started since `since`, zombies aside: 'pid argv'. (A system
    account's uid is given again once its account is gone: an earlier test's account may have had it.)"""
    found = []
    for proc in sshd.processes():
        try:
            if proc.uids().real == uid and proc.create_time() >= since and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            continue
    return found


def _kill_at(proc: subprocess.Popen, line: str, running: Callable[[], list[str]],
             under_way: Callable[[], bool] | None = None, deadline_s: float = 240) -> list[str]:
    """Read the CLI's stderr until `line` shows (and then until `under_way()`), then SIGKILL that one
    process: what ran on the host for it at that moment (`running()`, asked while the stage was under way)."""
    seen: list[str] = []
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        text = proc.stderr.readline().decode(errors="replace")
        if not text:
            break
        seen.append(text.rstrip("\n"))
        if line in text:
            if under_way is not None:
                wait_until(under_way, 60, f"{line!r} under way", interval=0.005)
            there = running()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)
            return there
    proc.kill()
    proc.wait(timeout=10)
    pytest.fail(f"the CLI never said {line!r}: {seen[-20:]}")
    return []


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(STAGES))
def test_a_laptop_killed_in_a_stage_leaves_no_process_of_the_account_on_the_host(sshd, tmp_path, stage):
    """SIGKILL: nothing on the laptop runs again and the kernel closes its connection. What the host ran
    for it (the agent's server and its requests, a transfer's helper, git) ends; nothing waits forever on
    a link that is gone. The job here ends at once, so after a launch that made it nothing is legitimate."""
    job, line, holds = STAGES[stage]
    since = time.time() - 1  # the kernel's process start times are in ticks
    with throwaway_account(sshd) as (owner, home):
        uid = pwd.getpwnam(owner).pw_uid
        files = {".gitignore": "data/\n"}
        proj = _owned(sshd, owner, home / "thrust", tmp_path / "project", jobs=KILL_JOBS.format(big=BIG), files=files)
        if holds == "commit":
            (proj / "big.bin").write_bytes(os.urandom(BIG))
            git(proj, "-c", "core.compression=0", "add", "big.bin")
            git(proj, "-c", "core.compression=0", "commit", "-q", "-m", "a large file")
            git(proj, "config", "pack.compression", "0")  # the bundle: made at once, still long to send
        elif holds == "files":
            (proj / "data").mkdir()
            (proj / "data" / "big.bin").write_bytes(os.urandom(BIG))
        proc = subprocess.Popen([EXE, "train", job], cwd=proj, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
        try:
            # the fetch: killed once its transfer has begun (a part file here), not while it lists
            part = (lambda: any((proj / ".thrust" / "fetched").rglob(".*.part"))) if stage == "fetch" else None
            there = _kill_at(proc, line, lambda: _left(sshd, uid, since), part)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            proc.stderr.close()
        assert proc.returncode == -signal.SIGKILL
        assert there, "nothing of the account ran on the host when the CLI was killed"  # its connection at least
        try:
            wait_until(lambda: not _left(sshd, uid, since), GONE_S, f"the processes of {owner} on the host to end")
        except AssertionError:
            pytest.fail(f"killed at {line!r} (on the host then: {there}); left after {GONE_S:g} s: "
                        f"{_left(sshd, uid, since)}")
