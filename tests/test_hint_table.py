"""Every hint the tool prints after an ending or an error, followed as printed (issue 53): each row makes
a scenario over the suite's sshd host (or `local`) that ends in an error or an end other than FINISHED,
reads every `thrust-remote ...` command its output names (parsed from the text, never a copy of the
hint), runs each as a user who pasted it would (shlex.split, the same cwd and environment) and asserts the
exit code that hint implies: 0, or the job's own failure for a hint that runs it again, or doctor's 1 for
a host it finds wrong. tests/test_hints_followed.py follows three more (a failed import, a failed setup,
the flag style) with their own asserts."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import Cli, SSHServer
from helpers import new_project, remote_tempdir, run_tree, wait_until

PROG = "thrust-remote"
WIDE = {"COLUMNS": "1000"}  # one hint on one line, as a terminal this wide shows it
# where a hint's command ends inside a sentence: "..., or", "...; then", "(...)", "`...`"
STOPS = ",;()`"

CKPT_PY = '''\
import os, sys, time
# a run given no checkpoint writes one and dies (3); continued from it, it finishes
if any(a.startswith("--resume_from=") for a in sys.argv[1:]):
    print("resumed: loss 0.5", flush=True)
    sys.exit(0)
os.makedirs("out", exist_ok=True)
with open("out/ckpt-1.pt", "w") as f:
    f.write("step 1")
print("step 1: loss 1.0", flush=True)
if "--sleep" in sys.argv:  # a run that goes on until it is stopped
    time.sleep(600)
sys.exit(3)
'''

NAP_PY = '''\
import sys, time
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 4)
print("napped", flush=True)
'''

JOBS = """\
jobs:
  broken:
    script: broken.py
    checkpoints: out/ckpt-*.pt
    resume: ["--resume_from={checkpoint}"]
  ckpt:
    script: ckpt.py
    checkpoints: out/ckpt-*.pt
    resume: ["--resume_from={checkpoint}"]
  nap:
    script: nap.py
    args: ["4"]
  long:
    script: nap.py
    args: ["600"]
    checkpoints: out/ckpt-*.pt
    resume: ["--resume_from={checkpoint}"]
  stoppable:
    script: ckpt.py
    args: ["--sleep"]
    checkpoints: out/ckpt-*.pt
    resume: ["--resume_from={checkpoint}"]
  failing_setup:
    script: nap.py
    # the setup's own failure (3) when run as the setup ran it, in the job's venv; 5 by another python
    setup: [python, -c, "import sys; sys.exit(3 if sys.prefix != sys.base_prefix else 5)"]
  tune_a:
    script: score.py
    objective: {metric: score, mode: max}
  tune_b:
    script: score.py
    objective: {metric: score, mode: max}
  shakespeare:
    script: nano.py
    flags: {style: "--key=value"}
    checkpoints: out/ckpt.pt
    resume: {args: [--init_from=resume], checkpoint_at: out/ckpt.pt}
  zoo:
    script: zoo.py
search:
  tune_a: {lr: {choices: [0.1, 0.3]}}
  tune_b: {lr: {choices: [0.1, 0.3]}}
"""

SCORE_PY = '''\
import argparse, json
parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, required=True)
print("THRUST_METRICS " + json.dumps({"step": 1, "score": parser.parse_args().lr}), flush=True)
'''

# nanoGPT's configurator as it is (--key=value only; a key its config lacks is a ValueError), run by exec()
NANO_CONFIGURATOR = '''\
import sys
from ast import literal_eval
for arg in sys.argv[1:]:
    assert arg.startswith("--") and "=" in arg
    key, val = arg.split("=")
    key = key[2:]
    if key in globals():
        globals()[key] = literal_eval(val)
    else:
        raise ValueError(f"Unknown config key: {key}")
'''
NANO_PY = '''\
max_iters = 5
exec(open("configurator.py").read())
print(f"iter {max_iters}: loss 1.0", flush=True)
'''

# rl-baselines3-zoo's parser as it is: dashed long flags, some behind a short one (`-n N_TIMESTEPS` in its usage)
ZOO_PY = '''\
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--algo", default="ppo", choices=["a2c", "ppo"])
parser.add_argument("--env", default="CartPole-v1")
parser.add_argument("-tb", "--tensorboard-log", default="")
parser.add_argument("-n", "--n-timesteps", default=-1, type=int)
parser.add_argument("--num-threads", default=-1, type=int)
parser.add_argument("--eval-freq", default=25000, type=int)
parser.add_argument("-f", "--log-folder", default="logs")
parser.add_argument("--hyperparams", nargs="+")
print("timesteps", parser.parse_args().n_timesteps, flush=True)
'''

FILES = {"broken.py": "import no_such_module_here  # noqa\n", "ckpt.py": CKPT_PY, "nap.py": NAP_PY,
         "score.py": SCORE_PY, "nano.py": NANO_PY, "configurator.py": NANO_CONFIGURATOR, "zoo.py": ZOO_PY}


@dataclass
class World:
    """What a row's scenario acts in: one project over the sshd, shared by the rows of this module."""
    cli: Cli
    sshd: SSHServer
    project: Path
    workdir: Path
    scratch: Path

    def __call__(self, *args: str, cwd: Path | None = None) -> object:
        return self.cli(*args, cwd=cwd or self.project, env=WIDE)


@pytest.fixture(scope="module")
def world(sshd: SSHServer, tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("hints")
    workdir = remote_tempdir(sshd) / "w"
    project = new_project(root / "project", sshd, workdir, files=FILES, jobs=JOBS)
    return World(Cli(), sshd, project, workdir, root)


def hinted_commands(text: str) -> list[list[str]]:
    """Every `thrust-remote ...` command the text names, as a shell splits it once pasted: a command ends
    at the end of its line or at a `,` `;` `(` `)` or backtick outside quotes (the sentence goes on)."""
    found: list[list[str]] = []
    for line in text.splitlines():
        at = line.find(PROG + " ")
        while at != -1:
            if at == 0 or not (line[at - 1].isalnum() or line[at - 1] in "-_/"):
                end, quote = at, ""
                while end < len(line) and (quote or line[end] not in STOPS):
                    quote = ("" if line[end] == quote else quote) if quote else \
                        (line[end] if line[end] in "'\"" else "")
                    end += 1
                words = shlex.split(line[at:end].rstrip().removesuffix("."))
                if words not in found:
                    found.append(words)
            at = line.find(PROG + " ", at + 1)
    return found


def test_the_hint_reader_ends_a_command_where_its_sentence_goes_on() -> None:
    text = ("hint: check with: thrust-remote status r1 --host h, then thrust-remote logs r1 --follow --host h\n"
            "next: thrust-remote exec --host h -- sh -c 'ls; echo a,b' (as the setup ran)\n"
            "run `thrust-remote prune --dry-run --host h` first.\n")
    assert hinted_commands(text) == [
        ["thrust-remote", "status", "r1", "--host", "h"],
        ["thrust-remote", "logs", "r1", "--follow", "--host", "h"],
        ["thrust-remote", "exec", "--host", "h", "--", "sh", "-c", "ls; echo a,b"],
        ["thrust-remote", "prune", "--dry-run", "--host", "h"],
    ]


def _subcommand(words: list[str]) -> str:
    """The subcommand a hint runs: its first word after the global options (`--config PATH`)."""
    rest = words[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] in ("--config",) else rest[1:]
    return rest[0]


@dataclass(frozen=True)
class Row:
    """A scenario (`make`, run in the shared world, returns the failing command's result), the exit code
    that command ends with, and the code each hint it prints implies, by subcommand (0 unless named)."""
    make: Callable[[World], object]
    code: int
    implies: dict[str, int] = field(default_factory=dict)
    also: Callable[[list[list[str]]], None] | None = None  # more to check of the commands printed
    slow: bool = False  # a run followed to its end, then its hint's own run: ~8-12 s
    says: tuple[str, ...] = ()  # what its output must say, in these words
    never: tuple[str, ...] = ()  # and what it must not (a hint that would mislead)


def _runs_one_own_trial(commands: list[list[str]]) -> None:
    """optimize's example names a job of the project's `search:` and the --trials the user gave: pasted,
    it runs one short trial, not twenty of the built-in trainer."""
    assert [words[2:5] for words in commands] == [["tune_a", "--trials", "1"]], commands


def _with_the_name_the_script_sets(commands: list[list[str]]) -> None:
    """The hint after a misspelt name the job refused is the train command with the name its script sets."""
    assert [words[1:5] for words in commands] == [["train", "shakespeare", "--set", "max_iters=10"]], commands


def _without_the_refused_key(commands: list[list[str]]) -> None:
    """With no name close to it in the script: the train command without it, never the same command."""
    assert [words[1:] for words in commands] == [["train", "shakespeare", "--host", "sandbox"]], commands


def _with_the_dashed_name(commands: list[list[str]]) -> None:
    """The hint after argparse refused `--n_timesteps` gives the name as the job spells it: n-timesteps."""
    assert [words[1:5] for words in commands] == [["train", "zoo", "--set", "n-timesteps=512"]], commands


def _train(*args: str) -> Callable[[World], object]:
    return lambda w: w("train", *args)


def _launched(w: World, job: str, *args: str) -> str:
    """A run of `job` started detached: its id."""
    started = w("train", job, "--detach", *args)
    assert started.returncode == 0, started.stderr
    return re.search(r"launching run (\S+)", started.stderr).group(1)


def _ended(w: World, job: str, *args: str) -> str:
    """A run of `job` followed to its end (FAILED or FINISHED): its id."""
    ended = w("train", job, "--no-fetch", *args)
    return re.search(r"launching run (\S+)", ended.stderr).group(1)


def _wait_timeout(w: World) -> object:
    return w("wait", _launched(w, "nap"), "--timeout", "0.5")


def _stopped(w: World) -> object:
    """A run stopped once its checkpoint is written, then waited for: its end names `resume`."""
    run_id = _launched(w, "stoppable")
    ckpt = run_tree(Path(w.workdir), run_id) / "out" / "ckpt-1.pt"
    wait_until(ckpt.exists, 60, "the run's checkpoint")
    stopped = w("stop", run_id)
    assert stopped.returncode == 0, stopped.stderr
    return w("watch", run_id)


def _other_config(w: World, name: str, **fields: str) -> Path:
    """A config file beside thrust.yaml whose sandbox host has `fields` in place of its own."""
    text = (w.project / "thrust.yaml").read_text()
    for key, value in fields.items():
        text = re.sub(rf"(\n    {key}: )\S+", rf"\g<1>{value}", text)
    path = w.project / name
    path.write_text(text)
    return path


def _resume_while_running(w: World) -> object:
    """`resume` of a run still going: its hint is to stop it first (and following it ends the run)."""
    return w("resume", _launched(w, "long"))


def _unfetched_board(w: World) -> object:
    """`tensorboard` of a run on `local` (not the default host) whose artifacts were not fetched."""
    return w("tensorboard", _ended(w, "ckpt", "--host", "local"))


def _detached_by_ctrl_c(w: World) -> object:
    """`train nap` in a process of its own, Ctrl-C (SIGINT to the pid started here) once it follows: it
    detaches (75) and says how to reattach."""
    env = w.cli._env(WIDE)
    child = subprocess.Popen([w.cli.exe, "train", "nap", "--no-fetch"], cwd=w.project, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said = []
        for line in child.stderr:
            said.append(line)
            if line.startswith("following "):
                child.send_signal(signal.SIGINT)
                break
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    return subprocess.CompletedProcess(child.args, child.returncode, out, "".join(said) + err)


ROWS: dict[str, Row] = {
    "FAILED-with-a-pulled-checkpoint:resume": Row(_train("ckpt"), 3, slow=True),
    "FAILED-at-import:train-again": Row(_train("broken", "--set", "lr=0.1"), 1, {"train": 1}, slow=True),
    "setup-failed:exec-as-the-setup-ran": Row(_train("failing_setup"), 1, {"exec": 3}),
    "status-of-an-unknown-run": Row(lambda w: w("status", "no-such-run-1"), 64),
    "logs-of-an-unknown-run": Row(lambda w: w("logs", "no-such-run-1"), 64),
    "optimize-without-a-job": Row(lambda w: w("optimize", "--trials", "1"), 64,
                                     also=_runs_one_own_trial, slow=True),
    "wait-timeout:wait-again": Row(_wait_timeout, 75, slow=True),
    "STOPPED-with-a-checkpoint:resume": Row(_stopped, 143, slow=True),
    # the job fails again (1) when its hint is to run it again; a fetch's is 0
    "resume-without-a-checkpoint": Row(lambda w: w("resume", _ended(w, "broken")), 64, {"train": 1}),
    "missing-python": Row(lambda w: w("--config", str(_other_config(w, "nopy.yaml", python="/no/such/python3")),
                                      "train", "nap"), 69, {"doctor": 1}),  # doctor finds it wrong
    "doctor-of-a-missing-python": Row(
        lambda w: w("--config", str(_other_config(w, "nopy.yaml", python="/no/such/python3")), "doctor"), 69),
    "local-FAILED-at-import:train-again": Row(_train("broken", "--host", "local"), 1, {"train": 1}, slow=True),
    "resume-of-a-running-run:stop-it-first": Row(_resume_while_running, 64),
    "tensorboard-of-an-unfetched-run-on-local:fetch": Row(_unfetched_board, 64),
    "logs-of-an-unknown-run-under---config": Row(
        lambda w: w("--config", str(_other_config(w, "other.yaml")), "logs", "no-such-run-2"), 64),
    "detached-by-ctrl-c:reattach": Row(_detached_by_ctrl_c, 75, slow=True),
    # found trying nanoGPT and rl-baselines3-zoo as a new user (issue 53): a name the job refused
    "refused-config-key:the-name-its-script-sets": Row(
        _train("shakespeare", "--set", "max_iter=10"), 1, also=_with_the_name_the_script_sets, slow=True,
        says=("the job refused max_iter (--set max_iter=10), saying: ValueError: Unknown config key: max_iter",
              "did you mean max_iters (nano.py has max_iters)?")),
    "refused-config-key:train-without-it": Row(
        _train("shakespeare", "--set", "warmup=5"), 1, also=_without_the_refused_key, slow=True,
        says=("the job refused warmup (--set warmup=5), saying: ValueError: Unknown config key: warmup",
              "warmup is not a name the job knows (check its spelling); without it: ")),
    "argparse-refused-an-underscored-flag:dashes": Row(
        _train("zoo", "--set", "n_timesteps=512"), 2, also=_with_the_dashed_name, slow=True,
        says=("the job refused --n_timesteps (--set n_timesteps=512), saying: ",
              "error: unrecognized arguments: --n_timesteps 512", "written with dashes (-n N_TIMESTEPS)",
              "flags: {names: dashes}"),
        never=("flags: {style",)),
}


@pytest.mark.parametrize("row", [pytest.param(row, id=name, marks=[pytest.mark.slow] if row.slow else [])
                                 for name, row in ROWS.items()])
def test_every_hint_works_as_printed(world: World, row: Row) -> None:
    ended = row.make(world)
    said = ended.stdout + ended.stderr
    assert ended.returncode == row.code, said
    for words in row.says:
        assert words in said, said
    for words in row.never:
        assert words not in said, said
    commands = hinted_commands(said)
    assert commands, f"no thrust-remote command in:\n{said}"
    if row.also is not None:
        row.also(commands)
    for words in commands:
        followed = world.cli(*words[1:], cwd=world.project, env=WIDE)
        want = row.implies.get(_subcommand(words), 0)
        assert followed.returncode == want, (shlex.join(words), followed.stdout, followed.stderr)
