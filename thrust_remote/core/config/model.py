"""What thrust.yaml configures, as frozen dataclasses: the hosts, the jobs, notifications and the whole
Config with its look-ups (a host by name or group, a job, a job's notify). The names a section's values
are checked against live beside the field they fill."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from thrust_remote.core.config.discovery import CONFIG_NAME, project_root
from thrust_remote.core.config.sections import FlagsConfig, IdleStop, MetricsConfig, ObjectiveConfig, RetryConfig
from thrust_remote.core.errors import UnknownHostError, UsageError
from thrust_remote.core.scheduler import SlurmConfig

# optimize's best params: `<study>-best.yaml` in the project, its first line ending with the mark (so a
# sync knows the file is this tool's output, not code the run lacks)
BEST_PARAMS_SUFFIX = "-best.yaml"
BEST_PARAMS_MARK = "(thrust-remote optimize)"
LOCAL = "local"

HOST_KEY_POLICIES = ("strict", "accept-new")
# how a host is reached (HostConfig.kind): "local" runs here, "ssh" over SSH to its address; opening a host
# looks its kind up in one table (host/), so a new way to reach a host adds a kind, not a branch
HOST_KINDS = ("local", "ssh")
# a host's `keep: {runs: N}` by default: the trees of the newest 10 ended runs stay (docs/architecture.md,
# "Trees"); a running or queued run's tree always stays
DEFAULT_KEEP_RUNS = 10
# trainer: the built-in trainer; python: your own script or module; command: any argv; cargo: tch-rs.
# `kind: python` without script:/module: is the built-in trainer (what it meant before kinds existed).
JOB_KINDS = ("trainer", "python", "cargo", "command")
# How a job of your own takes its flags (`flags: {style, names}`, docs/architecture.md "Job kinds"):
# `--set`, an `args:` mapping and optimize's parameters are written in its style; the first style is a
# python or cargo job's default, `key=value` a command job's. `names: dashes` writes learning_rate as
# learning-rate; `as-is` (the default) passes the name as it was written.
FLAG_STYLES = ("--key value", "--key=value", "key=value", "-k value")
FLAG_NAMES = ("as-is", "dashes")
COMMAND_STYLE = "key=value"

# Environment overrides (flags still win over these): the path of thrust.yaml, the default host
# (default_host), and tracebacks on errors (1/true).
ENV_CONFIG, ENV_HOST, ENV_DEBUG = "THRUST_CONFIG", "THRUST_HOST", "THRUST_DEBUG"


@dataclass(frozen=True)
class HostConfig:
    name: str
    address: str | None = None  # None for the local host
    workdir: str = "~/thrust"
    python: str = "python3"
    identity: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    host_key_policy: str = "strict"
    gpus: tuple[int, ...] | None = None
    connect_timeout: float = 10.0
    cpu_slots: int = 1  # `train --queue` on a host without GPUs: how many runs at once, the others wait
    # several hosts, one run (docs/architecture.md, "Several hosts"): how the other nodes reach this
    # one when it is node 0 (default: the address its SSH connection resolves to), a fixed rendezvous
    # port (default: a free one, checked there), the interface NCCL/gloo use (default: from `ip route get`)
    rdzv_address: str | None = None
    rdzv_port: int | None = None
    ifname: str | None = None
    keep_runs: int = DEFAULT_KEEP_RUNS  # `keep: {runs: N}`: the trees of the newest N ended runs stay
    # where torchvision / torchaudio built for the host's torch variant (`+cpu`, `+cu128`) come from:
    # `{variant}` is that label (None: PyTorch's own index, run/venv.py TORCH_INDEX); a mirror's URL
    torch_index: str | None = None
    # `scheduler: slurm`: a cluster's login node; runs are submitted with sbatch (core/scheduler.py)
    slurm: SlurmConfig | None = None
    # not a thrust.yaml key: the config file the user named (--config / THRUST_CONFIG), absolute, so
    # that a hint's command reads the same file (hints.command_hint); None when it was found by search
    config_path: str | None = None

    @property
    def kind(self) -> str:
        """How the host is reached, one of HOST_KINDS: "local" when it has no address, else "ssh"."""
        return HOST_KINDS[0] if self.address is None else HOST_KINDS[1]

    @property
    def is_local(self) -> bool:
        return self.kind == HOST_KINDS[0]


@dataclass(frozen=True)
class NotifyConfig:
    """`notify:` (top level, or a job's own, which replaces it): what runs on the laptop when a followed
    run ends (docs/architecture.md, "Notifications")."""

    command: tuple[str, ...] = ()  # argv, never a shell string; THRUST_RUN_* in its environment
    webhook: str | None = None  # an http(s) URL, or $NAME / ${NAME}: the URL is that variable's value here
    desktop: bool = False  # notify-send or osascript, where present

    @property
    def enabled(self) -> bool:
        return bool(self.command or self.webhook or self.desktop)


@dataclass(frozen=True)
class Workers:
    """`workers: {count: FLAG, port: FLAG}`: the job starts its own worker processes (e.g. with
    torch.multiprocessing.spawn), so it is started once, never under torchrun: the process count
    (--nproc, else one per GPU) reaches it as `COUNT_FLAG N`, and a port free on its node as `PORT_FLAG P`."""

    count: str
    port: str | None = None


@dataclass(frozen=True)
class JobConfig:
    """One job of thrust.yaml (docs/architecture.md, "Config (thrust.yaml)": the job kinds)."""

    name: str
    kind: str = "trainer"
    # trainer: flags as a mapping (--key value); python: a list (passed as is) or a mapping;
    # cargo: a list of argv items; command: none (its argv is `command`)
    args: Mapping[str, Any] | tuple[str, ...] = field(default_factory=dict)
    export: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    requirements: tuple[str, ...] = ()  # pip specs for the job's venv (python and command jobs)
    requirements_file: str | None = None  # a requirements file in the repo
    script: str | None = None  # python: a path in the repo, run as `PYTHON SCRIPT ARGS...`
    module: str | None = None  # python: run as `PYTHON -m MODULE ARGS...`
    nproc: int | None = None  # processes under torchrun (None: one, or one per GPU with --gpus)
    command: tuple[str, ...] = ()  # command: the argv, run as is in the checkout
    workers: Workers | None = None  # python, command: it starts its own workers (never under torchrun)
    artifacts: tuple[str, ...] = ()  # globs under the job's working directory on the host
    # `metrics: {tensorboard: DIR, pattern: REGEX}` (named groups read from the job's own log lines);
    # neither: THRUST_METRICS lines only
    metrics: MetricsConfig = MetricsConfig()
    flags: FlagsConfig = FlagsConfig()  # `flags: {style: FLAG_STYLES[i], names: FLAG_NAMES[j]}`
    objective: ObjectiveConfig | None = None  # `objective: {metric: NAME, mode: max|min}`; None: none written
    notify: NotifyConfig | None = None  # the job's own `notify:`; None: the top level's
    # {"below": PERCENT, "minutes": M, "every": S}: stopped when its GPUs idle that long (agent/idlewatch.py)
    idle_stop: IdleStop | None = None
    # seconds a run of the job may run before its supervisor stops it (agent/agewatch.py); None: no bound
    max_duration: float | None = None
    # runs that outlive their host (docs/architecture.md, "Checkpoints and resume"): the glob of the job's
    # checkpoints (relative to the checkout, or $THRUST_RUN_DIR/...), the arguments that continue from one
    # ("{checkpoint}" is its path on the host), where the job reads it instead (`resume: {args: [...],
    # checkpoint_at: PATH}`: relative to its working directory, the checkpoint is put there; None: the
    # arguments name it), seconds between pulls while a run is followed (None: the default, 0: off), and
    # the retry policy (`retry: {max: N, on: [...], hosts: [...], grace: S}`; None: none)
    checkpoints: str | None = None
    resume: tuple[str, ...] = ()
    resume_at: str | None = None
    sync_every: float | None = None
    retry: RetryConfig | None = None
    # data that is not in git (docs/architecture.md, "Trees"): laptop paths placed into each run's tree,
    # a command run in the tree before the job (once per host for the same inputs), paths of the tree
    # kept across runs on a host. None: the top level's (`Config.files`...), () none.
    files: tuple[str, ...] | None = None
    setup: tuple[str, ...] | None = None
    shared: tuple[str, ...] | None = None
    # thrust.yaml's line of each key the job wrote, and of the job's name under "job": a check after
    # the sync (a script missing from the synced commit) names file:line as the loader does
    lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # not a thrust.yaml key: the config file the user named (--config / THRUST_CONFIG), as HostConfig's,
    # for the hints; not part of what the job is
    config_path: str | None = field(default=None, compare=False)
    # cargo jobs
    toolchain: str = "stable"
    example: str | None = None
    crate: str = "."
    artifact: str | None = None
    tch_version: str = "auto"
    bypass_version_check: bool = False


@dataclass(frozen=True)
class Config:
    path: Path | None
    default_host: str = LOCAL
    hosts: Mapping[str, HostConfig] = field(default_factory=dict)
    jobs: Mapping[str, JobConfig] = field(default_factory=dict)
    search: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name -> host names, in node order
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    # `files:`, `setup:`, `shared:` at the top level: every job's that gives none of its own
    files: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()
    data_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # each searched parameter's line, "JOB.PARAM" -> line: optimize names the key a trial's usage error came from
    search_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    # the user named this file (--config / THRUST_CONFIG) rather than it being found upwards
    given: bool = False
    default_from_env: bool = False  # default_host is THRUST_HOST's: an unknown one says where it came from

    @property
    def given_path(self) -> str | None:
        """The config file as hints repeat it (`--config PATH`, absolute): only when the user named it."""
        return str(self.path.resolve()) if self.given and self.path else None

    @cached_property
    def root(self) -> Path:
        """The project: the git work tree the thrust.yaml belongs to; a config kept outside any work
        tree (`--config /elsewhere/thrust.yaml`) only configures the work tree the command runs in."""
        return project_root(Path.cwd(), self.path, given=self.given)

    def host(self, name: str | None = None) -> HostConfig:
        from_env = not name and self.default_from_env
        name = name or self.default_host
        if name not in self.hosts and name in self.groups:
            raise UsageError(f"{name!r} is a group of hosts ({', '.join(self.groups[name])}); this command "
                             "takes one host", "name one of them with --host")
        if name not in self.hosts:
            known = ", ".join(sorted(self.hosts))
            where = f" in {self.path}" if self.path else " (no thrust.yaml found)"
            near = self._near_host(name)
            said = f" (from {ENV_HOST} in your environment)" if from_env else ""
            raise UnknownHostError(
                f"unknown host {name!r}{said}{near}{where}; known hosts: {known}",
                (f"unset {ENV_HOST} or set it to a known host; or " if from_env else "")
                + ("give that host's name" if " is the address of host " in near else
                   f"add it under `hosts:` in {self.path or CONFIG_NAME} (address: user@host[:port] or an "
                   "~/.ssh/config alias)"),
            )
        return self.hosts[name]

    def _near_host(self, name: str | None) -> str:
        """A configured host whose address is what was typed (its SSH alias, or user@alias), else a near name."""
        for host in self.hosts.values():
            address = host.address or ""
            if name and name in (address, address.rpartition("@")[2].split(":")[0]):
                return f" ({name!r} is the address of host {host.name!r}: --host {host.name})"
        return _did_you_mean(name, [*self.hosts, *self.groups])

    def host_list(self, names: Sequence[str] | None) -> list[HostConfig]:
        """`--host a --host b` (a group name stands for its hosts, in order): the hosts, node 0 first.
        None or empty: the default host alone. A host named twice is a usage error."""
        out: list[HostConfig] = []
        for name in names or [self.default_host]:
            members = self.groups.get(name, (name,)) if name not in self.hosts else (name,)
            for member in members:
                host = self.host(member)
                if host in out:
                    raise UsageError(f"host {member!r} is named twice (--host / groups: in {CONFIG_NAME})",
                                     "name each host once: every host is one node of the run")
                out.append(host)
        return out

    def notify_for(self, job: str | None) -> NotifyConfig:
        """A job's own `notify:` when it has one, else the top level's."""
        own = self.jobs[job].notify if job in self.jobs else None
        return own if own is not None else self.notify

    def job(self, name: str) -> JobConfig:
        if name not in self.jobs:
            raise UsageError(
                f"unknown job {name!r}{_did_you_mean(name, self.jobs)}; known jobs: {', '.join(sorted(self.jobs))}",
                f"add it under `jobs:` in {self.path or CONFIG_NAME}",
            )
        return self.jobs[name]


def _did_you_mean(name: str | None, known: Sequence[str]) -> str:
    close = difflib.get_close_matches(name or "", list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def builtin_jobs() -> dict[str, JobConfig]:
    """snake and cartpole work with no thrust.yaml at all."""
    return {
        "snake": JobConfig(name="snake", args={"env": "snake"}, export="web/public/snake.onnx"),
        "cartpole": JobConfig(name="cartpole", args={"env": "cartpole"}, export="web/public/cartpole.onnx"),
    }


def local_host(workdir: str | None = None) -> HostConfig:
    # The local host runs in the project itself (the code is already exactly what the user has), with
    # the interpreter thrust-remote runs in: the one its installer gave torch.
    return HostConfig(name=LOCAL, address=None, workdir=workdir or ".", python=sys.executable or "python3")


def defaults(path: Path | None) -> Config:
    """What no thrust.yaml at all gives: the host `local`, the jobs `snake` and `cartpole`."""
    return Config(path=path, hosts={LOCAL: local_host()}, jobs=builtin_jobs())
