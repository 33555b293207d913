"""The idle-GPU stop (`idle_stop: {below, minutes, every}`): the run's own supervisor samples its GPUs
and stops a run whose GPUs stay below the threshold that long: STOPPED, reason `idle`, said by status.

There is no GPU here: a small program named nvidia-smi, first on PATH, prints the inventory recorded
on a real 4 x A100 host (tests/data/nvidia_smi) and, for the utilization query, what this test writes
in a file (the utilization a real one would report); it counts the queries so the test waits for the
samples, not for a time. The runs are real runs on the `local` host."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import commit, git_init, wait_until

from thrust_remote.core.config import load_config
from thrust_remote.core.errors import ConfigError

DATA = Path(__file__).parent / "data" / "nvidia_smi"

JOBS = """\
jobs:
  waits:
    command: [sh, -c, 'while [ ! -e "$THRUST_RUN_DIR/go" ]; do sleep 0.1; done']
    idle_stop: {below: 5, minutes: 0.02, every: 0.2}
"""


def _gpu_host(tmp_path: Path) -> tuple[dict[str, str], Path, Path]:
    """(env with the stand-in nvidia-smi on PATH, the utilization file, the query count file)."""
    bindir, util, count = tmp_path / "bin", tmp_path / "util.txt", tmp_path / "queries.txt"
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --query-gpu=index,utilization.gpu) echo q >> {count}; cat {util};; '
        f'-L|"") cat {DATA / "a100_four_gpus.list"};; *) cat {DATA / "a100_four_gpus.csv"};; esac\n')
    smi.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}"}, util, count


def _status(cli, proj: Path, run_id: str, env: dict[str, str]) -> dict:
    return json.loads(cli("status", run_id, "--host", "local", "--json", cwd=proj, env=env).stdout)


@pytest.mark.slow
def test_a_run_whose_gpus_stay_idle_is_stopped_with_reason_idle(cli, tmp_path):
    env, util, count = _gpu_host(tmp_path)
    util.write_text("".join(f"{i}, 90\n" for i in range(4)))  # busy
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(JOBS)
    commit(proj, "a job that waits")
    started = cli("train", "waits", "--host", "local", "--gpus", "0,1", "--detach", cwd=proj, env=env)
    assert started.returncode == 0, started.stderr
    run_id = re.search(r"launching run (\S+)", started.stderr).group(1)
    # busy GPUs: sample after sample (well past `minutes`), the run goes on
    wait_until(lambda: count.exists() and len(count.read_text().split()) >= 12, 60, "12 utilization samples")
    assert _status(cli, proj, run_id, env)["state"] == "RUNNING"
    # its two GPUs idle (the others busy: not the run's), and it is stopped
    util.write_text("0, 1\n1, 0\n2, 90\n3, 90\n")
    wait_until(lambda: _status(cli, proj, run_id, env)["state"] != "RUNNING", 60, "the idle stop")
    st = _status(cli, proj, run_id, env)
    assert st["state"] == "STOPPED" and st["reason"] == "idle", st
    assert "GPUs 0,1 below 5% for 0.02 min" in st["reason_detail"]
    said = cli("status", run_id, "--host", "local", cwd=proj, env=env).stdout
    assert "STOPPED" in said and "[idle: GPUs 0,1 below 5%" in said
    assert "idle_stop" not in started.stderr  # GPUs to watch: nothing to warn about


def test_an_idle_stop_on_a_host_without_gpus_is_said_to_do_nothing(cli, tmp_path):
    """This machine has no nvidia-smi: the run starts, with a warning that idle_stop can never stop it."""
    proj = git_init(tmp_path / "p")
    (proj / "thrust.yaml").write_text(JOBS)
    commit(proj, "a job that waits")
    started = cli("train", "waits", "--host", "local", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    assert "idle_stop: local has no GPUs that nvidia-smi lists: it watches GPUs, so it will never stop this run" \
        in started.stderr
    run_id = re.search(r"launching run (\S+)", started.stderr).group(1)
    (proj / ".thrust" / "runs" / run_id / "go").touch()
    assert cli("wait", run_id, "--host", "local", "--timeout", "60", cwd=proj).returncode == 0


@pytest.mark.parametrize(("text", "words"), [
    ("{below: 150, minutes: 10}", "jobs.j.idle_stop.below: expected a number in (0, 100]"),
    ("{below: 5}", "jobs.j.idle_stop.minutes: missing"),
    ("{below: 5, minutes: 10, when: never}", "unknown key"),
])
def test_a_bad_idle_stop_is_78_with_its_line(tmp_path, text, words):
    path = tmp_path / "thrust.yaml"
    path.write_text(f"jobs:\n  j:\n    command: [x]\n    idle_stop: {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.message.startswith(f"{path}:4: ") and words in info.value.message
