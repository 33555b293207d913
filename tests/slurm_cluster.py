"""A real Slurm cluster for the tests: Debian's slurmctld, slurmd and munged (Slurm 22.05), started as
root with their own config, ports, state and spool directories: one compute node on loopback, or
several, each slurmd in a network namespace of its own (`nodes=`, tests/netns.py's).

`start(root)` gives a `Cluster` (its `conf`, the path clients need in SLURM_CONF); `Cluster.stop()`
cancels its jobs, ends what a job left behind (found by its SLURM_CONF) and the daemons by the pids in
their pid files (never by name: other sessions may run a Slurm of their own). At the end, what the
Slurm tests share (a held job, reading a run's id and status, aging the kept squeue answer).
The node has 2 CPUs; `gpus=N` gives each node N GPUs as Slurm's gres. No GPU exists here, and slurmd
22.05 drops a GPU without a device file (and then drains the node: "gres/gpu count reported lower than
configured"), so each stand-in GPU is a character device of /dev/null's numbers under the cluster's own
directory: Slurm schedules them, refuses a job asking more than a node has, and sets
CUDA_VISIBLE_DEVICES for a job's share, as on a real GPU node; nothing ever opens them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BINARIES = ("slurmctld", "slurmd", "munged", "sbatch", "squeue", "scancel", "scontrol")


def missing() -> list[str]:
    """The Slurm programs this machine lacks (`make test` installs them)."""
    return [name for name in BINARIES if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]


def skip_unless_runnable() -> None:
    """Skip the calling test module (at its top) where the test cluster cannot run, saying why."""
    import pytest

    if missing():
        pytest.skip(f"Slurm is not installed ({', '.join(missing())} missing): make test installs "
                    "slurmctld, slurmd, slurm-client and munge", allow_module_level=True)
    if os.geteuid() != 0:
        pytest.skip("the test Slurm cluster's daemons run as root (SlurmUser=root, munged, network namespaces)",
                    allow_module_level=True)


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
    nodes: tuple[Node, ...] = ()

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (the test's own look, not the product's)."""
        return subprocess.run(list(argv), capture_output=True, text=True, check=check,
                              env={**os.environ, **self.env}, timeout=30)

    def node_state(self) -> str:
        """Each node's state, one word per node (`idle` when all is well)."""
        out = self.run("sinfo", "--noheader", "--Node", "--nodes", self.node, "--format=%T", check=False).stdout
        return out.strip() or "unknown"

    def describe(self) -> str:
        """What Slurm says now, for a failed test's message: every job (state, reason, nodes, times), each
        node's state, and the controller log's last lines."""
        def said(*argv: str) -> str:  # a stuck slurmctld is what a failing test may be about: never raises
            try:
                done = self.run(*argv, check=False)
            except (subprocess.SubprocessError, OSError) as exc:
                return repr(exc)
            return done.stdout + done.stderr

        try:
            tail = (self.root / "log" / "slurmctld.log").read_text(errors="replace").splitlines()[-40:]
        except OSError as exc:
            tail = [repr(exc)]
        return "\n".join(["squeue:", said("squeue", "--all", "--noheader", "--format=%i %j %T %r %N start=%S end=%e"),
                          "sinfo:", said("sinfo", "--noheader", "--Node", "--format=%N %T %E"),
                          "slurmctld.log:", *tail])

    def power_off(self, name: str) -> None:
        """Node `name` fails as a machine does: its slurmd and everything running there (the job's
        slurmstepd, supervisor and job) killed at once. A node of its own network namespace only: its
        processes are the ones in that namespace (this machine's other processes are not)."""
        node = next(n for n in self.nodes if n.name == name)
        if node.netns is None:
            raise ValueError("power_off needs a node in a network namespace of its own")
        ns = os.stat(f"/var/run/netns/{node.netns}").st_ino
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                with contextlib.suppress(OSError):
                    if os.stat(entry / "ns" / "net").st_ino == ns:
                        os.kill(int(entry.name), signal.SIGKILL)

    def power_on(self, name: str) -> None:
        """A node powered off started again: its slurmd back; Slurm returns it to service when it
        registers (ReturnToService=2)."""
        _start_slurmd(self, next(n for n in self.nodes if n.name == name))
        self.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
        _wait_idle(self)

    def _end_strays(self) -> None:
        """A job whose batch step died before its children (a shell killed by a signal it did not catch)
        leaves them reparented, out of proctrack/linuxproc's sight: ended here, by the pids found."""
        for pid in _strays(self.conf):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Every job of this cluster cancelled (their slurmstepd would outlive slurmd), then the daemons
        ended by the pids in their pid files."""
        if self.run("scancel", f"--user={_user()}", check=False).returncode == 0:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.run("squeue", "--noheader", check=False).stdout.strip():
                time.sleep(0.2)
        self._end_strays()
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


def _strays(conf: Path) -> list[int]:
    """Processes of this cluster's jobs still alive: their environment names this cluster's config (a
    job's processes inherit the submitter's SLURM_CONF), a path no other cluster has."""
    needle = f"SLURM_CONF={conf}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
    return out


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


@dataclass(frozen=True)
class Node:
    """A compute node: its name, the address slurmctld reaches it at, its network namespace (None: this
    machine's own network)."""

    name: str
    addr: str = "127.0.0.1"
    netns: str | None = None


def start(root: Path, *, min_job_age: int = 300, kill_wait: int = 2, nodes: list[Node] | None = None,
          ctl_addr: str = "127.0.0.1", gpus: int = 0, preempt: bool = False, bind: bool = False) -> Cluster:
    """slurmctld + a slurmd per node (default: one, this machine on loopback) + munged under `root`;
    waits until every node is idle. Several nodes each run in a network namespace of their own
    (tests/netns.py), slurmctld on the bridge's address `ctl_addr`. `gpus`: stand-in GPUs per node
    (the module's docstring). `preempt`: a second partition, `urgent`, whose jobs preempt the default
    partition's (cancelled at once, as a cluster's PreemptMode=CANCEL does, after KillWait a KILL).
    `bind`: tasks bound to the CPUs they were given (task/affinity by cores, as most clusters do), so
    a step holds only its own CPUs; else (task/none) every process may run on any CPU."""
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
    nodes = nodes or [Node(socket.gethostname().split(".")[0])]
    names = ",".join(n.name for n in nodes)
    subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={socket_path}",
                    f"--pid-file={pids / 'munged.pid'}", f"--log-file={root / 'log' / 'munged.log'}",
                    f"--seed-file={root / 'munge' / 'seed'}"], check=True, capture_output=True, timeout=30)
    conf = root / "slurm.conf"
    # Only what a one-node cluster on loopback needs, root running everything: no cgroups (proctrack
    # by parent pid), no accounting storage (sacct says so; squeue and scontrol still answer).
    conf.write_text(
        "ClusterName=thrusttest\n"
        f"SlurmctldHost={socket.gethostname().split('.')[0]}({ctl_addr})\n"
        "AuthType=auth/munge\n"
        f"AuthInfo=socket={socket_path}\n"
        "CredType=cred/munge\n"
        "SlurmUser=root\nSlurmdUser=root\n"
        f"SlurmctldPort={_free_port()}\nSlurmdPort={_free_port()}\n"
        f"StateSaveLocation={root / 'state'}\nSlurmdSpoolDir={root / 'spool' / '%n'}\n"
        f"SlurmctldPidFile={pids / 'slurmctld.pid'}\nSlurmdPidFile={pids / 'slurmd-%n.pid'}\n"
        f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}\nSlurmdLogFile={root / 'log' / 'slurmd-%n.log'}\n"
        "ProctrackType=proctrack/linuxproc\n"
        + ("TaskPlugin=task/affinity\nTaskPluginParam=Cores\n" if bind else "TaskPlugin=task/none\n")
        + "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
        "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
        "MpiDefault=none\n"
        "SchedulerType=sched/backfill\nSchedulerParameters=sched_interval=1\n"
        f"MinJobAge={min_job_age}\nKillWait={kill_wait}\nInactiveLimit=0\nReturnToService=2\n"
        "SlurmctldTimeout=10\nSlurmdTimeout=10\nMessageTimeout=5\n"
        + ("GresTypes=gpu\n" if gpus else "")
        + "".join(f"NodeName={n.name} NodeAddr={n.addr} CPUs=2 RealMemory=2000{f' Gres=gpu:{gpus}' if gpus else ''} "
                  "State=UNKNOWN\n" for n in nodes)
        + ("PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n" if preempt else "")
        + f"PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP"
        + (" PriorityTier=1 GraceTime=0\n" if preempt else "\n")
        + (f"PartitionName=urgent Nodes={names} MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF\n"
           if preempt else "")
    )
    if gpus:
        _stand_in_gpus(root, conf, [n.name for n in nodes], gpus)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    cluster = Cluster(root, conf, names, "debug",
                      (*(pids / f"slurmd-{n.name}.pid" for n in nodes), pids / "slurmctld.pid", pids / "munged.pid"),
                      tuple(nodes))
    try:
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, capture_output=True, env=env, timeout=30)
        for n in nodes:
            (root / "spool" / n.name).mkdir(exist_ok=True)
            _start_slurmd(cluster, n)
        _wait_idle(cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _start_slurmd(cluster: Cluster, node: Node) -> None:
    # nsenter, not `ip netns exec`: that remounts /sys, and slurmd needs /sys/fs/cgroup
    enter = ["nsenter", f"--net=/var/run/netns/{node.netns}"] if node.netns else []
    subprocess.run([*enter, "slurmd", "-f", str(cluster.conf), *(["-N", node.name] if len(cluster.nodes) > 1 else [])],
                   check=True, capture_output=True, env={**os.environ, **cluster.env}, timeout=30)


def _wait_idle(cluster: Cluster) -> None:
    deadline = time.monotonic() + 30
    while set(cluster.node_state().split()) - {"idle"}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Slurm node did not come up ({cluster.node_state()!r}): "
                               f"{(cluster.root / 'log' / 'slurmctld.log').read_text()[-2000:]}")
        time.sleep(0.2)


def _stand_in_gpus(root: Path, conf: Path, names: list[str], gpus: int) -> None:
    """gres.conf (read from slurm.conf's directory) naming `gpus` stand-in device files per node."""
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    for i in range(gpus):
        with contextlib.suppress(FileExistsError):
            os.mknod(dev / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    files = f"{dev}/nvidia[0-{gpus - 1}]" if gpus > 1 else f"{dev}/nvidia0"
    (conf.parent / "gres.conf").write_text("".join(f"NodeName={name} Name=gpu File={files}\n" for name in names))


# ------------------------------------------------------------------- what the Slurm tests share

# held until the test writes `go` in the run's directory; then prints where it ran
GATED = ("command: [sh, -c, 'echo started on $SLURM_JOB_NODELIST job $SLURM_JOB_ID; "
         "while [ ! -e \"$THRUST_RUN_DIR/go\" ]; do sleep 0.1; done; echo done']")


def launched_run(stderr: str) -> str:
    return re.search(r"launching run (\S+)", stderr).group(1)


def run_status(cli, proj: Path, run_id: str) -> dict:
    result = cli("status", run_id, "--json", cwd=proj)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def next_poll(workdir: Path) -> None:
    """Age the account's kept squeue answer past POLL_S, so the next look asks Slurm: what happens 10 s
    later anyway, without the test waiting for it (the rate itself: the last test)."""
    kept = workdir / ".thrust" / "slurm" / "squeue.json"
    with contextlib.suppress(FileNotFoundError):
        answer = json.loads(kept.read_text())
        answer["at"] = 0
        kept.write_text(json.dumps(answer))


# ------------------------------------------------------------------------------------------ fixtures
# The Slurm test modules' one-node cluster and its login node, written once. A module takes them as
# `cluster = slurm_cluster.cluster_fixture(...)`, `login = slurm_cluster.login_fixture()` (pytest
# collects a fixture by the name it is assigned under: no import a linter reads as unused).

SLURM_CLIENTS = ("sacct", "sacctmgr", "salloc", "sattach", "sbatch", "sbcast", "scancel", "scontrol", "sdiag",
                 "sinfo", "sprio", "squeue", "sreport", "srun", "sshare", "sstat", "strigger")


def cluster_fixture(prefix: str, **options):
    """A module's cluster: `start(...)` with `options` (gpus=, preempt=...), stopped at the module's end."""
    import pytest

    @pytest.fixture(scope="module")
    def cluster():
        skip_unless_runnable()
        root = Path(tempfile.mkdtemp(prefix=prefix))
        started = start(root / "cluster", **options)
        try:
            yield started
        finally:
            started.stop()
            shutil.rmtree(root, ignore_errors=True)

    return cluster


def login_fixture():
    """The cluster's login node: an sshd whose sessions see the cluster (SLURM_CONF), as root."""
    import pytest
    from conftest import _start_sshd

    @pytest.fixture(scope="module")
    def login(cluster, tmp_path_factory):
        server = _start_sshd(tmp_path_factory.mktemp("login-sshd"),
                             extra_config=f"SetEnv SLURM_CONF={cluster.conf}\n")
        try:
            yield server
        finally:
            server.stop()

    return login


def slurm_keys(cluster: Cluster, indent: str = "    ") -> str:
    """A thrust.yaml host's Slurm keys: the cluster's partition, 10 minutes, the whole node (2 CPUs), so a
    second run waits for the first."""
    return (f"{indent}scheduler: slurm\n{indent}partition: {cluster.partition}\n{indent}time: \"10:00\"\n"
            f"{indent}sbatch: {{cpus-per-task: 2}}\n")


@dataclass
class LoginNode:
    """A login node as real clusters have them: an account whose shell is /bin/sh, whose plain `sh -c`
    (what sshd runs a command with) has no Slurm: its PATH (sshd's SetEnv) holds every program but Slurm's
    clients, and no SLURM_CONF. `~/.profile` loads a `module load`-like script (`modules/slurm`) that
    puts Slurm's commands on PATH and names the cluster: only a login shell's environment has them."""

    server: object  # conftest.SSHServer
    account: str
    home: Path
    keys: str  # the host's Slurm keys (slurm_keys)

    def project(self, path: Path, jobs: str, *, login_shell: bool) -> Path:
        """A project whose host `sandbox` is this login node (workdir in the account's home; the system
        python, which the account can read), Slurm's keys, and `login_shell: true` when asked."""
        from helpers import new_project

        proj = new_project(path, self.server, self.home / "unused", jobs=jobs, python=Path("/usr/bin/python3"))
        cfg = proj / "thrust.yaml"
        text = re.sub(r"address: \w+@", f"address: {self.account}@", cfg.read_text())
        text = re.sub(r"workdir: .*", f"workdir: {self.home / 'thrust'}", text, count=1)
        keys = self.keys + ("    login_shell: true\n" if login_shell else "")
        cfg.write_text(text.replace("    connect_timeout: 5\n", f"    connect_timeout: 5\n{keys}", 1))
        return proj


def login_node_fixture():
    """The cluster's login node whose Slurm is reachable only through the login environment (LoginNode)."""
    import pytest
    from conftest import _start_sshd
    from helpers import throwaway_account

    @pytest.fixture(scope="module")
    def login_node(cluster):
        # not under pytest's 0700 base directory: the account must reach the sshd's keys and these programs
        root = Path(tempfile.mkdtemp(prefix="thrust-login-node-"))
        plain, slurm = root / "bin", root / "slurm" / "bin"
        plain.mkdir()
        slurm.mkdir(parents=True)
        for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
            for program in Path(folder).iterdir():
                target = (slurm if program.name in SLURM_CLIENTS else plain) / program.name
                if not target.exists() and not target.is_symlink():
                    target.symlink_to(program)
        module = root / "modules" / "slurm"
        module.parent.mkdir()
        module.write_text(f'PATH="{slurm}:$PATH"\nSLURM_CONF={cluster.conf}\nexport PATH SLURM_CONF\n')
        root.chmod(0o755)
        # the account's clients reach the cluster as a login node's do: its slurm.conf and munge's socket
        # (the key stays root's: 0400); a directory only passed through, as /run/munge on a real node
        for folder in (cluster.root.parent, cluster.root, cluster.root / "munge"):
            folder.chmod(folder.stat().st_mode | 0o011)
        server = _start_sshd(root / "sshd", extra_config=f"SetEnv PATH={plain}\n")
        try:
            with throwaway_account(server) as (account, home):
                profile = home / ".profile"
                profile.write_text(f"# what `module load slurm` does on a real cluster\n. {module}\n")
                shutil.chown(profile, account, account)
                yield LoginNode(server, account, home, slurm_keys(cluster))
        finally:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)

    return login_node
