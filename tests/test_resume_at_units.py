"""`resume: {checkpoint_at: P}` (a job that reads its checkpoint at a fixed place of its tree, with no
argument of its own; issue 53 item 4) is a job that can continue: on a Slurm cluster its run submits its
own next attempt at its time limit (backends/slurm.host_retry, the plan agent/slurm.py's
continue_itself follows), `resume` and `retry` take it, and the run's end offers a resume."""

from __future__ import annotations

from thrust_remote.backends.slurm import host_retry
from thrust_remote.core.config import parse_config_text
from thrust_remote.run import endings
from thrust_remote.run import resume as resuming

HEAD = "jobs:\n  own:\n    script: t.py\n    checkpoints: out/ckpt.pt\n    retry: {max: 3, on: [timeout]}\n"


def test_checkpoint_at_alone_continues_itself_on_a_cluster():
    job = parse_config_text(HEAD + "    resume: {checkpoint_at: out/ckpt.pt}\n").jobs["own"]
    plan = host_retry(job, ["--steps", "9"], "hpc")
    assert plan is not None
    assert plan["args"] == ["--steps", "9"] and plan["on"] == ["timeout"] and plan["checkpoints"] == "out/ckpt.pt"
    assert resuming.template_of(job) == () and endings.resumable(job)


def test_checkpoint_at_with_args_continues_with_them_and_the_list_form_names_the_checkpoint():
    job = parse_config_text(HEAD + "    resume: {args: [--init_from=resume], checkpoint_at: out/ckpt.pt}\n").jobs["own"]
    assert host_retry(job, [], "hpc")["args"] == ["--init_from=resume"]  # type: ignore[index]
    listed = parse_config_text(HEAD + "    resume: [--ckpt, '{checkpoint}']\n").jobs["own"]
    assert host_retry(listed, [], "hpc")["args"] == ["--ckpt", "{checkpoint}"]  # type: ignore[index]


def test_a_job_that_does_not_say_how_it_continues_does_not_continue_itself():
    job = parse_config_text("jobs:\n  own:\n    script: t.py\n    checkpoints: out/ckpt.pt\n").jobs["own"]
    assert host_retry(job, [], "hpc") is None and not endings.resumable(job)
