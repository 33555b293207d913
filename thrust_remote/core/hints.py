"""The exact thrust-remote command a hint tells the user to run.

A hint that names a command must act on the same host and the same thrust.yaml as the command that
printed it: `thrust-remote stop RUN_ID` alone would act on the default host (docs/architecture.md,
"Exit codes"). So every such hint is built here, with `--host NAME` and, when the user
named a config file (`--config` / THRUST_CONFIG), the global `--config PATH` before the subcommand.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from thrust_remote.core.config import CONFIG_NAME, HostConfig, JobConfig

PROG = "thrust-remote"


def command_hint(command: str, *args: str, host: HostConfig | str | None = None,
                 config: str | Path | None = None) -> str:
    """`thrust-remote [--config PATH] COMMAND ARGS... [--host NAME] [-- WORDS...]`, quoted for a POSIX shell.

    `host` is a host name or a HostConfig; a HostConfig also brings the config path the user gave
    (HostConfig.config_path) unless `config` is passed. Placeholders such as RUN_ID stay as they are.
    """
    name = host.name if isinstance(host, HostConfig) else host
    if config is None and isinstance(host, HostConfig):
        config = host.config_path
    argv = [PROG]
    if config:
        argv += ["--config", str(config)]
    argv += command.split()
    # options go before a `--` (exec's): after it, `--host H` would be words of the remote command
    rest = list(args)
    cut = rest.index("--") if "--" in rest else len(rest)
    argv += rest[:cut] + (["--host", name] if name else []) + rest[cut:]
    return shlex.join(argv)


def config_file(said_in: HostConfig | JobConfig, config: str | Path | None = None) -> str:
    """The config file a hint tells the user to edit: the one they named (--config: `config`, else the
    one the host or job was read from), else thrust.yaml."""
    return str(config) if config else said_in.config_path or CONFIG_NAME


def in_config_file(text: str, file: str) -> str:
    """`text` with each "in thrust.yaml" naming `file` instead: what the host's checks (envcheck, the
    Slurm rows) say to set, once on the laptop, which knows the file the user gave."""
    return text.replace(f" in {CONFIG_NAME}", f" in {file}")


# What adds the trainer's packages (torch, onnxscript, gymnasium: pyproject's `local` extra) to the
# python thrust-remote runs in, which the host `local` runs jobs with; a plain install leaves them out.
LOCAL_EXTRA_INSTALL = "pip install 'thrust-remote[local]'"
CPU_TORCH_INSTALL = "pip install torch --index-url https://download.pytorch.org/whl/cpu"
