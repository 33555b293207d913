"""A job of your own as it is (issue 38), over a real sshd: a project of the test's own whose train.py
behaves like nanoGPT's (module-level settings overridden by `--key=value` only, through a configurator
that asserts on anything else; `iter N: loss X` lines; a checkpoint every few iterations), and no
THRUST_METRICS line at all. The logic underneath is in tests/test_own_job.py (core)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import new_project, remote_tempdir, wait_until

# one worker runs this module's tests: they share one project and one host workdir
pytestmark = pytest.mark.xdist_group("test_own_job_ssh")

NANO_PY = '''\
"""Training in nanoGPT's manner: settings are module globals, overridden by --key=value only."""
import os
import sys
import time
from ast import literal_eval

max_iters = 4
sleep = 0.0
backend = "nccl"
out_dir = "out"
resume_from = ""
ckpt_every = 0

for arg in sys.argv[1:]:  # nanoGPT's configurator.py, as it is
    if "=" not in arg:
        assert not arg.startswith("--")
        exec(open(arg).read())
    else:
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        if key not in globals():
            raise ValueError(f"Unknown config key: {key}")
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        assert type(attempt) == type(globals()[key])
        globals()[key] = attempt

start = 0
if resume_from:
    start = int(open(resume_from).read()) + 1
    print(f"resuming from {resume_from} at iter {start}", flush=True)
os.makedirs(out_dir, exist_ok=True)
for it in range(start, max_iters + 1):
    print(f"iter {it}: loss {4.0 / (it + 1):.4f}, time 1.00ms", flush=True)
    if ckpt_every and it % ckpt_every == 0:
        with open(f"{out_dir}/.tmp", "w") as fh:
            fh.write(str(it))
        os.replace(f"{out_dir}/.tmp", f"{out_dir}/ckpt-{it}.pt")
    time.sleep(sleep)
with open(f"{out_dir}/result.txt", "w") as fh:
    fh.write(f"backend {backend}, final loss {4.0 / (max_iters + 1):.4f}\\n")
'''

PATTERN = "iter (?P<step>\\\\d+): loss (?P<loss>[\\\\d.]+)"
JOBS = f"""\
jobs:
  spaced:
    script: train.py
    objective: {{metric: loss, mode: min}}
  nano:
    script: train.py
    flags: {{style: "--key=value"}}
    metrics: {{pattern: "{PATTERN}"}}
    artifacts: ["out/**"]
    objective: {{metric: loss, mode: min}}
  lasting:
    script: train.py
    flags: {{style: "--key=value"}}
    args: {{ckpt_every: 1, max_iters: 100000, sleep: 0.2}}
    metrics: {{pattern: "{PATTERN}"}}
    checkpoints: out/ckpt-*.pt
    artifacts: ["out/**"]
    resume: ["--resume_from={{checkpoint}}"]
search:
  spaced: {{sleep: {{low: 0.0, high: 0.01}}}}
  nano: {{max_iters: {{choices: [2, 3]}}}}
"""


@pytest.fixture(scope="module")
def nano(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir): a fresh git repo of a user's own, not this repository."""
    workdir = remote_tempdir(sshd) / "own"
    proj = new_project(tmp_path_factory.mktemp("nano") / "project", sshd, workdir, files={"train.py": NANO_PY},
                       jobs=JOBS, message="nanoGPT-like training")
    return proj, workdir


def _run_id(text: str) -> str:
    return re.search(r"launching run (\S+)", text).group(1)  # type: ignore[union-attr]


def test_spaced_flags_die_in_the_configurator_and_the_hint_names_the_style_that_works(cli, nano):
    """`--set backend=gloo` reaches the default job as `--backend gloo`: nanoGPT's configurator asserts.
    The next step names the flag style; the job that says `--key=value` finishes, its progress read
    from its own `iter N: loss X` lines (`--json`'s steps and metrics), and ends with a FINISHED line."""
    proj, _ = nano
    died = cli("train", "spaced", "--set", "backend=gloo", "--no-fetch", cwd=proj)
    assert died.returncode == 1 and "AssertionError" in died.stdout + died.stderr, died.stderr
    err = " ".join(died.stderr.split())
    assert "next: run" in err and "died of its arguments before its first metrics" in err
    assert "--learning_rate 0.1" in err and "flags: {style: '--key=value'}" in err and "Traceback" not in err
    ok = cli("train", "nano", "--set", "backend=gloo", "--set", "max_iters=3", "--json", cwd=proj)
    assert ok.returncode == 0, ok.stderr
    out = json.loads(ok.stdout)
    assert out["state"] == "FINISHED" and out["steps"] == 3 and out["metrics"] == {"step": 3, "loss": 1.0}
    assert out["next_steps"] == []  # a FINISHED run says so itself
    plain = cli("train", "nano", "--set", "max_iters=1", cwd=proj)
    assert plain.returncode == 0 and f"FINISHED: run {_run_id(plain.stderr)} on sandbox" in plain.stderr


def test_optimize_stops_at_a_first_trial_that_asserts_and_reads_its_objective_from_a_pattern(cli, nano):
    """A study of the spaced job: its first trial dies in the configurator, the study stops (78) naming
    the flag style, one trial not three. The `--key=value` job's trials are scored from their own lines."""
    proj, workdir = nano
    stopped = cli("optimize", "spaced", "--trials", "3", "--json", cwd=proj, timeout=300)
    err = " ".join(stopped.stderr.split())
    assert stopped.returncode == 78, stopped.stderr
    assert "jobs.spaced: trial 0 died (exit code 1) before its first metrics: AssertionError" in err
    assert "flags: {style: '--key=value'}" in err and "Traceback" not in err
    assert len(list((workdir / ".thrust" / "runs").glob("spaced-t*"))) == 1  # one trial, not three
    study = cli("optimize", "nano", "--trials", "1", "--seed", "1", "--json", cwd=proj, timeout=300)
    assert study.returncode == 0, study.stderr
    out = json.loads(study.stdout)
    assert out["counts"]["COMPLETE"] == 1
    for trial in out["trials"]:  # loss 4/(max_iters+1) at its last iter: 1.0 for 3, 1.3333 for 2
        assert trial["value"] == pytest.approx(4.0 / (trial["params"]["max_iters"] + 1), abs=1e-4)


def test_a_run_killed_to_lost_names_resume_with_its_pulled_checkpoint(cli, nano):
    """The host loses the run (its supervisor and job killed: what a reboot leaves): following it ends
    LOST, and the next step is `resume RUN --host sandbox` with the checkpoint pulled here, its step and
    age; `wait` on a finished run brings its artifacts and says the numbers it ended with, and a file
    under both `artifacts:` and `checkpoints:` is in both places (issue 56 item 3)."""
    proj, workdir = nano
    started = cli("train", "lasting", "--detach", cwd=proj)
    assert started.returncode == 0, started.stderr
    run_id = _run_id(started.stderr)
    run_dir = workdir / ".thrust" / "runs" / run_id
    wait_until(lambda: "iter 3:" in (run_dir / "log").read_text(), 60, "three iterations")
    assert cli("fetch", run_id, cwd=proj).returncode == 0
    meta = json.loads((run_dir / "run.json").read_text())
    # on the host (the sshd's own pid namespace), what this test started, as a reboot leaves it: the
    # supervisor first (no end is recorded), then the job's own process group
    for target in (str(meta["supervisor_pid"]), f"-{meta['pid']}"):
        assert cli("exec", "--", "/bin/kill", "-KILL", "--", target, cwd=proj).returncode == 0
    followed = cli("logs", run_id, "--follow", cwd=proj)
    err = " ".join(followed.stderr.split())
    assert followed.returncode == 1 and f"run {run_id} ended LOST" in err and "exit code None" not in err, err
    assert re.search(r"next: continue it from its checkpoint ckpt-\d+\.pt \(step \d+, written \d+s ago on "
                     r"sandbox, pulled \d+s ago[^)]*\): thrust-remote resume " + run_id + " --host sandbox", err), err
    kept = proj / ".thrust" / "fetched" / run_id
    pulled = list((kept / "checkpoints").glob("ckpt-*.pt"))
    # the LOST end brought its artifacts too (issue 56 item 2): the newest checkpoint is among them
    assert pulled and (kept / "artifacts" / "out" / pulled[0].name).read_bytes() == pulled[0].read_bytes()
    # resumed elsewhere (this machine: the pulled copy goes there), it says how old that copy is
    again = cli("resume", run_id, "--host", "local", "--set", "sleep=0.0", "--set", "max_iters=40", "--detach",
                cwd=proj)
    said = " ".join(again.stderr.split())
    assert again.returncode == 0 and re.search(r"resuming from the checkpoint pulled here: ckpt-\d+\.pt \(step "
                                               r"\d+, written \d+s ago on sandbox, pulled \d+s ago[^)]*\)", said), said
    assert cli("wait", _run_id(again.stderr), "--host", "local", cwd=proj, timeout=60).returncode == 0
    done = cli("train", "nano", "--detach", "--set", "max_iters=2", cwd=proj)
    other = _run_id(done.stderr)
    waited = cli("wait", other, cwd=proj, timeout=120)
    assert waited.returncode == 0 and f"{other}: FINISHED (exit code 0) (step 2, loss 1.333)" in waited.stderr
    assert (proj / ".thrust" / "fetched" / other / "artifacts" / "out" / "result.txt").is_file()


def test_runs_summary_without_a_host_says_it_asked_the_default_host(cli, nano):
    proj, _ = nano
    summary = cli("runs", "--summary", cwd=proj)
    assert summary.returncode == 0 and "runs on sandbox (the default host" in summary.stderr, summary.stderr
