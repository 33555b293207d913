"""A real Slurm cluster for the tests: Debian's slurmctld, slurmd and munged (Slurm 22.05), started as
root on loopback with their own config, ports, state and spool directories, one compute node.

`start(root)` gives a `Cluster` (its `conf`, the path clients need in SLURM_CONF); `Cluster.stop()` ends
the daemons by the pids in their pid files (never by name: other sessions may run a Slurm of their own).
The node has 2 CPUs and no GPUs: slurmd 22.05 here drains a node whose gres.conf names GPUs without
device files ("gres/gpu count reported lower than configured"), so GPU requests are checked as the
sbatch argv thrust-remote builds, not placed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel", "scontrol")


def missing() -> list[str]:
    """The Slurm programs this machine lacks (`make test` installs them)."""
    return [name for name in BINARIES if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    root: Path
    conf: Path
    node: str
    partition: str
    pid_files: tuple[Path, ...]

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (the test's own look, not the product's)."""
        return subprocess.run(list(argv), capture_output=True, text=True, check=check,
                              env={**os.environ, **self.env}, timeout=30)

    def node_state(self) -> str:
        out = self.run("sinfo", "--noheader", "--nodes", self.node, "--format=%T", check=False).stdout
        return out.strip()

    def stop(self) -> None:
        """Every job of this cluster cancelled (their slurmstepd would outlive slurmd), then the daemons
        ended by the pids in their pid files."""
        if self.run("scancel", f"--user={_user()}", check=False).returncode == 0:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.run("squeue", "--noheader", check=False).stdout.strip():
                time.sleep(0.2)
        for pid_file in self.pid_files:
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (its parent has not reaped it yet) is gone for our purposes
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    return False


def start(root: Path, *, min_job_age: int = 300, kill_wait: int = 2) -> Cluster:
    """slurmctld + one slurmd + munged under `root`; waits until the node is idle."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("state", "spool", "munge", "log"):
        (root / sub).mkdir(exist_ok=True)
    (root / "munge").chmod(0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    socket_path = root / "munge" / "munge.socket"
    pids = root / "pids"
    pids.mkdir(exist_ok=True)
    node = socket.gethostname().split(".")[0]
    subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
                    f"--pid-file={pids / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
                    f"--seed-file={root / 'munge' / 'seed'}"], check=True, capture_output=True, timeout=30)
    conf = root / "slurm.conf"
    # Only what a one-node cluster on loopback needs, root running everything: no cgroups (proctrack
    # by parent pid), no accounting storage (sacct says so; squeue and scontrol still answer).
    conf.write_text(
        "ClusterName=thrusttest\n"
        f"SlurmctldHost={node}(127.0.0.1)\n"
        "AuthType=auth/munge\n"
        f"AuthInfo=socket={socket_path}\n"
        "CredType=cred/munge\n"
        "SlurmUser=root\nSlurmdUser=root\n"
        f"SlurmctldPort={_free_port()}\nSlurmdPort={_free_port()}\n"
        f"StateSaveLocation={root / 'state'}\nSlurmdSpoolDir={root / 'spool'}\n"
        f"SlurmctldPidFile={pids / 'slurmctld.pid'}\nSlurmdPidFile={pids / 'slurmd.pid'}\n"
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}\nSlurmdLogFile={root / 'log' / 'slurmd.log'}\n"
        "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
        "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        "MpiDefault=none\n"
        "SchedulerType=sched/backfill\nSchedulerParameters=sched_interval=1\n"
        f"MinJobAge={min_job_age}\nKillWait={kill_wait}\nInactiveLimit=0\nReturnToService=2\n"
        "SlurmctldTimeout=10\nSlurmdTimeout=10\nMessageTimeout=5\n"
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=2000 State=UNKNOWN\n"
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP\n"
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root, conf, node, "debug",
                      (pids / "slurmd.pid", pids / "slurmctld.pid", pids / "munged.pid"))
    try:
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, capture_output=True, env=env, timeout=30)
        subprocess.run(["slurmd", "-f", str(conf)], check=True, capture_output=True, env=env, timeout=30)
        deadline = time.monotonic() + 30
        while cluster.node_state() not in ("idle", "mixed"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm node did not come up ({cluster.node_state()!r}): "
                                   f"{(root / 'log' / 'slurmctld.log').read_text()[-2000:]}")
            time.sleep(0.2)
    except BaseException:
        cluster.stop()
        raise
    return cluster
