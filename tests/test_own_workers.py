"""Scripts that start their own workers (issue 53 item 2), over a real sshd: `workers: {count: FLAG,
port: FLAG}` runs a torch.multiprocessing.spawn script once with the count it is given, never under
torchrun, its gloo workers meeting on a port free on the host; the same script without `workers:` is
refused before anything is sent, naming the `workers:` line to add."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir

from thrust_remote.agent.protocol import FREE_PORT
from thrust_remote.core.config import load_config
from thrust_remote.core.config.model import Workers
from thrust_remote.core.errors import ConfigError, ExitCode

pytestmark = pytest.mark.xdist_group("test_own_workers")

# A project's own launcher: its flags give the worker count and the port its workers meet at
SPAWN_PY = '''\
"""Starts its own workers: torch.multiprocessing.spawn, gloo on the CPU."""
import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, world, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    total = torch.ones(1)
    dist.all_reduce(total)
    with open(os.path.join(out, f"worker-{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world": world, "sum": total.item(), "port": port,
                   "torchrun": "WORLD_SIZE" in os.environ}, fh)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-gpus", type=int, default=1)
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    mp.spawn(worker, args=(args.num_gpus, args.master_port, os.environ["THRUST_RUN_DIR"]), nprocs=args.num_gpus)
    print("THRUST_METRICS", json.dumps({"step": args.steps}), flush=True)


if __name__ == "__main__":
    main()
'''

JOBS = """\
jobs:
  spawner:
    script: spawn.py
    workers: {count: --num-gpus, port: --master-port}
    args: {steps: 2}
  plain:
    script: spawn.py
"""


@pytest.fixture(scope="module")
def project(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir): spawn.py with its own flags for the count and the port."""
    workdir = remote_tempdir(sshd) / "workers"
    proj = new_project(tmp_path_factory.mktemp("workers") / "project", sshd, workdir, files={"spawn.py": SPAWN_PY},
                       jobs=JOBS, message="a script that starts its own workers")
    return proj, workdir


def _train(cli, proj: Path, job: str, *extra: str):
    result = cli("train", job, "--no-fetch", *extra, cwd=proj)
    match = re.search(r"launching run (\S+)", result.stderr)
    return result, (match.group(1) if match else None)


# ------------------------------------------------------------------------------------------ parsing

def test_workers_are_parsed_and_bad_ones_name_file_and_line(tmp_path):
    path = tmp_path / "thrust.yaml"
    path.write_text("jobs:\n  j:\n    script: a.py\n    workers: {count: --num-gpus, port: --master-port}\n"
                    "  c:\n    command: [sh, run.sh]\n    workers: {count: -n}\n")
    config = load_config(path, environ={})
    assert config.job("j").workers == Workers("--num-gpus", "--master-port")
    assert config.job("c").workers == Workers("-n")
    for body, line, field, words in [
        ("    script: a.py\n    workers: {port: --master-port}\n", 4, "jobs.j.workers.count", "count: --num-gpus"),
        ("    script: a.py\n    workers: {count: num_gpus}\n", 4, "jobs.j.workers.count", "flag of the job's own"),
        ("    script: a.py\n    workers: {count: --n, ports: --p}\n", 4, "jobs.j.workers.ports", "unknown key"),
        ("    script: a.py\n    workers: --num-gpus\n", 4, "jobs.j.workers", "{count: --num-gpus, port:"),
        ("    kind: trainer\n    workers: {count: --n}\n", 4, "jobs.j.workers", "not for a trainer job"),
    ]:
        path.write_text("jobs:\n  j:\n" + body)
        with pytest.raises(ConfigError) as info:
            load_config(path, environ={})
        assert info.value.message.startswith(f"{path}:{line}: {field}: "), info.value.message
        assert words in info.value.message, info.value.message


# ------------------------------------------------------------------------------------------ over SSH

@pytest.mark.slow
def test_a_script_that_spawns_its_workers_runs_once_with_the_count_given(cli, project):
    proj, workdir = project
    result, run_id = _train(cli, proj, "spawner", "--nproc", "2")
    assert result.returncode == 0, result.stderr
    run_dir = workdir / ".thrust" / "runs" / run_id
    assert json.loads(cli("status", run_id, "--json", cwd=proj).stdout)["state"] == "FINISHED"
    seen = [json.loads((run_dir / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    assert [s["rank"] for s in seen] == [0, 1] and all(s["world"] == 2 and s["sum"] == 2.0 for s in seen)
    assert not any(s["torchrun"] for s in seen)  # started once, by the script itself
    assert seen[0]["port"] == seen[1]["port"] != 29500  # a port chosen free on the host, not the default
    argv = json.loads((run_dir / "run.json").read_text())["argv"]
    assert "torch.distributed.run" not in argv
    assert argv[2:] == ["spawn.py", "--steps", "2", "--num-gpus", "2", "--master-port", FREE_PORT]


@pytest.mark.slow
def test_a_spawning_script_without_workers_is_refused_before_anything_is_sent(cli, project):
    proj, workdir = project
    line = SPAWN_PY.splitlines().index(next(ln for ln in SPAWN_PY.splitlines() if "mp.spawn(" in ln)) + 1
    for extra in (["--nproc", "2"], ["--gpus", "2"]):
        result, run_id = _train(cli, proj, "plain", *extra)
        assert result.returncode == ExitCode.USAGE == 64, result.stderr
        assert run_id is None and "syncing" not in result.stderr and "Traceback" not in result.stderr
        assert f"spawn.py:{line}: job 'plain' starts its own workers (mp.spawn(" in result.stderr
        assert "hang" in result.stderr
        assert "`workers: {count: --num-gpus, port: --master-port}`" in result.stderr  # its own flags, read
    assert not (workdir / ".thrust" / "runs").exists() or not any(
        p.name.startswith("plain") for p in (workdir / ".thrust" / "runs").iterdir())
    other = proj / "other.yaml"  # the same config under another name: the hint names the file given
    other.write_text((proj / "thrust.yaml").read_text())
    result = cli("--config", str(other), "train", "plain", "--no-fetch", "--nproc", "2", cwd=proj,
                 env={"COLUMNS": "1000"})
    assert result.returncode == 64, result.stderr
    assert f"say how it takes its count in {other.resolve()}, under jobs.plain" in result.stderr, result.stderr


@pytest.mark.slow
def test_gpus_on_a_cpu_host_names_what_runs_this_job(cli, project):
    proj, _ = project
    result, _ = _train(cli, proj, "spawner", "--gpus", "2", "--nproc", "1")
    assert result.returncode == 64, result.stderr
    assert "--nproc N passes N by the job's --num-gpus" in result.stderr  # what the first test runs
