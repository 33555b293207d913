"""The direct backend: a run is a detached process the host's agent starts on an SSH box or `local`,
on the GPUs it is given (claimed there unless shared), or waiting in the host's own queue (--queue:
its GPUs, or one of its `cpu_slots`); a run over several SSH hosts is one such process per host under
torchrun's c10d rendezvous (run/multinode.py plans it), watched and stopped by the laptop."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from thrust_remote.agent.protocol import RunState, StatusAnswer
from thrust_remote.backends.base import RunAsk, RunNodes
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ThrustError, UsageError
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.report import Check
from thrust_remote.host.session import HostSession
from thrust_remote.run import stages
from thrust_remote.run.gpus import host_gpus, select_gpus
from thrust_remote.run.stages import LaunchPlan, Prepared
from thrust_remote.run.vocab import Launched, Reporter, TrainRequest
from thrust_remote.runs import control


class Direct:
    """A run its host's agent starts (or queues) itself."""

    scheduler = ""
    continues_on: tuple[str, ...] = ()

    def check(self, request: TrainRequest, own: Sequence[HostConfig], alone: bool) -> None:
        if alone and request.nodes > 1:  # --nodes is what a cluster's scheduler gives
            raise UsageError(f"--nodes {request.nodes}: nodes are a Slurm cluster's to give ({own[0].name} is not one)",
                             "over SSH boxes, name each host: --host a --host b (or a group)")

    def check_facts(self, request: TrainRequest, facts: Mapping[str, Any], host: HostConfig) -> None:
        if request.gpus:  # GPUs a host can never give: 64 before any set-up
            select_gpus(request.gpus, facts, host, request.job)

    def launch(self, prepared: Prepared, ask: RunAsk, reporter: Reporter) -> Launched:
        """A trial on its slot's GPUs as they are; with --queue, what the run waits for on the host when
        that is taken; a node of a run over hosts on none of its own; else the GPUs --gpus asks for,
        claimed on the host unless shared."""
        request, facts, session = ask.request, prepared.report.facts, prepared.session
        queue = None
        if ask.slot is not None:
            gpus, exclusive = list(ask.slot), False
        elif request.queue:
            gpus, queue = queue_ask(request, facts, ask.queue_order)
            exclusive = bool(gpus)
        elif ask.rdzv is not None:
            gpus, exclusive = [], False
        else:
            if not request.gpus and not host_gpus(facts, session.host):
                _say_cpu_slots_taken(session, reporter)
            gpus = choose_gpus(request, facts, lambda: {} if request.share_gpus else control.gpus_taken(session))
            exclusive = bool(gpus) and not request.share_gpus
        plan = LaunchPlan(args=ask.args, run_id=ask.run_id, gpus=tuple(gpus), exclusive_gpus=exclusive,
                          nproc=request.nproc, extra_env=ask.extra_env, meta=ask.meta, export=ask.export,
                          rdzv=ask.rdzv, queue=queue)
        return stages.launch_prepared(prepared, plan, reporter)

    def slots(self, facts: Mapping[str, Any], host: HostConfig, gpus: str | None, parallel: int | None,
              slots_per_gpu: int) -> list[tuple[str, tuple[int, ...]]]:
        """`--gpus 0,2` → those GPUs (refused up front unless the host has them); default: all of the
        host's GPUs; no GPU → `--parallel` CPU slots. `slots_per_gpu` > 1 shares a GPU between trials."""
        chosen = _chosen_gpus(gpus, host_gpus(facts, host), host)
        if not chosen:
            return [(f"cpu{i}", ()) for i in range(parallel or 1)]
        slots = [(f"gpu{g}" if slots_per_gpu == 1 else f"gpu{g}.{k}", (g,))
                 for k in range(slots_per_gpu) for g in chosen]
        if parallel is not None:
            if parallel > len(slots):
                names = ", ".join(name for name, _ in slots)
                raise UsageError(f"--parallel {parallel}: only {len(slots)} GPU slot(s) ({names})",
                                 "add GPUs with --gpus, or share them with --slots-per-gpu M")
            slots = slots[:parallel]
        return slots

    def explain(self, answer: Mapping[str, object], run_id: str, host: HostConfig) -> ThrustError | None:
        return None

    def nodes(self, run_id: str, session: HostSession, status: StatusAnswer) -> RunNodes | None:
        return None

    def shown(self, status: StatusAnswer, host: str) -> StatusAnswer:
        return status

    def fields(self, status: StatusAnswer) -> dict[str, Any]:
        return {}

    def node_label(self, node: Mapping[str, Any]) -> str:
        return str(node["host"])

    def doctor_checks(self, fleet: Fleet, host: HostConfig, workdir: str) -> list[Check]:
        return []


BACKEND = Direct()


def choose_gpus(request: TrainRequest, facts: Mapping[str, Any], taken: Callable[[], Mapping[int, str]]) -> list[int]:
    """`--gpus`: a list is taken as given (the host refuses GPUs a RUNNING run holds, unless
    shared); a count picks among the GPUs no RUNNING run holds (`taken`: GPU -> run id)."""
    spec = (request.gpus or "").strip()
    if not spec.isdigit():
        return select_gpus(request.gpus, facts, request.host)
    held = taken()
    free = [g for g in host_gpus(facts, request.host) if g not in held]
    if held and int(spec) > len(free):
        other = sorted(set(held.values()))[0]
        raise ThrustError(
            f"--gpus {spec}: {request.host.name} has {len(free)} GPU(s) free; "
            f"{', '.join(f'GPU {g}: {r}' for g, r in sorted(held.items()))} (RUNNING)",
            f"{control.see_or_stop(other, request.host)}; or share them with --allow-shared-gpus",
        )
    return select_gpus(request.gpus, facts, replace(request.host, gpus=tuple(free)) if held else request.host)


def queue_ask(request: TrainRequest, facts: Mapping[str, Any],
              order: float | None) -> tuple[list[int], control.QueueAsk]:
    """`train --queue`: the GPUs to claim now (a list given, or every GPU of the host when none is asked:
    the run would see them all) and what it waits for; `--gpus N` is chosen on the host when it starts.
    A request that can never fit is refused here (64), before anything is sent."""
    spec = (request.gpus or "").strip()
    have = host_gpus(facts, request.host)
    if spec.isdigit():
        select_gpus(spec, facts, request.host)  # more than the host has: refused now, it never fits
        return [], control.QueueAsk(order, count=int(spec), pool=tuple(have))
    gpus = select_gpus(spec, facts, request.host) if spec else have
    return gpus, control.QueueAsk(order, gpus=tuple(gpus), cpu_slots=request.host.cpu_slots)


def _say_cpu_slots_taken(session: HostSession, reporter: Reporter) -> None:
    """A run without --queue on a host without GPUs starts at once, as it always has; when RUNNING runs
    already fill the host's `cpu_slots`, it is told that it shares the CPU with them (--queue waits)."""
    slots = session.host.cpu_slots
    holders = [r["run_id"] for r in control.list_runs(session)
               if r.get("state") == RunState.RUNNING and not r.get("gpus")]
    if len(holders) >= slots:
        reporter.warn(f"{session.name}'s cpu_slots ({slots}) are taken by RUNNING run(s) {', '.join(holders)}: this "
                      "run starts now and shares the CPU with them; `train --queue` waits for a free slot instead")


def _chosen_gpus(gpus: str | None, have: list[int], host: HostConfig) -> list[int]:
    """`--gpus 0,2` → those (refused unless the host has them); none given → all of the host's."""
    if not gpus:
        return have
    try:
        chosen = [int(x) for x in gpus.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {gpus!r}: expected a list of GPU indices like 0,1,2,3") from None
    bad = [g for g in chosen if g not in have]
    if bad or not chosen or len(set(chosen)) != len(chosen):
        listed = ", ".join(map(str, have)) if have else "none"
        raise UsageError(f"--gpus {gpus}: {host.name} has GPUs [{listed}]; "
                         f"{bad or 'duplicates'} not among them",
                         "leave --gpus out to use all of them" if have else
                         "this host has no GPU nvidia-smi lists: use --parallel K for K CPU slots")
    return chosen
