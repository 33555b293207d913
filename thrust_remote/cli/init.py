"""`thrust-remote init`: write a commented thrust.yaml (never over an existing one without --force)."""

from __future__ import annotations

from pathlib import Path

import typer

from thrust_remote.core.config import CONFIG_NAME, find_config, parse_config_text, project_root
from thrust_remote.core.console import console
from thrust_remote.core.errors import UsageError

TEMPLATE = """\
# thrust.yaml: where `thrust-remote train` runs and what. Flags > THRUST_* env > this file > defaults.
default_host: local            # "local" always exists and needs no SSH

hosts:
  # gpu:
  #   address: gpu-box           # an ~/.ssh/config alias, or user@host[:port]
  #   workdir: ~/thrust          # where the code lives on the host
  #   python: python3            # the interpreter that has (CUDA) torch
  #   identity: null             # key file; default: ~/.ssh/config / your keys
  #   known_hosts: ~/.ssh/known_hosts
  #   host_key_policy: strict    # strict | accept-new (add an unknown key once; a changed key is refused)
  #   gpus: [0, 1]               # default: every GPU nvidia-smi lists
  # hpc:                         # a Slurm cluster: its login node; each run is one sbatch job
  #   address: me@login.cluster.edu
  #   workdir: ~/thrust          # on the filesystem the compute nodes share (home, /scratch...)
  #   python: python3            # as the compute nodes see it
  #   scheduler: slurm
  #   partition: gpu             # sbatch --partition
  #   account: my-lab            # sbatch --account (optional)
  #   time: "24:00:00"           # the job's time limit (HH:MM:SS, D-HH:MM:SS; quoted)

# groups:                      # one run over several hosts: `train JOB --host pair` (torchrun's rendezvous)
#   pair: [gpu, gpu2]

jobs:                          # snake and cartpole are built in; an entry here overrides or adds
  # snake:
  #   kind: python
  #   args: {env: snake, total-steps: 20000000, device: cuda, precision: bf16, compile: true}
  #   export: web/public/snake.onnx   # args: any `python -m trainer.train` flag
  # ppo:                         # your own script (or module: pkg.train), run from your repo's checkout
  #   kind: python
  #   script: train/train_ppo.py
  #   args: [--total-timesteps, "1000000"]
  #   requirements: requirements.txt   # pip-installed into the job's venv on the host
  #   nproc: 2                   # torchrun --nproc-per-node
  #   flags: {style: "--key value", names: as-is}   # how --set reaches it: or "--key=value", "key=value", "-k value"
  #   metrics: {pattern: 'iter (?P<step>\\d+): loss (?P<loss>[\\d.]+)'}   # progress from its own log lines
  #   artifacts: ["runs/**"]     # globs under the checkout (or $THRUST_RUN_DIR/...), fetched back
  #   checkpoints: "runs/ckpt-*.pt"             # pulled while followed (sync_every: 300 s) and at the end
  #   resume: [--resume-from, "{checkpoint}"]   # how your script continues: `thrust-remote resume RUN`
  #   retry: {max: 2, hosts: [hpc]}             # a lost host's run resumes there from its checkpoint
  #   files: [data/input.txt, datasets/small/]   # not in git: sent once per host by content, linked into the run
  #   setup: [python, data/prepare.py]           # run in the run's tree before the job, once per its inputs
  #   shared: [.cache/, wandb/]                  # kept across runs on the host (one directory, linked in)
  #   max_duration: 8h           # stop a run at that age (TERM, 60 s to checkpoint): STOPPED [max-duration]
  #   idle_stop: {below: 5, minutes: 10}         # stop it when its GPUs stay under 5% for 10 minutes
  # snake-rs:
  #   kind: cargo                # tch-rs: cargo +TOOLCHAIN build --release --example EXAMPLE, then run it
  #   toolchain: nightly
  #   example: train_snake_multi_v2
  #   args: [--mode, shared, --epochs, 1000, --cuda]
  #   artifact: models/snake.onnx
  #   tch_version: auto          # read from Cargo.lock

# search:                      # for `thrust-remote optimize`; defaults exist for snake and cartpole
#   snake:
#     learning-rate: {low: 1.0e-4, high: 3.0e-3, log: true}
#     num-envs: {choices: [1024, 4096, 16384]}
"""


def register(app: typer.Typer) -> None:
    app.command("init", help="Write a commented thrust.yaml at the project's top (the git work tree; else here).")(init)


def init(force: bool = typer.Option(False, "--force", help="Overwrite an existing thrust.yaml.")) -> None:
    # the project's top (git's work tree) is where train looks first and what it syncs: a thrust.yaml
    # written in a subfolder would shadow the project's own from there only
    path = project_root(Path.cwd()) / CONFIG_NAME
    found = find_config()
    if found and not force:
        raise UsageError(f"{found} already configures this directory", f"edit it, or use --force to overwrite {path}")
    parse_config_text(TEMPLATE, path)  # the template itself must always be a valid config
    path.write_text(TEMPLATE)
    # soft_wrap: rich never breaks these lines, so the path and the command stay whole and can be
    # copied; the command is short and on its own line, so even a narrow terminal keeps it whole.
    console.print(f"wrote {path}", soft_wrap=True, highlight=False, markup=False)
    console.print("next: add a host under `hosts:`, then check it with", soft_wrap=True, markup=False)
    console.print("  thrust-remote doctor --host NAME", soft_wrap=True, highlight=False, markup=False)
