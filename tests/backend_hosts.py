"""The two backends a run can take, as hosts for tests/test_backends.py: one project and its host(s) each.

- `direct`: a plain SSH box (the session's `sshd` fixture); two nodes are two host entries on that one
  sshd, each with its own workdir (loopback nodes: test_multinode's last test), so a run over two nodes
  needs no network namespace.
- `slurm`: a real Slurm cluster (tests/slurm_cluster.py) reached through its login node, an sshd whose
  sessions get SLURM_CONF (test_slurm.py). Two compute nodes in network namespaces of their own where this
  machine can make them (test_slurm_nodes.py), so the same cluster also runs `--nodes 2`; one node on
  loopback where it cannot (then the two-node test skips, saying why). One cluster serves every test.

Each backend says how to write its thrust.yaml host entry (`host_entry`), how to ask for two nodes
(`two_nodes`), and where node I's run directory is (`node_run_dir`). The project is the same for both:
`project_files` and `JOBS`.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import slurm_cluster
from conftest import SSHServer, _start_sshd
from helpers import FAKE_JOB, commit, fake_files, git_init, remote_tempdir
from slurm_cluster import next_poll

# Held until the test writes `go` in the run's directory: never a sleep for a test to wait out.
GATED_CMD = ("[sh, -c, 'echo started; while [ ! -e \"$THRUST_RUN_DIR/go\" ]; do sleep 0.1; done; "
             "echo done']")

# Writes its checkpoint at once, then runs until stopped (TERM: the exit a stop gives); resumed, it says
# from which step and ends.
CKPT_SH = """\
#!/bin/sh
if [ "$1" = --resume-from ]; then echo "resumed from step $(cat "$2")"; exit 0; fi
mkdir -p ckpt
echo 7 > ckpt/.t && mv ckpt/.t ckpt/step.txt
echo "checkpoint at step 7"
trap 'echo "stopped at step 7"; exit 143' TERM
while :; do sleep 0.1; done
"""

# One python process a node under torchrun (no torch import of its own): each rank leaves a file; with
# --hold it then runs until stopped, saying so on TERM (a job that checkpoints there).
RANKS_PY = """\
import os, signal, sys, time
name = "rank-%s-of-%s" % (os.environ["RANK"], os.environ["WORLD_SIZE"])
with open(os.path.join(os.environ["THRUST_RUN_DIR"], name), "w") as fh:
    fh.write(os.environ.get("SLURM_JOB_ID", "") + "\\n")
print("rank %s ran" % os.environ["RANK"], flush=True)
def term(*_):
    print("rank %s got TERM" % os.environ["RANK"], flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, term)
while "--hold" in sys.argv:
    time.sleep(0.1)
"""

# optimize's objective: the score is the parameter, so both trials' values are known
SCORE_SH = """\
#!/bin/sh
for w in "$@"; do case "$w" in lr=*) lr="${w#lr=}";; esac; done
echo "THRUST_METRICS {\\"step\\": 1, \\"charts/score\\": $lr}"
"""

JOBS = (
    "jobs:\n"
    f"  gated:\n    command: {GATED_CMD}\n"
    + FAKE_JOB.replace("    objective:", "    artifacts: [\"$THRUST_RUN_DIR/metrics.jsonl\"]\n    objective:")
    + "  ckpt:\n    command: [sh, ckpt.sh]\n    checkpoints: ckpt/*.txt\n"
    "    resume: [--resume-from, '{checkpoint}']\n"
    "  ranks:\n    script: ranks.py\n"
    "  words:\n    command: [sh, score.sh]\n    objective: {metric: charts/score, mode: max}\n"
    "search:\n  words: {lr: {choices: [0.1, 0.3, 0.7]}}\n"
)


def project_files() -> dict[str, str]:
    return {**fake_files(), "ckpt.sh": CKPT_SH, "ranks.py": RANKS_PY, "score.sh": SCORE_SH}


def plain_entry(server: SSHServer, name: str, workdir: Path) -> str:
    """A thrust.yaml host entry for `server`, as a user writes one for an SSH box."""
    hc = server.host_config(name, workdir=str(workdir))
    return (f"  {name}:\n    address: {hc.address}\n    workdir: {hc.workdir}\n    python: {hc.python}\n"
            f"    identity: {hc.identity}\n    known_hosts: {hc.known_hosts}\n    connect_timeout: 5\n")


@dataclass
class BackendHost:
    """One backend's host for the behaviour tests: the project whose default host it is, that host's
    workdir, the CLI arguments of a run over two nodes (None: not here, `why_not_two` says why), and where
    node I of a run keeps its run directory."""

    name: str
    project: Path
    workdir: Path
    node_run_dir: Callable[[int, str], Path] = field(repr=False)
    two_nodes: list[str] | None = None
    why_not_two: str = ""
    cluster: slurm_cluster.Cluster | None = None

    def run_dir(self, run_id: str) -> Path:
        return self.workdir / ".thrust" / "runs" / run_id

    def fresh(self) -> None:
        """The next look asks the scheduler, not the answer it keeps for 10 s (a direct host keeps none)."""
        if self.cluster is not None:
            next_poll(self.workdir)

    def describe(self) -> str:
        """What the scheduler says now, for a failed assertion's message."""
        return self.cluster.describe() if self.cluster is not None else ""


def make_project(path: Path, entries: str) -> Path:
    """The project both backends run: `project_files`, a thrust.yaml whose hosts are `entries` (the first
    the default host, `sandbox`), `JOBS`, all committed."""
    path.mkdir(parents=True)
    for name, text in project_files().items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    (path / "thrust.yaml").write_text("default_host: sandbox\nhosts:\n" + entries + JOBS)
    git_init(path)
    commit(path, "the backends' project")
    return path


@contextlib.contextmanager
def direct(sshd: SSHServer, root: Path) -> Iterator[BackendHost]:
    """The session's sshd as the host `sandbox`, and as `second` (another workdir) for node 1."""
    base = remote_tempdir(sshd, prefix="backend-")
    workdirs = (base / "w0", base / "w1")
    entries = plain_entry(sshd, "sandbox", workdirs[0]) + plain_entry(sshd, "second", workdirs[1])
    proj = make_project(root / "project", entries)
    try:
        yield BackendHost("direct", proj, workdirs[0],
                          lambda node, run_id: workdirs[node] / ".thrust" / "runs" / run_id,
                          two_nodes=["--host", "sandbox", "--host", "second"])
    finally:
        shutil.rmtree(base, ignore_errors=True)


def slurm_entry(server: SSHServer, name: str, workdir: Path, partition: str) -> str:
    """A thrust.yaml host entry for a Slurm cluster's login node: the plain one plus the scheduler's keys."""
    return plain_entry(server, name, workdir) + f"    scheduler: slurm\n    partition: {partition}\n" \
        "    time: \"10:00\"\n"


@contextlib.contextmanager
def slurm(root: Path) -> Iterator[BackendHost]:
    """A cluster (two nodes in network namespaces, else one on loopback) and its login node as `sandbox`.
    Skips as test_slurm.py does where the cluster cannot run (slurm_cluster.skip_unless_runnable: in a
    fixture it skips the tests that use it, not the module)."""
    import netns

    slurm_cluster.skip_unless_runnable()
    why = netns.unavailable()
    with contextlib.ExitStack() as stack:
        if why is None:
            net = stack.enter_context(netns.Network(2))
            nodes = [slurm_cluster.Node(h.name, h.ip, h.netns) for h in net.hosts]
            cluster = slurm_cluster.start(root / "cluster", nodes=nodes, ctl_addr=f"{net.subnet}.1")
        else:
            cluster = slurm_cluster.start(root / "cluster")
        stack.callback(cluster.stop)
        login = _start_sshd(root / "login", extra_config=f"SetEnv SLURM_CONF={cluster.conf}\n")
        stack.callback(login.stop)
        workdir = remote_tempdir(login) / "hpc"  # the cluster's shared disk: the nodes see it as the login does
        proj = make_project(root / "project", slurm_entry(login, "sandbox", workdir, cluster.partition))

        def node_run_dir(node: int, run_id: str) -> Path:
            """A run over several nodes keeps node I's files in its run directory's nodes/I/ (node 0's: the
            run's own), on the disk every node shares."""
            run_dir = workdir / ".thrust" / "runs" / run_id
            return run_dir / "nodes" / str(node) if node else run_dir

        yield BackendHost("slurm", proj, workdir, node_run_dir,
                          two_nodes=None if why else ["--nodes", "2"],
                          why_not_two=f"a Slurm cluster of two nodes needs network namespaces: {why}", cluster=cluster)
