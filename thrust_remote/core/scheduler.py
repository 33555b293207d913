"""A host that is a Slurm cluster's login node (`scheduler: slurm`): its settings and the sbatch options
they make (docs/architecture.md, "Slurm clusters"; README, "Slurm clusters").

thrust-remote sets some sbatch options itself (the job's name, output, directory, nodes, GPUs...):
`sbatch:` may pass any other through, and one of those is refused at its line in thrust.yaml, with the
key or flag that says it instead.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

SCHEDULERS = ("slurm",)

# Slurm's time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (sbatch --time)
TIME_RE = re.compile(r"^(\d+-\d{1,2}(:\d{1,2}(:\d{1,2})?)?|\d+(:\d{1,2}){0,2})\Z")
# an sbatch long option's name as `sbatch:` takes it (no leading dashes)
OPTION_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}\Z")
# a partition, account or QOS name: what Slurm takes, and nothing a shell or an option parser reads
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}\Z")

# sbatch's options thrust-remote sets itself (short forms too), each with what to write instead
OWN_OPTIONS: Mapping[str, str] = {
    "parsable": "thrust-remote reads the job id from it",
    "job-name": "thrust-remote names the job thrust-RUN_ID", "J": "thrust-remote names the job thrust-RUN_ID",
    "output": "the run's log is in its run directory", "o": "the run's log is in its run directory",
    "error": "the run's log is in its run directory", "e": "the run's log is in its run directory",
    "chdir": "the job runs in its run's own tree", "D": "the job runs in its run's own tree",
    "nodes": "use train --nodes N", "N": "use train --nodes N",
    "ntasks": "thrust-remote starts one supervisor per node", "n": "thrust-remote starts one supervisor per node",
    "ntasks-per-node": "thrust-remote starts one supervisor per node",
    "gpus": "use train --gpus G", "G": "use train --gpus G", "gres": "use train --gpus G",
    "gpus-per-node": "use train --gpus G",
    "partition": "use the host's partition: key", "p": "use the host's partition: key",
    "account": "use the host's account: key", "A": "use the host's account: key",
    "time": "use the host's time: key", "t": "use the host's time: key",
    "wrap": "thrust-remote submits its own batch script", "array": "one run is one job",
    "export": "the run's env: travels in its run directory", "wait": "thrust-remote follows the run itself",
    "W": "thrust-remote follows the run itself",
    "signal": "thrust-remote asks for the warning before the time limit (the host's limit_warning:)",
    "requeue": "a run ends when its job ends; retry: {on: [lost, preempted]} resumes it from its checkpoint",
    "no-requeue": "thrust-remote sets it: a run ends when its job ends",
}
# sbatch options that break "one run is one job, run once, as this account, on this cluster": refused too
NOT_PASSED: Mapping[str, str] = {
    "test-only": "it submits nothing, and the run would wait for a job that is not there; "
                 "doctor --host H checks the job's options with sbatch --test-only",
    "help": "sbatch prints its help and submits nothing", "usage": "sbatch prints its usage and submits nothing",
    "version": "sbatch prints its version and submits nothing",
    "uid": "the job runs as the account that owns its run directory (the host's address: user)",
    "gid": "the job runs as the account that owns its run directory (the host's address: user)",
    "clusters": "thrust-remote follows the job in this cluster's queue; make the other cluster's login node a host",
    "cluster": "thrust-remote follows the job in this cluster's queue; make the other cluster's login node a host",
    "M": "thrust-remote follows the job in this cluster's queue; make the other cluster's login node a host",
}
LIMIT_WARNING_S = 90  # default: the job's TERM this long before its time limit, to write a checkpoint


@dataclass(frozen=True)
class SlurmConfig:
    """`scheduler: slurm` and its keys on a host."""

    partition: str | None = None
    account: str | None = None
    time: str | None = None  # the job's time limit, Slurm's format
    limit_warning: int = LIMIT_WARNING_S  # seconds before the limit the job gets its TERM
    sbatch: tuple[tuple[str, str | None], ...] = field(default_factory=tuple)  # (option, value or None: a flag)
    # `login_shell: true`: every command on the login node runs in the login environment (/etc/profile,
    # ~/.profile: where clusters put Slurm on PATH, or `module load slurm`), not in sshd's plain `sh -c`
    login_shell: bool = False


def login_shell_fix(host: str, config: str) -> str:
    """What to set when Slurm's commands work only in the login node's login shell."""
    return (f"set `login_shell: true` under hosts.{host} in {config}: thrust-remote then runs its commands "
            "there in the login environment, as your own ssh session does")


def option_clash(key: str) -> tuple[str, str] | None:
    """(what the config error says, its hint) when sbatch would read `key` (an `sbatch:` key, dashes
    dropped) as an option thrust-remote sets itself or one of NOT_PASSED; None when it may pass. sbatch
    takes any unambiguous beginning of a long option's name (`outp` is --output), so a key that begins
    one of those options is refused too, naming the option in full."""
    refused = {**OWN_OPTIONS, **NOT_PASSED}
    begun = [name for name in refused if len(name) > 1 and name.startswith(key) and name != key]
    if key not in refused and not begun:
        return None
    full = key if key in refused else begun[0]
    said = "thrust-remote sets this sbatch option itself" if full in OWN_OPTIONS else \
        "thrust-remote cannot pass this sbatch option: one run is one job"
    if full != key:
        said += (f" (sbatch takes {key} for --{full}: it reads any unique beginning of an option's name)"
                 if len(begun) == 1 else f" ({key} begins {', '.join('--' + b for b in begun)})")
    elif len(full) > 1:
        said += f" (--{full})"
    return said, refused[full]


def sbatch_options(slurm: SlurmConfig, *, nodes: int = 1, gpus: int = 0, stops_at: float | None = None) -> list[str]:
    """The sbatch options of one run (the agent adds the job's name, output, directory and script).
    `stops_at`: seconds after which the run stops itself (its job's max_duration: and the TERM's grace);
    with no `time:` of the host's, the time limit is set past it, by the limit warning and a minute, so
    the scheduler's own warning (a "timeout", which the run would continue from) never comes first."""
    # --no-requeue: a node failure or a preemption ends the run (LOST, resumable from its checkpoint by
    # retry:), never restarts it from scratch over the same run directory
    out = [f"--nodes={nodes}", "--ntasks-per-node=1", "--no-requeue"]
    out += [f"--partition={slurm.partition}"] if slurm.partition else []
    out += [f"--account={slurm.account}"] if slurm.account else []
    if slurm.time or stops_at:
        out += [f"--time={slurm.time or math.ceil((stops_at + slurm.limit_warning + 60) / 60)}"]
    out += [f"--gres=gpu:{gpus}"] if gpus else []
    # B: the warning goes to the batch step's supervisor alone, which passes it on as a TERM (agent/slurm.py)
    out += [f"--signal=B:USR1@{slurm.limit_warning}"]
    out += [f"--{name}" if value is None else f"--{name}={value}" for name, value in slurm.sbatch]
    return out
