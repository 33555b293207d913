"""Job kinds (docs/architecture.md, "Config (thrust.yaml)"): trainer, your own python script or
module (under torchrun with nproc), any command. Parsing with file:line errors, how --set / --params
reach each kind, the argv and env each runs with, and, over a real sshd, a small project that is not
this repository: its own DDP-aware train.py, a module, a shell script, a missing script."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from helpers import TRAIN_PY, new_project, remote_tempdir, run_tree

from thrust_remote.core.config import JobConfig, load_config, parse_config_text
from thrust_remote.core.errors import ConfigError, ExitCode, UsageError
from thrust_remote.run import arguments, following, jobs, stages, vocab

# one worker runs this module's tests, in order: a test rewrites the shared project's thrust.yaml (and puts it back)
pytestmark = pytest.mark.xdist_group("test_job_kinds")

# ------------------------------------------------------------------------------------------ parsing

KINDS = """\
jobs:
  ppo:
    kind: python
    script: train/train_ppo.py
    args: [--total-timesteps, "1000000"]
    requirements: requirements.txt
    nproc: 4
    artifacts: ["runs/**", "models/*.pt"]
    metrics: {tensorboard: runs}
    objective: {metric: charts/episodic_return, mode: max}
    export: web/public/ppo.onnx
  lora:
    module: lora.train
    requirements: [peft>=0.10, "datasets"]
  sweep:
    kind: command
    command: [bash, devops/train.sh, trainer.total_timesteps=1000000]
  old:
    kind: python
    args: {env: cartpole}
  snake:
    kind: trainer
    args: {env: snake, total-steps: 20000000}
"""


def test_each_kind_parses_into_its_fields_and_keeps_key_lines():
    cfg = parse_config_text(KINDS, Path("thrust.yaml"))
    ppo = cfg.job("ppo")
    assert (ppo.kind, ppo.script, ppo.module) == ("python", "train/train_ppo.py", None)
    assert ppo.args == ("--total-timesteps", "1000000")
    assert (ppo.requirements_file, ppo.requirements, ppo.nproc) == ("requirements.txt", (), 4)
    assert ppo.artifacts == ("runs/**", "models/*.pt")
    assert ppo.metrics == {"tensorboard": "runs"}
    assert ppo.objective == {"metric": "charts/episodic_return", "mode": "max"}
    assert ppo.lines["job"] == 2 and ppo.lines["script"] == 4 and ppo.lines["requirements"] == 6
    lora = cfg.job("lora")  # no kind: a module makes it a python job
    assert (lora.kind, lora.module, lora.requirements) == ("python", "lora.train", ("peft>=0.10", "datasets"))
    assert cfg.job("sweep").command == ("bash", "devops/train.sh", "trainer.total_timesteps=1000000")
    assert cfg.job("sweep").kind == "command"
    # `kind: python` without script/module keeps meaning the built-in trainer
    assert cfg.job("old").kind == "trainer" and cfg.job("old").args == {"env": "cartpole"}
    assert cfg.job("snake").kind == "trainer"
    assert cfg.job("cartpole").kind == "trainer"  # the built-ins


def test_job_spec_is_plain_json_without_the_lines():
    from thrust_remote.host.jobspec import job_spec

    cfg = parse_config_text(KINDS, Path("thrust.yaml"))
    spec = job_spec(cfg.job("ppo"))
    assert "lines" not in spec and "notify" not in spec
    assert not {"checkpoints", "resume", "sync_every", "retry"} & set(spec)  # the laptop's, while it follows
    assert spec["args"] == ["--total-timesteps", "1000000"] and spec["artifacts"] == ["runs/**", "models/*.pt"]
    assert json.loads(json.dumps(spec)) == spec


@pytest.mark.parametrize(
    ("body", "line", "field", "words"),
    [
        ("    script: a.py\n    module: a\n", 4, "jobs.j.module", "not both"),
        ("    kind: python\n    args: [--lr, '0.1']\n", 4, "jobs.j.args", "add script: or module:"),
        ("    kind: command\n", 2, "jobs.j.command", "needs `command:`"),
        ("    command: bash devops/train.sh x=1\n", 3, "jobs.j.command", "[bash, devops/train.sh, x=1]"),
        ("    command: []\n", 3, "jobs.j.command", "non-empty"),
        ("    kind: trainer\n    script: a.py\n", 4, "jobs.j.script", "not for a trainer job"),
        ("    command: [sh, x.sh]\n    args: [a]\n", 4, "jobs.j.args", "not for a command job"),
        ("    command: [sh, x.sh]\n    nproc: 2\n", 4, "jobs.j.nproc", "not for a command job"),
        ("    script: a.py\n    nproc: 0\n", 4, "jobs.j.nproc", "integer >= 1"),
        ("    script: a.py\n    nproc: two\n", 4, "jobs.j.nproc", "integer >= 1"),
        ("    script: ../outside.py\n", 3, "jobs.j.script", "inside the repository"),
        ("    script: /abs/train.py\n", 3, "jobs.j.script", "inside the repository"),
        ("    script: [a.py]\n", 3, "jobs.j.script", "single value"),
        ("    module: lora/train.py\n", 3, "jobs.j.module", "dotted module name"),
        ("    script: a.py\n    requirements: [numpy, --index-url=http://x]\n", 4, "jobs.j.requirements",
         "pip requirement"),
        ("    script: a.py\n    requirements: {numpy: 1}\n", 4, "jobs.j.requirements", "list of pip specs"),
        ("    script: a.py\n    args: [--flag, true]\n", 4, "jobs.j.args", "quote it"),
        ("    script: a.py\n    artifacts: runs/**\n", 4, "jobs.j.artifacts", "list of globs"),
        ("    script: a.py\n    metrics: {wandb: x}\n", 4, "jobs.j.metrics.wandb", "unknown key"),
        ("    script: a.py\n    objective: {metric: loss}\n", 4, "jobs.j.objective.mode", "missing"),
        ("    script: a.py\n    objective: {metric: loss, mode: up}\n", 4, "jobs.j.objective.mode", "max, min"),
        ("    kind: shell\n", 3, "jobs.j.kind", "trainer, python, cargo, command"),
    ],
)
def test_bad_job_names_file_line_and_field(tmp_path, body, line, field, words):
    path = tmp_path / "thrust.yaml"
    path.write_text("jobs:\n  j:\n" + body)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    message = info.value.message
    assert message.startswith(f"{path}:{line}: {field}: "), message
    assert words in message, message
    assert info.value.exit_code == ExitCode.CONFIG == 78


# ------------------------------------------------------------------------------------------ arguments

def _job(text: str, name: str = "j") -> JobConfig:
    return parse_config_text("jobs:\n  j:\n" + textwrap.indent(text, "    "), Path("thrust.yaml")).job(name)


def test_set_and_params_append_flags_to_a_python_list_as_given():
    job = _job("script: train.py\nargs: [--total-timesteps, '1000', --cuda]\n")
    args = arguments.job_arguments(job, arguments.parse_sets(["lr=0.1", "total-timesteps=5"]),
                                   {"seed": 3, "lr": 0.5, "track": True, "off": False})
    # the list as is; then params and --set merged, --set last-wins per key
    assert args == ["--total-timesteps", "1000", "--cuda", "--seed", "3", "--lr", "0.1", "--track",
                    "--total-timesteps", "5"]


def test_a_python_mapping_merges_like_the_trainer():
    job = _job("module: lora.train\nargs: {epochs: 3, rank: 8}\n")
    assert arguments.job_arguments(job, {"epochs": "5"}, {"rank": 16}) == ["--epochs", "5", "--rank", "16"]


def test_a_command_job_takes_key_value_words():
    job = _job("command: [bash, devops/train.sh, run=a]\n")
    args = arguments.job_arguments(job, arguments.parse_sets(["trainer.total_timesteps=9"]),
                                   {"gpu_list": "0,1", "trainer.total_timesteps": 1, "flag": True})
    assert args == ["gpu_list=0,1", "trainer.total_timesteps=9", "flag=true"]
    argv = jobs.job_argv(job, "/py", args, run_dir="/r", nproc=1)
    assert argv == ["bash", "devops/train.sh", "run=a", "gpu_list=0,1", "trainer.total_timesteps=9", "flag=true"]


def test_trainer_flags_are_checked_only_for_trainer_jobs():
    with pytest.raises(UsageError):
        arguments.check_trainer_args(_job("kind: trainer\n"), {"no-such-flag": "1"}, {})
    arguments.check_trainer_args(_job("script: train.py\n"), {"no-such-flag": "1"}, {})  # the script's own
    arguments.check_trainer_args(_job("command: [sh, x.sh]\n"), {"anything": "1"}, {})


def test_an_exploit_at_for_a_run_of_one_candidate_is_refused_before_anything_is_synced():
    """The trainer would refuse it on the host (it would do nothing); here it is 64 before the sync, with
    the setting that makes it work. The snake preset's candidates (auto) are several; cartpole's one."""
    snake, cartpole = _job("kind: trainer\nargs: {env: snake}\n"), _job("kind: trainer\nargs: {env: cartpole}\n")
    arguments.check_trainer_args(snake, {"exploit-at": "0.5"}, {})
    arguments.check_trainer_args(cartpole, {"exploit-at": "0.5", "candidates": "auto"}, {})
    arguments.check_trainer_args(snake, {"exploit-at": "0", "candidates": "1"}, {})  # off: nothing to refuse
    for job, sets, params in ((snake, {"candidates": "1"}, {"exploit-at": 0.5}), (cartpole, {"exploit-at": "0.3"}, {}),
                              (snake, {"candidates": "1e0", "exploit-at": "0.5"}, {})):  # 1e0 is 1 to the trainer
        with pytest.raises(UsageError) as refused:
            arguments.check_trainer_args(job, sets, params)
        assert refused.value.exit_code == 64 and "candidates=1" in refused.value.message
        assert "--set candidates=auto" in (refused.value.hint or "")


# ------------------------------------------------------------------------------------------ argv / env

def test_python_argv_single_process_and_under_torchrun():
    script = _job("script: train/ppo.py\n")
    assert jobs.job_argv(script, "/venv/bin/python", ["--lr", "1"], run_dir="/r", nproc=1) == [
        "/venv/bin/python", "-u", "train/ppo.py", "--lr", "1"]
    many = jobs.job_argv(script, "/venv/bin/python", ["--lr", "1"], run_dir="/r", nproc=4)
    assert many == ["/venv/bin/python", "-u", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                    "--max-restarts=0", "train/ppo.py", "--lr", "1"]
    module = _job("module: lora.train\n")
    assert jobs.job_argv(module, "py", [], run_dir="/r", nproc=1) == ["py", "-u", "-m", "lora.train"]
    assert jobs.job_argv(module, "py", [], run_dir="/r", nproc=2)[-3:] == ["--max-restarts=0", "-m", "lora.train"]
    trainer = jobs.job_argv(_job("kind: trainer\n"), "py", ["--env", "snake"], run_dir="/r", nproc=1)
    assert trainer == ["py", "-u", "-m", "trainer.train", "--env", "snake", "--run-dir", "/r", "--export",
                       "/r/model.onnx"]


def test_process_count_precedence():
    job = _job("script: t.py\nnproc: 3\n")
    assert jobs.process_count(job, None, [0, 1]) == 3  # the job's nproc: over one per GPU
    assert jobs.process_count(job, 2, []) == 2  # --nproc over the job
    assert jobs.process_count(_job("script: t.py\n"), None, [0, 1]) == 2
    assert jobs.process_count(_job("script: t.py\n"), None, []) == 1
    command = _job("command: [sh, x.sh]\n")
    assert jobs.process_count(command, None, [0, 1, 2]) == 1
    with pytest.raises(UsageError):
        jobs.process_count(command, 2, [])


def test_every_job_is_told_its_run_gpus_and_export():
    job = _job("script: t.py\nexport: web/public/t.onnx\nenv: {A: b}\n")
    env = jobs.job_env(job, {"A": "b"}, run_id="t-1", run_dir="/w/.thrust/runs/t-1", python="/py", gpus=[0, 2],
                       export=True)
    assert env["THRUST_RUN_ID"] == "t-1" and env["THRUST_RUN_DIR"] == "/w/.thrust/runs/t-1"
    assert env["THRUST_EXPORT"] == "/w/.thrust/runs/t-1/model.onnx" and env["THRUST_PYTHON"] == "/py"
    assert env["CUDA_VISIBLE_DEVICES"] == env["GPU_LIST"] == "0,2"  # the seeds' comma list
    plain = jobs.job_env(_job("script: t.py\n"), {}, run_id="r", run_dir="/r", python="/py", gpus=[], export=True)
    assert "THRUST_EXPORT" not in plain  # no export: asked for
    assert "CUDA_VISIBLE_DEVICES" not in plain and "GPU_LIST" not in plain  # no GPUs selected


# ------------------------------------------------------------------------------------------ over SSH

SHOW_ENV = '''\
#!/bin/sh
echo "GPU_LIST=${GPU_LIST-unset} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
echo "${GPU_LIST-unset}|${CUDA_VISIBLE_DEVICES-unset}|$THRUST_RUN_ID" > "$THRUST_RUN_DIR/gpus.txt"
printf '%s\\n' "$@" > "$THRUST_RUN_DIR/words.txt"
command -v python > "$THRUST_RUN_DIR/python.txt"
'''

JOBS = """\
jobs:
  ppo:
    kind: python
    script: train.py
    args: [--steps, "2"]
    export: web/public/ppo.onnx
  ddp:
    script: train.py
    nproc: 2
    args: {tag: ddp, steps: 2}
  mod:
    module: pkg.train_mod
    args: {tag: module}
  sweep:
    kind: command
    command: [sh, scripts/show_env.sh, base=1]
  ghost:
    script: not_there.py
  quits:
    command: [sh, -c, exit 75]
  fails:
    command: [sh, -c, exit 3]
"""


@pytest.fixture(scope="module")
def user_project(sshd, tmp_path_factory) -> tuple[Path, Path]:
    """(project, host workdir): a fresh git repo with its own train.py, a package and a shell script."""
    files = {"train.py": TRAIN_PY, "pkg/__init__.py": "",
             "pkg/train_mod.py": "from train import main\n\nif __name__ == '__main__':\n    main()\n",
             "scripts/show_env.sh": SHOW_ENV}
    workdir = remote_tempdir(sshd) / "own"
    proj = new_project(tmp_path_factory.mktemp("own") / "project", sshd, workdir, files=files, jobs=JOBS,
                       message="my own project")
    return proj, workdir


def _train(cli, proj: Path, job: str, *extra: str, fetch: bool = False):
    result = cli("train", job, *([] if fetch else ["--no-fetch"]), *extra, cwd=proj)
    match = re.search(r"launching run (\S+)", result.stderr)
    return result, (match.group(1) if match else None)


def _seen(workdir: Path, run_id: str, name: str) -> dict:
    return json.loads((workdir / ".thrust" / "runs" / run_id / name).read_text())


@pytest.mark.e2e  # a user's own torch script, for real
@pytest.mark.slow
def test_own_script_runs_finished_with_its_run_env(cli, user_project):
    proj, workdir = user_project
    result, run_id = _train(cli, proj, "ppo", "--set", "lr=0.5")
    assert result.returncode == 0, result.stderr
    run_dir = workdir / ".thrust" / "runs" / run_id
    assert json.loads(cli("status", run_id, "--json", cwd=proj).stdout)["state"] == "FINISHED"
    seen = _seen(workdir, run_id, "seen-script-0.json")
    assert seen["argv"] == ["--steps", "2", "--lr", "0.5"]
    assert seen["cwd"] == str(run_tree(workdir, run_id))  # the run's own tree
    env = seen["env"]
    assert env["THRUST_RUN_ID"] == run_id and env["THRUST_RUN_DIR"] == str(run_dir)
    assert env["THRUST_EXPORT"] == str(run_dir / "model.onnx")
    assert env["THRUST_PYTHON"] and env["WORLD_SIZE"] is None
    assert 'THRUST_METRICS {"step": 2' in (run_dir / "log").read_text()
    assert not (run_tree(workdir, run_id) / "trainer").exists()  # the project's own code ran, not this repository's


@pytest.mark.e2e  # a user's own torch script, for real
@pytest.mark.slow
def test_nproc_2_runs_the_script_under_torchrun_with_gloo(cli, user_project):
    proj, workdir = user_project
    result, run_id = _train(cli, proj, "ddp")
    assert result.returncode == 0, result.stderr + result.stdout
    for rank in (0, 1):
        seen = _seen(workdir, run_id, f"seen-ddp-{rank}.json")
        assert seen["env"]["WORLD_SIZE"] == "2" and seen["env"]["RANK"] == str(rank)
        assert seen["ranks"] == 2.0  # an all_reduce across both processes
        assert seen["argv"] == ["--tag", "ddp", "--steps", "2"]
    argv = json.loads((workdir / ".thrust" / "runs" / run_id / "run.json").read_text())["argv"]
    assert "torch.distributed.run" in argv and "--nproc-per-node=2" in argv


@pytest.mark.e2e  # a user's own torch script, for real
@pytest.mark.slow
def test_module_job_runs_with_python_m(cli, user_project):
    proj, workdir = user_project
    # no export: the run is not a model to fetch, and train says nothing about one
    result, run_id = _train(cli, proj, "mod", "--set", "steps=1", fetch=True)
    assert result.returncode == 0, result.stderr
    assert "model.onnx" not in result.stderr and "fetch" not in result.stderr
    seen = _seen(workdir, run_id, "seen-module-0.json")
    assert seen["argv"] == ["--tag", "module", "--steps", "1"]
    argv = json.loads((workdir / ".thrust" / "runs" / run_id / "run.json").read_text())["argv"]
    assert argv[1:] == ["-u", "-m", "pkg.train_mod", "--tag", "module", "--steps", "1"]


@pytest.mark.slow
def test_command_job_gets_words_and_the_run_env(cli, user_project):
    proj, workdir = user_project
    result, run_id = _train(cli, proj, "sweep", "--set", "trainer.lr=0.5", fetch=True)
    assert result.returncode == 0, result.stderr
    run_dir = workdir / ".thrust" / "runs" / run_id
    assert (run_dir / "words.txt").read_text().splitlines() == ["base=1", "trainer.lr=0.5"]
    # no --gpus on this CPU host: neither variable is set, the job sees the host's GPUs as they are
    assert (run_dir / "gpus.txt").read_text().strip() == f"unset|unset|{run_id}"
    assert "GPU_LIST=unset" in (run_dir / "log").read_text()
    # `python` in a command job is its venv's (activated), so what its requirements installed is there
    venvs = workdir / ".thrust" / "venvs"
    assert Path((run_dir / "python.txt").read_text().strip()).parent.parent.parent == venvs


@pytest.mark.slow
def test_a_job_that_exits_with_one_of_our_codes_gives_1_not_connection_lost(cli, user_project):
    """75 is ours ("connection lost, the run goes on"): a job's own 75 must not tell a script to reattach."""
    proj, _ = user_project
    result, run_id = _train(cli, proj, "quits")
    assert result.returncode == 1, result.stderr
    assert f"run {run_id} ended FAILED (exit code 75)" in result.stderr
    as_json, _ = _train(cli, proj, "quits", "--json")
    outcome = json.loads(as_json.stdout)
    assert as_json.returncode == 1
    assert outcome["state"] == "FAILED" and outcome["exit_code"] == 1 and outcome["job_exit_code"] == 75
    # a code of the job's own that is none of ours is passed on as it was
    other, _ = _train(cli, proj, "fails")
    assert other.returncode == 3, other.stderr


@pytest.mark.slow
def test_selected_gpus_reach_a_command_job_as_gpu_list(sshd, user_project):
    """launch_prepared with GPUs chosen (what --gpus and optimize's slots pass): the seeds' GPU_LIST."""
    from thrust_remote.host.session import HostSession

    proj, workdir = user_project
    config = load_config(proj / "thrust.yaml", environ={})
    runner = sshd.runner(workdir=str(workdir))
    try:
        session = HostSession.open(runner, config.host("sandbox"), config)
        prepared = stages.prepare(config, config.job("sweep"), session)
        launched = stages.launch_prepared(prepared, stages.LaunchPlan(gpus=(1, 3)))
        status = following.follow(session, launched.run_id, vocab.NullReporter()).status
    finally:
        runner.close()
    assert status["state"] == "FINISHED"
    run_dir = workdir / ".thrust" / "runs" / launched.run_id
    assert (run_dir / "gpus.txt").read_text().strip() == f"1,3|1,3|{launched.run_id}"


@pytest.mark.slow
def test_missing_script_is_78_with_its_line_before_anything_is_synced(cli, user_project):
    proj, workdir = user_project
    config = proj / "thrust.yaml"
    line = config.read_text().splitlines().index("    script: not_there.py") + 1
    runs_before = sorted((workdir / ".thrust" / "runs").glob("*")) if workdir.exists() else []
    result = cli("--config", str(config), "train", "ghost", cwd=proj.parent)
    assert result.returncode == ExitCode.CONFIG == 78, result.stderr
    assert f"thrust.yaml:{line}: jobs.ghost.script: not_there.py does not exist" in result.stderr
    assert "syncing" not in result.stderr and "launching run" not in result.stderr
    assert "Traceback" not in result.stderr
    assert (sorted((workdir / ".thrust" / "runs").glob("*")) if workdir.exists() else []) == runs_before


@pytest.mark.slow
def test_uncommitted_script_is_refused_before_sync(cli, user_project):
    proj, _workdir = user_project
    (proj / "new_train.py").write_text(TRAIN_PY)
    text = (proj / "thrust.yaml").read_text()
    try:
        (proj / "thrust.yaml").write_text(text + "  fresh:\n    script: new_train.py\n")
        result = cli("train", "fresh", cwd=proj)
    finally:
        (proj / "thrust.yaml").write_text(text)
        (proj / "new_train.py").unlink()
    assert result.returncode == 78, result.stderr
    assert "jobs.fresh.script: new_train.py is not committed" in result.stderr
    assert "git add new_train.py" in result.stderr


@pytest.mark.slow
def test_host_check_names_the_line_of_a_file_missing_from_the_checkout(sshd, user_project):
    """The check after the sync: what the host's checkout lacks is a 78 naming thrust.yaml:LINE."""
    from thrust_remote.host.session import HostSession

    proj, workdir = user_project
    text = "jobs:\n  late:\n    script: train.py\n    requirements: reqs/extra.txt\n  nomod:\n    module: no.such.mod\n"
    cfg = parse_config_text(text, proj / "thrust.yaml")
    runner = sshd.runner(workdir=str(workdir))
    try:
        session = HostSession.open(runner, sshd.host_config(workdir=str(workdir)), cfg)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "train.py").touch(exist_ok=True)
        with pytest.raises(ConfigError) as info:
            jobs.check_on_host(session, cfg.job("late"), str(workdir), "thrust.yaml")
        assert info.value.message.startswith("thrust.yaml:4: jobs.late.requirements: reqs/extra.txt is not in")
        with pytest.raises(ConfigError) as info:
            jobs.check_on_host(session, cfg.job("nomod"), str(workdir), "thrust.yaml")
        assert info.value.message.startswith("thrust.yaml:6: jobs.nomod.module: module no.such.mod is neither")
        jobs.check_on_host(session, parse_config_text("jobs:\n  j:\n    module: json.tool\n").job("j"),
                           str(workdir), "thrust.yaml")  # installed on the host: fine
    finally:
        runner.close()
