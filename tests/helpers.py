"""Plain helpers the test modules share (fixtures live in conftest.py): paths, git projects, waiting on
a condition, a user's own training script, an exported policy.

- `git(cwd, *args)`: run git there; its stdout, stripped. `git_init`, `commit`: a repository and a commit.
- `clone_repo(dest)`: a clone of this repository (the laptop's project); `sandbox_clone` adds a committed
  thrust.yaml for the sshd fixture's host `sandbox`.
- `new_project(path, sshd, workdir, ...)`: a git project that is not this repository (its own files, a
  thrust.yaml for `sandbox`, all committed); `remote_tempdir(sshd)`: a fresh directory on that host;
  `run_tree(workdir, run_id)`: a run's own tree there; `throwaway_account(sshd)`: a real non-root account
  it can log in as, `as_account(name, *argv)`: a command run as one.
- `wait_until(condition, timeout, what)`: poll a condition with a deadline instead of sleeping.
- `TRAIN_PY`: a user's own DDP-aware train.py; `export_policy(path)`: an untrained policy as ONNX.
- `FAST`, `TINY_TRAIN`, `SLOW`: `train cartpole` settings; `EXE`: the installed CLI; `CHROMIUM`.
- `FAKE_JOB`, `FAKE_FAST`, `FAKE_SLOW`, `FAKE_LONG`, `fake_files()`: a job that runs tests/fake_train.py;
  `FAKE_SEARCH` an optimize search over it.
- `GATED_SETUP`: a job whose `setup:` waits for a file the test creates (a tree held in set-up), and a quick one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import psutil
    from conftest import SSHServer

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
EXE = str(Path(sys.executable).parent / "thrust-remote")
CHROMIUM = Path("/usr/bin/chromium")
# `train cartpole` settings, none stopping early on solving. FAST: a run of a few seconds; TINY_TRAIN: the
# least that still trains (a fresh venv's first run pays its setup on top).
FAST = ["--set", "total-steps=6000", "--set", "target-return=0", "--set", "log-interval=0.2"]
TINY_TRAIN = ["--set", "total-steps=2048", "--set", "target-return=0", "--set", "log-interval=0.2"]
# A run long enough to still be running when a test detaches, follows again or cuts the link.
SLOW = ["--set", "total-steps=60000", "--set", "target-return=0", "--set", "log-interval=0.1"]

# A job whose run is tests/fake_train.py: the trainer's progress lines and a small real ONNX model, with no
# torch (for tests about what happens around a run: docs/architecture.md, "Tests"). In a clone of this
# repository the script is there; `fake_files()` puts it (and tiny_onnx.py, which it imports) in a project
# of a test's own. FAKE_FAST ends in a fraction of a second, FAKE_SLOW runs long enough to be cut or
# reattached, FAKE_LONG until it is stopped.
FAKE_JOB = ("  fake:\n    script: tests/fake_train.py\n    export: web/public/fake.onnx\n"
            "    objective: {metric: return_mean, mode: max}\n")
# optimize's search over the fake job: its reported return is the parameter, so the best trial is known
FAKE_SEARCH = "search:\n  fake:\n    return: {low: 0.0, high: 100.0}\n"
FAKE_FAST = ["--set", "seconds=0.3"]
FAKE_SLOW = ["--set", "seconds=4"]
FAKE_LONG = ["--set", "seconds=3600"]


def fake_files() -> dict[str, str]:
    """tests/fake_train.py and the tests/tiny_onnx.py it imports, for `new_project(files=...)`."""
    here = Path(__file__).resolve().parent
    return {f"tests/{name}": (here / name).read_text() for name in ("fake_train.py", "tiny_onnx.py")}


# ------------------------------------------------------------------------------------------ git


def git(cwd: Path, *args: str) -> str:
    """`git -C cwd ARGS`; its stdout, stripped. A failing git raises (CalledProcessError)."""
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def git_init(path: Path, *, identity: bool = True) -> Path:
    """A git repository at `path` (made when missing), resolved. `identity`: a committer of its own, so a
    commit works on a machine without a global git identity."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    if identity:
        git(path, "config", "user.email", "t@example.com")
        git(path, "config", "user.name", "t")
    return path.resolve()


def commit(path: Path, message: str, *paths: str) -> None:
    """Stage `paths` (every change when none are named) and commit them."""
    git(path, "add", *(paths or ("-A",)))
    git(path, "commit", "-q", "-m", message)


def clone_repo(dest: Path, *, plain: bool = False) -> Path:
    """A clone of this repository at its HEAD: the laptop's project (the trainer is there).

    By default it is a user's checkout: a committer identity, and no origin (the host gets the commit
    from a bundle). `plain`: `git clone` alone, origin kept and no identity (the tests that never commit
    in it: optimize's studies, the local follow view)."""
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(dest)], check=True)
    if not plain:
        git(dest, "config", "user.email", "t@example.com")
        git(dest, "config", "user.name", "t")
        git(dest, "remote", "remove", "origin")
    return dest


def sandbox_clone(dest: Path, sshd: SSHServer, workdir: Path) -> Path:
    """`clone_repo(dest)` with a committed thrust.yaml whose default host is the sshd's `sandbox`, and job
    `fake` (FAKE_JOB) beside the built-in ones."""
    clone_repo(dest)
    sshd.thrust_yaml(dest / "thrust.yaml", workdir=str(workdir), rest="jobs:\n" + FAKE_JOB)
    commit(dest, "thrust.yaml for the test host", "thrust.yaml")
    return dest


# ------------------------------------------------------------------------------------------ own projects


@contextlib.contextmanager
def throwaway_account(sshd: SSHServer) -> Iterator[tuple[str, Path]]:
    """A system account of its own (removed after; a home in a temporary directory) the sshd can log in
    as, with the sshd's client key: root ignores file modes, so what another account may or may not
    read needs real accounts. Skips where accounts cannot be made (not root, no useradd)."""
    import pytest

    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd to make a throwaway non-root account (root reads every file)")
    name = f"thrt{secrets.token_hex(4)}"  # its own each time: a session still ending may hold the last one
    home = Path(tempfile.mkdtemp(prefix="thrust-account-"))
    made = subprocess.run(["useradd", "--system", "-d", str(home), "-s", "/bin/sh", "-p", "*", name],
                          capture_output=True, text=True)
    if made.returncode != 0:  # root with useradd: an account must be possible, never a silent skip
        shutil.rmtree(home, ignore_errors=True)
        pytest.fail(f"useradd failed: {made.stderr.strip()}")
    # sshd reads authorized_keys as the account logging in: let it reach the session's (a public key)
    keys = sshd.root / "authorized_keys"
    modes = sshd.root.stat().st_mode & 0o777, keys.stat().st_mode & 0o777
    try:
        shutil.chown(home, name, name)
        home.chmod(0o755)  # a home others may enter, as many are: what the workdir's own modes must guard
        sshd.root.chmod(modes[0] | 0o011)
        keys.chmod(0o644)
        yield name, home
    finally:
        sshd.root.chmod(modes[0])
        keys.chmod(modes[1])
        subprocess.run(["userdel", "--force", name], capture_output=True)  # even with a session ending
        shutil.rmtree(home, ignore_errors=True)


def as_account(name: str, *argv: str) -> subprocess.CompletedProcess:
    """`argv` run as the account `name` (setpriv: no login shell, no PAM), its output as text."""
    return subprocess.run(["setpriv", f"--reuid={name}", f"--regid={name}", "--init-groups", "--", *argv],
                          capture_output=True, text=True, timeout=60)


def run_tree(workdir: Path, run_id: str) -> Path:
    """Where a run's own tree is on the host: `<workdir>/.thrust/trees/<run id>` (docs/architecture.md,
    "Trees"); the run's cwd (a cargo job's: its crate in there)."""
    return workdir / ".thrust" / "trees" / run_id


def sync_tree(session, local, name: str):  # noqa: ANN001, ANN201 - a HostSession, a LocalState; (SyncResult, Path)
    """`train`'s two steps on their own: the commit's objects into the host's store, then a tree of its
    own named `name` (sync.sync, sync.make_tree); the SyncResult and the tree's path."""
    from thrust_remote.run.sync import make_tree, sync, with_lfs

    local = with_lfs(local)
    result = sync(session, local)
    tree = make_tree(session, local, result, session.paths.tree(name), ref=name)
    return result, Path(tree.path)


def remote_tempdir(sshd: SSHServer, prefix: str = "remote-") -> Path:
    """A fresh directory on the sshd's host side (tests look into it only to check what happened)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=sshd.root / "remote-home"))


def new_project(path: Path, sshd: SSHServer, workdir: Path, *, files: Mapping[str, str] | None = None,
                jobs: str = "", python: Path | None = None,
                message: str = "a project with only a thrust.yaml") -> Path:
    """A new git project that is not this repository: `files` (relative path -> text) and a thrust.yaml for
    the sshd's `sandbox` host (workdir `workdir`, `python` in place of the sshd's, then `jobs`), committed."""
    path.mkdir(parents=True)
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    config = sshd.thrust_yaml(path / "thrust.yaml", workdir=str(workdir), rest=jobs)
    if python is not None:
        default = sshd.host_config().python
        config.write_text(config.read_text().replace(f"python: {default}", f"python: {python}"))
    git_init(path)
    commit(path, message)
    return path


# A user's own DDP-aware training script (torch and the standard library only): it writes what it saw
# (argv, cwd, the run's env, the world size) to $THRUST_RUN_DIR/seen-<tag>-<rank>.json.
TRAIN_PY = '''\
"""A user's own DDP-aware training script: torch and the standard library only."""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

NAMES = ("THRUST_RUN_ID", "THRUST_RUN_DIR", "THRUST_EXPORT", "THRUST_PYTHON", "CUDA_VISIBLE_DEVICES",
         "GPU_LIST", "WORLD_SIZE", "RANK", "LOCAL_RANK")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--tag", default="script")
    args = parser.parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo")
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=args.lr)
    for step in range(1, args.steps + 1):
        loss = (w - 1.0).pow(2).sum()
        opt.zero_grad()
        loss.backward()
        if world > 1:
            dist.all_reduce(w.grad)
            w.grad /= world
        opt.step()
        if rank == 0:
            print("THRUST_METRICS " + json.dumps({"step": step, "loss": loss.item()}), flush=True)
    ranks = torch.ones(1)
    if world > 1:
        dist.all_reduce(ranks)
        dist.barrier()  # no rank tears gloo down while a peer's last bytes are in flight
        dist.destroy_process_group()
    seen = {"argv": sys.argv[1:], "tag": args.tag, "ranks": ranks.item(), "cwd": os.getcwd(),
            "env": {k: os.environ.get(k) for k in NAMES}}
    with open(os.path.join(os.environ["THRUST_RUN_DIR"], f"seen-{args.tag}-{rank}.json"), "w") as fh:
        json.dump(seen, fh)


if __name__ == "__main__":
    main()
    # Skip interpreter teardown, as the README's troubleshooting advises for DDP on CPU: with an optimizer
    # made, gloo's worker threads outlive destroy_process_group, and one dropping its last work while Python
    # shuts down aborts the rank (SIGABRT) after the script has finished.
    sys.stdout.flush()
    os._exit(0)
'''


# ------------------------------------------------------------------------------------------ waiting


class Clock:
    """A clock of a test's own for code that takes `clock=` and `sleep=`: sleeping moves it on, at once."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def wait_until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `condition` until it returns something truthy, and return that; fail naming `what` once
    `timeout` seconds pass. A test waits exactly as long as the thing takes, never a guessed delay.

    A condition that costs time (a CLI call: a connection and a request) waits twice its own cost
    between polls: polled back to back it took most of a core from the run it waited for (the suite is
    CPU-bound beside three other workers), and every run it watched was slower for it."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        value = condition()
        if value:
            return value
        now = time.monotonic()
        if now >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(min(max(interval, 2 * (now - asked)), max(0.0, deadline - now)))


def ended(proc: int | psutil.Process) -> bool:
    """A process (or pid) gone or a zombie (ended, its parent has not reaped it yet). psutil reads a
    process's state file by file, so one that ends between two reads raises NoSuchProcess: ended too."""
    import psutil

    try:
        proc = proc if isinstance(proc, psutil.Process) else psutil.Process(proc)
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ------------------------------------------------------------------------------------------ models


def export_policy(
    path: Path, grid_size: int = 10, kind: str = "mlp", hidden: int = 32, seed: int = 0, space: bool = False,
    mask: bool = False,
) -> Path:
    """An untrained trainer/policy.py policy through trainer/export.py (the real pipeline), with its
    manifest renamed to the web/public layout `<job>.json`. Returns the manifest path. `mask`: deadly
    moves masked (`--mask 1`), with the actor biased towards "straight" so that the mask has work."""
    import torch

    from trainer.envs.snake import danger_at, obs_size
    from trainer.export import export_onnx
    from trainer.policy import build_policy

    torch.manual_seed(seed)
    assert obs_size(grid_size) == 3 * grid_size * grid_size + 8  # docs/snake.md, written out
    policy = build_policy(kind, obs_size(grid_size, space), 3, hidden, grid_size=grid_size,
                          mask_at=danger_at(grid_size) if mask else None)
    if mask:
        with torch.no_grad():
            policy.actor[-1].bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    export_onnx(policy, path, env_name="snake", grid_size=grid_size, action_mode="relative", policy_kind=kind,
                space=space)
    manifest = path.with_suffix(".json")
    (path.parent / "manifest.json").replace(manifest)
    return manifest


def gpu_shim(tmp_path: Path) -> dict[str, str]:
    """The environment of a host with four GPUs, here where there is none: a small program named
    nvidia-smi, first on PATH, prints the output recorded on a real 4 x A100 host (tests/data/nvidia_smi)."""
    data = Path(__file__).parent / "data" / "nvidia_smi"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ncase "$1" in -L|"") cat {data / "a100_four_gpus.list"};; '
                   f'*) cat {data / "a100_four_gpus.csv"};; esac\n')
    smi.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}


# A job whose `setup:` waits until the test creates the file GATE (it touches GATE.waiting first), and one
# that ends at once: a tree held in set-up while prune or another launch's keep: looks at it.
GATED_SETUP = """\
jobs:
  gated:
    kind: command
    command: [sh, -c, 'echo ran > "$THRUST_RUN_DIR/seen"']
    env: {{GATE: {gate}}}
    setup: [sh, -c, 'touch "$GATE.waiting"; while [ ! -e "$GATE" ]; do sleep 0.05; done; echo ok > made.txt']
  quick:
    kind: command
    command: [sh, -c, 'true']
"""
