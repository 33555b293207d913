"""Issue 56 item 5: `--set` passes a bare word (Hydra's `-m`) to a job of any flag style, a refused
`--set` shows an example written as the job takes its flags, and one `artifacts:` entry brings back
both of Hydra's layouts (`runs/` and, under `-m`, `multiruns/`). Real runs over the `sshd` host; the
argument assembly alone beside them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir

from thrust_remote.core.config import FlagsConfig, JobConfig
from thrust_remote.core.errors import UsageError
from thrust_remote.run import arguments

pytestmark = pytest.mark.xdist_group("test_bare_words")

# Hydra's way with its argv, as far as this test needs it: `-m`/`--multirun` anywhere but between two
# overrides (argparse's positional list), overrides `key=value`; a single run writes under runs/, a
# multirun one job per value under multiruns/
HYDRA_PY = '''\
import json
import os
import sys

argv = sys.argv[1:]
multirun = argv[:1] in (["-m"], ["--multirun"])
overrides = argv[1:] if multirun else argv
assert all("=" in word for word in overrides), f"unrecognized arguments: {argv}"
print("argv " + json.dumps(argv), flush=True)
values = dict(word.split("=", 1) for word in overrides)
if multirun:
    for n, lr in enumerate(values.get("lr", "0.1").split(",")):
        os.makedirs(f"logs/train/multiruns/day/{n}", exist_ok=True)
        with open(f"logs/train/multiruns/day/{n}/metrics.csv", "w") as fh:
            fh.write(f"lr,{lr}\\n")
else:
    os.makedirs("logs/train/runs/day", exist_ok=True)
    with open("logs/train/runs/day/metrics.csv", "w") as fh:
        fh.write(f"lr,{values.get('lr', '0.1')}\\n")
'''

JOBS = """\
jobs:
  hydra:
    command: [python, hydra_train.py]
    flags: {style: key=value}
    artifacts: ["logs/train/*runs/**"]
  listed:
    command: [python, hydra_train.py]
    flags: {style: key=value}
    artifacts: [logs/train/runs/**, logs/train/multiruns/**]
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> Path:
    workdir = remote_tempdir(sshd) / "bare"
    return new_project(tmp_path_factory.mktemp("bare") / "project", sshd, workdir,
                       files={"hydra_train.py": HYDRA_PY}, jobs=JOBS, message="a Hydra-like job")


def _run_id(text: str) -> str:
    return re.search(r"launching run (\S+)", text).group(1)  # type: ignore[union-attr]


def _artifacts(project: Path, run_id: str) -> set[str]:
    root = project / ".thrust" / "fetched" / run_id / "artifacts"
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("job", ["hydra", "listed"])
def test_hydras_multirun_flag_reaches_a_key_value_job_and_its_multiruns_come_back(cli, project, job):
    """`--set=-m` (and `--set --multirun`) is passed as it is, before the overrides; the job's
    multiruns/ tree is fetched by `logs/train/*runs/**` (no warning for the layout a run did not write)
    and by a list that names both layouts."""
    got = cli("train", job, "--set=-m", "--set", "lr=0.1,0.2", cwd=project)
    assert got.returncode == 0, got.stderr
    assert 'argv ["-m", "lr=0.1,0.2"]' in got.stdout, got.stdout
    run_id = _run_id(got.stdout + got.stderr)
    assert _artifacts(project, run_id) == {"logs/train/multiruns/day/0/metrics.csv",
                                           "logs/train/multiruns/day/1/metrics.csv"}, got.stderr
    single = cli("train", job, "--set", "lr=0.3", cwd=project)
    assert single.returncode == 0, single.stderr
    assert _artifacts(project, _run_id(single.stdout + single.stderr)) == {"logs/train/runs/day/metrics.csv"}
    if job == "hydra":  # one glob for both layouts: nothing to warn of when a run wrote only one
        assert "matches nothing" not in single.stderr + got.stderr, single.stderr + got.stderr
    long = cli("train", job, "--set", "--multirun", "--set", "lr=0.4", cwd=project)
    assert long.returncode == 0 and 'argv ["--multirun", "lr=0.4"]' in long.stdout, long.stdout + long.stderr


def test_a_refused_set_shows_an_example_in_the_jobs_own_style(cli, project):
    """A `--set` that is no KEY=VALUE, KEY or bare word: 64, an example the Hydra job takes
    (learning_rate=0.1, never the trainer's total-steps), and the bare-word form; nothing connects."""
    got = cli("train", "hydra", "--set", "bad key=1", cwd=project)
    assert got.returncode == 64, got.stderr
    assert "the job gets learning_rate=0.1" in got.stderr and "--set=-m" in got.stderr, got.stderr
    assert "total-steps" not in got.stderr and "Traceback" not in got.stderr, got.stderr


def _job(style: str) -> JobConfig:
    return JobConfig(name="own", kind="python", script="t.py", args={"lr": 0.1}, flags=FlagsConfig(style=style))


@pytest.mark.parametrize(("style", "expected"), [
    ("key=value", ["-m", "lr=0.1", "seed=1"]),
    ("--key value", ["-m", "--lr", "0.1", "--seed", "1"]),
    ("--key=value", ["-m", "--lr=0.1", "--seed=1"]),
    ("-k value", ["-m", "-lr", "0.1", "-seed", "1"]),
])
def test_a_bare_word_comes_first_as_it_is_in_every_style(style, expected):
    job = _job(style)
    assert arguments.job_arguments(job, arguments.parse_sets(["seed=1", "-m"], job), {}) == expected
    listed = JobConfig(name="own", kind="command", command=("python", "t.py"), args=("a=1",),
                       flags=FlagsConfig(style=style))
    assert arguments.job_arguments(listed, arguments.parse_sets(["--cfg"], listed), {})[:2] == ["--cfg", "a=1"]


def test_the_trainer_takes_a_dashed_set_as_its_switch_and_refuses_a_word_it_lacks():
    trainer = JobConfig(name="snake")
    assert arguments.job_arguments(trainer, arguments.parse_sets(["--tensorboard"]), {}) == ["--tensorboard", "true"]
    with pytest.raises(UsageError, match="not a trainer flag"):
        arguments.check_trainer_args(trainer, arguments.parse_sets(["-m"]), {})
    with pytest.raises(UsageError, match="KEY like total-steps"):
        arguments.parse_sets(["bad key=1"], trainer)


def test_a_bare_word_is_a_plain_word_only():
    """A bare word is `-` then a name: `-m;rm` or `-x=1` is refused as before."""
    for item in ("-m;rm", "-x=1", "--"):
        with pytest.raises(UsageError):
            arguments.parse_sets([item], _job("key=value"))
    assert json.dumps(arguments.parse_sets(["-m", "--multirun"])) == '{"-m": true, "--multirun": true}'
