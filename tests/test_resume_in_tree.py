"""A job that resumes by a flag and reads its checkpoint from a fixed place of its own tree (nanoGPT's
`--init_from=resume` reading `out/ckpt.pt`): `resume: {args: [...], checkpoint_at: PATH}` (issue 53,
item 4). Over the real `sshd` host: a small training script that saves its step to out/ckpt.pt every
step (in place, as torch.save does) and on --init_from=resume loads it and counts on; stopped midway then
`resume RUN`, and failed midway then retried (`retry: {on: [failed]}`), each new run continues from the
checkpoint's step. The config's errors name their line; the host's placement (agent place-checkpoint)
refuses a place that a link takes out of the tree and leaves no partial file under the final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import EXE, new_project, run_tree, wait_until

from thrust_remote.agent import placing
from thrust_remote.core.config import parse_config_text
from thrust_remote.core.errors import ConfigError

# saves over its checkpoint in place each step (as torch.save(..., path) does) and, as a job should,
# takes `stop`'s TERM between steps: a TERM in the middle of the write would leave an empty file
TRAIN = """\
import argparse, json, os, signal, sys, time

p = argparse.ArgumentParser()
p.add_argument("--init_from", default="scratch")
p.add_argument("--max_iters", type=int, default=100000)
p.add_argument("--fail_at", type=int, default=-1)
a = p.parse_args()
os.makedirs("out", exist_ok=True)
step = 0
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
if a.init_from == "resume":
    with open(os.path.join("out", "ckpt.pt")) as f:
        step = json.load(f)["iter_num"]
    print(f"resuming from iter {step}", flush=True)
while step < a.max_iters and not stop:
    step += 1
    with open(os.path.join("out", "ckpt.pt"), "w") as f:  # saved over in place, as torch.save(..., path) does
        json.dump({"iter_num": step}, f)
    print(f"iter {step}", flush=True)
    if step == a.fail_at:
        sys.exit(3)
    time.sleep(0.3)
if stop:
    sys.exit(143)
print("done", flush=True)
"""

JOBS = ("jobs:\n"
        "  gpt:\n    script: train.py\n    checkpoints: out/ckpt.pt\n"
        "    resume: {args: [--init_from=resume], checkpoint_at: out/ckpt.pt}\n"
        "  flaky:\n    script: train.py\n    args: {max_iters: 7, fail_at: 3}\n    checkpoints: out/ckpt.pt\n"
        "    resume: {args: [--init_from=resume], checkpoint_at: out/ckpt.pt}\n"
        "    retry: {max: 1, on: [failed]}\n")


def _cli(project: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("THRUST_CONFIG", None)
    return subprocess.run([EXE, *args], cwd=project, capture_output=True, text=True, env=env, timeout=timeout)


def _iter(path: Path) -> int:
    return json.loads(path.read_text())["iter_num"]


def _log(project: Path, run_id: str) -> str:
    return _cli(project, "logs", run_id).stdout


# ------------------------------------------------------------------------------------------ no SSH

def test_the_form_with_checkpoint_at_parses_and_its_mistakes_name_their_line():
    head = "jobs:\n  own:\n    script: t.py\n    checkpoints: out/ckpt.pt\n"
    given = "    resume: {args: [--init_from=resume], checkpoint_at: ./out/ckpt.pt}\n"
    job = parse_config_text(head + given).jobs["own"]
    assert job.resume == ("--init_from=resume",) and job.resume_at == "out/ckpt.pt"
    # a job that continues whenever its checkpoint is there needs no argument at all
    bare = parse_config_text(head + "    resume: {checkpoint_at: out/ckpt.pt}\n").jobs["own"]
    assert bare.resume == () and bare.resume_at == "out/ckpt.pt"
    listed = parse_config_text(head + "    resume: [--resume-from, '{checkpoint}']\n").jobs["own"]
    assert listed.resume == ("--resume-from", "{checkpoint}") and listed.resume_at is None
    bad = {
        "    resume: {args: [--init_from=resume], checkpoint_at: /tmp/ckpt.pt}\n":
            ":5: jobs.own.resume.checkpoint_at: expected a path relative to the job's working directory",
        "    resume: {args: [--init_from=resume], checkpoint_at: ../ckpt.pt}\n":
            ":5: jobs.own.resume.checkpoint_at: expected a file's path inside the run's own tree (no `..`)",
        "    resume: {args: [--init_from=resume], checkpoint_at: out/../../ckpt.pt}\n":
            ":5: jobs.own.resume.checkpoint_at: expected a file's path inside the run's own tree",
        "    resume: {args: [--ckpt, '{checkpoint}'], checkpoint_at: out/ckpt.pt}\n":
            ':5: jobs.own.resume.args: "{checkpoint}" has no place here',
        "    resume: {args: [--init_from=resume]}\n": ":5: jobs.own.resume.checkpoint_at: missing",
        "    resume: {args: [--init_from=resume], at: out/ckpt.pt}\n":
            ":5: jobs.own.resume.at: unknown key (expected one of: args, checkpoint_at)",
        "    resume: [--init_from=resume]\n": "checkpoint_at: out/ckpt.pt}",  # the list form's error shows the other
    }
    for lines, message in bad.items():
        with pytest.raises(ConfigError) as info:
            parse_config_text(head + lines, Path("thrust.yaml"))
        assert message in str(info.value), (lines, str(info.value))


def test_the_host_refuses_a_place_a_link_takes_out_of_the_tree_and_leaves_no_partial_file(tmp_path):
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    (tree / "job").mkdir(parents=True)
    outside.mkdir()
    src = tmp_path / "ckpt.pt"
    src.write_bytes(b"weights" * 1000)
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    (tree / "job" / "out").symlink_to(outside)  # a link in the checkout that leaves the tree
    refused = placing.place(str(src), str(tree), str(tree / "job"), "out/ckpt.pt", sha)
    assert refused["why"] == placing.OUTSIDE and list(outside.iterdir()) == []
    (tree / "job" / "out").unlink()
    (tree / "job" / "deep").symlink_to(outside)  # a directory made through a link is refused before any file
    made = placing.place(str(src), str(tree), str(tree / "job"), "deep/more/ckpt.pt", sha)
    assert made["why"] == placing.OUTSIDE and not (outside / "more" / "ckpt.pt").exists()
    wrong = placing.place(str(src), str(tree), str(tree / "job"), "out/ckpt.pt", "0" * 64)
    assert wrong["why"] == placing.CHANGED and sorted(os.listdir(tree / "job" / "out")) == []
    good = placing.place(str(src), str(tree), str(tree / "job"), "out/ckpt.pt", sha)
    assert good["sha256"] == sha and (tree / "job" / "out" / "ckpt.pt").read_bytes() == src.read_bytes()
    assert sorted(os.listdir(tree / "job" / "out")) == ["ckpt.pt"]


# ------------------------------------------------------------------------------------------ over sshd

@pytest.mark.slow
def test_a_job_that_reads_its_checkpoint_in_its_tree_resumes_stopped_and_retries_failed(tmp_path, sshd, remote_dir):
    workdir = remote_dir / "w"
    project = new_project(tmp_path / "proj", sshd, workdir, files={"train.py": TRAIN}, jobs=JOBS)
    started = _cli(project, "train", "gpt", "--detach", "--json")
    assert started.returncode == 0, started.stderr
    run_id = json.loads(started.stdout)["run_id"]
    own = run_tree(workdir, run_id) / "out" / "ckpt.pt"
    wait_until(lambda: own.is_file() and own.read_text().endswith("}") and _iter(own) >= 3, 120, "three iterations")
    assert _cli(project, "stop", run_id).returncode == 0
    stopped_at = _iter(own)

    again = _cli(project, "resume", run_id, "--detach", "--json")
    assert again.returncode == 0, again.stderr
    new = json.loads(again.stdout)["run_id"]
    log = wait_until(lambda: (text := _log(project, new)) and "resuming from iter" in text and text, 120,
                     "the resumed run's first line")
    assert f"resuming from iter {stopped_at}\n" in log, log  # from the checkpoint's step, not from 0
    placed = run_tree(workdir, new) / "out" / "ckpt.pt"
    wait_until(lambda: f"iter {stopped_at + 2}\n" in _log(project, new), 60, "the resumed run going on")
    _cli(project, "stop", new)
    assert _iter(placed) > stopped_at
    # a copy, not a link: the new run saving over its checkpoint in place never writes into the run it continues
    assert _iter(own) == stopped_at and placed.stat().st_ino != own.stat().st_ino
    assert not [p for p in placed.parent.iterdir() if p.name != "ckpt.pt"]  # no partial file left beside it

    # the retry of a failed run is the same resume: from the step it failed at, and it then finishes
    followed = _cli(project, "train", "flaky", "--json")
    assert followed.returncode == 0, followed.stderr
    last = json.loads(followed.stdout)
    assert last["state"] == "FINISHED" and len(last["attempts"]) == 2, last
    first, second = (a["run_id"] for a in last["attempts"])
    assert _iter(run_tree(workdir, first) / "out" / "ckpt.pt") == 3
    log = _log(project, second)
    assert "resuming from iter 3\n" in log and "iter 4\n" in log and "iter 1\n" not in log and "done" in log, log
