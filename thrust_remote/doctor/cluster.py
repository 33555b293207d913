"""`doctor --host H` of a Slurm cluster's login node: the rows only the scheduler and a compute node can
give (agent/slurmcheck.py), after the login node's own checklist (docs/architecture.md, "Slurm clusters")."""

from __future__ import annotations

from thrust_remote.agent.slurmcheck import LOGIN_SHELL_FIX
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ThrustError
from thrust_remote.core.hints import config_file, in_config_file
from thrust_remote.core.scheduler import login_shell_fix, sbatch_options
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.report import Check

CHECK_S = 120.0  # sinfo, sbatch --test-only and one srun that may wait SRUN_WAIT_S for a node


def slurm_checks(fleet: Fleet, host: HostConfig, workdir: str) -> list[Check]:
    """The cluster's rows; a check that cannot run is one failed row saying why."""
    assert host.slurm is not None
    options = [f"--option={o}" for o in sbatch_options(host.slurm)]
    args = ["slurm-check", "--workdir", workdir, *(["--partition", host.slurm.partition] if host.slurm.partition
                                                   else []), *(["--time", host.slurm.time] if host.slurm.time else []),
            *options]
    try:
        with fleet.open(host.name) as session:
            rows = session.agent_json("the Slurm checks", *args, timeout=CHECK_S)
    except ThrustError as exc:
        return [Check("slurm", "Slurm checks", "fail", exc.message, exc.hint)]
    return [Check(str(r.get("id")), str(r.get("title")), str(r.get("status")), str(r.get("detail")),
                  user_fix(r.get("fix"), host)) for r in rows if isinstance(r, dict)]


def user_fix(fix: object, host: HostConfig) -> str | None:
    """A row's fix as the user acts on it: the agent's LOGIN_SHELL_FIX made the exact line, host and file;
    a fix that says what to set "in thrust.yaml" names the file the user gave (--config) instead."""
    if fix == LOGIN_SHELL_FIX:
        return login_shell_fix(host.name, config_file(host))
    return None if fix is None else in_config_file(str(fix), config_file(host))
