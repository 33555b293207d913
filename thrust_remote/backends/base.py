"""The backend seam's words: the protocol every backend answers, what a run asks of one, and the one
model of a run's nodes (docs/architecture.md, "Backends")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from thrust_remote.agent.protocol import StatusAnswer
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ThrustError
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.report import Check
from thrust_remote.host.session import HostSession
from thrust_remote.run import jobs
from thrust_remote.run.stages import Prepared
from thrust_remote.run.vocab import Launched, Reporter, TrainRequest


@dataclass(frozen=True)
class Node:
    """One node of a run: `name` as the user sees it (its host, or the name a cluster's scheduler gave
    it), `host` the host it is reached through, `session` None when that host did not answer, `part`
    where its part of the run dir is: "" the run dir itself (node 0, or a node on a host of its own),
    else a path under it (node I of a scheduler's run: the run dir's nodes/I)."""

    name: str
    host: str
    session: HostSession | None
    part: str = ""


@dataclass
class RunNodes:
    """A run's nodes in rank order: node 0 (rank 0's log, the checkpoints, the model) first. `together`:
    one host's scheduler runs them as one job and ends them together (the laptop watches its host
    alone); otherwise each node is a run on a host of its own, watched and stopped by the laptop."""

    run_id: str
    nodes: list[Node]
    together: bool = False

    @classmethod
    def on_hosts(cls, run_id: str, names: Sequence[str], sessions: Sequence[HostSession | None]) -> RunNodes:
        """A run over hosts: node I is host `names[I]`, its run dir that host's own."""
        return cls(run_id, [Node(n, n, s) for n, s in zip(names, sessions, strict=True)])

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def sessions(self) -> list[HostSession | None]:
        return [n.session for n in self.nodes]

    @property
    def many(self) -> bool:
        """Several nodes on hosts of their own: each watched, asked and stopped by the laptop."""
        return len(self.nodes) > 1 and not self.together

    def watched(self) -> RunNodes:
        """The nodes the laptop watches: every one over hosts; the head alone when the host's scheduler
        holds them (its job ends them together)."""
        return RunNodes(self.run_id, self.nodes[:1]) if self.together else self


@dataclass(frozen=True)
class RunAsk:
    """What one host's run asks of its backend: `train`'s request on that host, or an optimize trial.
    `gpus`: --gpus (a count or a list); `slot`: a trial's GPUs, taken as they are (a scheduler: their
    count); `base_args`: a train's arguments before a checkpoint's (what a run that continues itself
    resumes with), None for a trial; `rdzv`/`queue_order`: a node of a run over several hosts."""

    request: TrainRequest  # a trial's: its job and host, its nproc
    args: tuple[str, ...]
    run_id: str | None
    slot: tuple[int, ...] | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
    export: bool = True
    base_args: tuple[str, ...] | None = None
    rdzv: jobs.Rendezvous | None = None
    queue_order: float | None = None


class Backend(Protocol):
    """How a run is launched and continued on one kind of host, and what is shown of it."""

    scheduler: str  # the name its runs are submitted to ("": started by the host itself)
    continues_on: tuple[str, ...]  # the retry events whose next attempt the host submits by itself

    def check(self, request: TrainRequest, own: Sequence[HostConfig], alone: bool) -> None:
        """What a run cannot be on `own`, its hosts of this backend (`alone`: it has no other), said
        before anything connects (64)."""

    def check_facts(self, request: TrainRequest, facts: Mapping[str, Any], host: HostConfig) -> None:
        """What a run cannot be on this host as its preflight found it, before anything is set up (64)."""

    def launch(self, prepared: Prepared, ask: RunAsk, reporter: Reporter) -> Launched:
        """One host's run launched (started, queued or submitted): a train's and an optimize trial's."""

    def slots(self, facts: Mapping[str, Any], host: HostConfig, gpus: str | None, parallel: int | None,
              slots_per_gpu: int) -> list[tuple[str, tuple[int, ...]]]:
        """optimize's slots on this host: (name, the GPUs a trial there gets)."""

    def explain(self, answer: Mapping[str, object], run_id: str, host: HostConfig) -> ThrustError | None:
        """A launch refusal in this backend's words (None: not one of its own)."""

    def nodes(self, run_id: str, session: HostSession, status: StatusAnswer) -> RunNodes | None:
        """The run's nodes when this host's scheduler spread it over several (read from its status);
        None when the run is this host's alone or its nodes are hosts of their own (run.json's)."""

    def shown(self, status: StatusAnswer, host: str) -> StatusAnswer:
        """The host's status answer as `status` shows it (its nodes listed as a run over hosts lists its)."""

    def fields(self, status: StatusAnswer) -> dict[str, Any]:
        """The fields `status` adds to a run's line (name -> value)."""

    def node_label(self, node: Mapping[str, Any]) -> str:
        """A node of `status`'s nodes as the user knows it."""

    def doctor_checks(self, fleet: Fleet, host: HostConfig, workdir: str) -> list[Check]:
        """doctor's rows of what this kind of host adds to its checklist."""
