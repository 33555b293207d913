"""The Slurm backend: a host that is a Slurm cluster's login node (`scheduler: slurm`). A run is a job
its agent submits (`sbatch`, with the options of core/scheduler.py); the scheduler queues it, picks
its GPUs (a count) and its nodes (`--nodes N`: torchrun over them by `srun`, the rendezvous filled in
on the allocation, node I's log in the run dir's nodes/I/), and at its time limit or a preemption the
job submits its own next attempt from its checkpoint when the job's `retry:` asks (agent/slurm.py,
continue_itself). docs/architecture.md, "Slurm clusters"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from thrust_remote.agent.protocol import (
    CHECKPOINT_AT,
    MAX_DURATION_GRACE_S,
    NODES_DIR,
    PREEMPTED,
    RDZV_PENDING,
    TIMEOUT,
    StatusAnswer,
)
from thrust_remote.backends.base import Node, RunAsk, RunNodes
from thrust_remote.core.config import HostConfig, JobConfig
from thrust_remote.core.errors import ExitCode, ThrustError, UsageError
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.core.scheduler import sbatch_options
from thrust_remote.doctor.cluster import slurm_checks
from thrust_remote.fetch import checkpoints
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.report import Check
from thrust_remote.host.session import HostSession
from thrust_remote.run import jobs, stages
from thrust_remote.run.resume import TRAINER_TEMPLATE
from thrust_remote.run.stages import LaunchPlan, Prepared
from thrust_remote.run.vocab import Launched, Reporter, TrainRequest
from thrust_remote.runs import control

HOST_RETRY_ON = (TIMEOUT, PREEMPTED)  # what a cluster's run continues from by itself (agent/slurm.py)
GPU_ENV = ("CUDA_VISIBLE_DEVICES", "GPU_LIST")  # a trial's slot's GPUs: the scheduler picks its own


class Slurm:
    """A run is a job in the cluster's scheduler."""

    scheduler = "Slurm"
    continues_on = HOST_RETRY_ON

    def check(self, request: TrainRequest, own: Sequence[HostConfig], alone: bool) -> None:
        """Its scheduler queues and places a run, so one host per run, GPUs as a count, no --queue of ours."""
        if len(own) > 1 or not alone:
            raise UsageError(f"{', '.join(h.name for h in own)} is a Slurm cluster: a run there is one "
                             "host (its nodes are the scheduler's to give)", "give that host alone with --host")
        if request.queue:
            raise UsageError("--queue: a Slurm cluster queues every run in its scheduler already", "drop --queue")
        if request.gpus and not request.gpus.isdigit():
            raise UsageError(f"--gpus {request.gpus}: on a Slurm cluster the scheduler picks the GPUs",
                             "give how many, like --gpus 2")
        if request.nodes > 1 and request.job.kind not in ("trainer", "python"):
            raise UsageError(f"--nodes {request.nodes}: job {request.job.name!r} is a {request.job.kind} job; "
                             "torchrun starts the built-in trainer or a python job on every node", "drop --nodes")
        if request.nodes > 1 and request.job.workers is not None:  # before the sync, not at launch
            raise UsageError(f"--nodes {request.nodes}: job {request.job.name!r} starts its own workers (workers:), "
                             "so it runs once on one node; over several nodes torchrun starts it on each",
                             f"drop --nodes; --nproc N passes N by the job's {request.job.workers.count}")

    def check_facts(self, request: TrainRequest, facts: Mapping[str, Any], host: HostConfig) -> None:
        """The scheduler picks the GPUs: the login node's own say nothing of what a run gets."""

    def launch(self, prepared: Prepared, ask: RunAsk, reporter: Reporter) -> Launched:
        """Submitted with its GPUs as a count per node (a trial: its slot's count, its env without the
        slot's GPUs); over several nodes torchrun's rendezvous is filled in on the allocation; a train
        that can continue itself carries its next attempt."""
        request, host = ask.request, prepared.host
        assert host.slurm is not None
        trial = ask.slot is not None
        count = len(ask.slot or ()) if trial else int(request.gpus or 0)
        options = sbatch_options(host.slurm, nodes=1 if trial else request.nodes, gpus=count,
                                 stops_at=request.job.max_duration and request.job.max_duration + MAX_DURATION_GRACE_S)
        rdzv = (jobs.Rendezvous(request.nodes, 0, RDZV_PENDING, 0, ask.run_id or "")
                if not trial and request.nodes > 1 else None)
        nxt = host_retry(request.job, ask.base_args, prepared.session.name) if ask.base_args is not None else None
        env = {k: v for k, v in ask.extra_env.items() if k not in GPU_ENV} if trial else ask.extra_env
        plan = LaunchPlan(args=ask.args, run_id=ask.run_id, gpu_count=count,
                          gpus_used=tuple(scheduled_gpus(options, count)), nproc=request.nproc, extra_env=env,
                          meta=ask.meta, export=ask.export, rdzv=rdzv,
                          submit=control.Submission(("--slurm",), {"sbatch": options}, self.explain),
                          continues=None if nxt is None else {**{k: v for k, v in nxt.items() if k != "args"},
                                                              "sbatch": options},
                          continue_args=tuple(nxt["args"]) if nxt is not None else ())
        return stages.launch_prepared(prepared, plan, reporter)

    def slots(self, facts: Mapping[str, Any], host: HostConfig, gpus: str | None, parallel: int | None,
              slots_per_gpu: int) -> list[tuple[str, tuple[int, ...]]]:
        """A slot is a job in its scheduler (`--parallel` of them at once, pending ones included);
        `--gpus N`: each trial's GPUs, which Slurm picks (the slot holds only their count)."""
        if gpus and not gpus.isdigit():
            raise UsageError(f"--gpus {gpus}: on {host.name}, a Slurm cluster, the scheduler picks the GPUs",
                             "give how many each trial gets, like --gpus 1")
        return [(f"job{i}", tuple(range(int(gpus or 0)))) for i in range(parallel or 1)]

    def explain(self, answer: Mapping[str, object], run_id: str, host: HostConfig) -> ThrustError | None:
        if answer.get("error") != "sbatch":
            return None
        return ThrustError(f"Slurm refused run {run_id} on {host.name}: {answer.get('detail')}",
                           f"check the host's partition:, account:, time: and sbatch: in {config_file(host)}; "
                           f"{command_hint('doctor', host=host)} shows what the cluster accepts",
                           ExitCode.UNAVAILABLE)

    def nodes(self, run_id: str, session: HostSession, status: StatusAnswer) -> RunNodes | None:
        """Node I is Slurm's node I (named as Slurm names it), its log, run.json and end in the run dir's
        nodes/I/ on the login node (node 0's in the run dir itself)."""
        parts = [p for p in status.get("slurm_nodes") or [] if isinstance(p, dict)]
        if not parts:
            return None
        return RunNodes(run_id, [Node(str(p.get("slurm_node") or f"node {p.get('node')}"), session.name, session,
                                      f"{NODES_DIR}/{i}" if i else "") for i, p in enumerate(parts)], together=True)

    def shown(self, status: StatusAnswer, host: str) -> StatusAnswer:
        """A run over several Slurm nodes listed as a run over hosts lists its nodes, each on this host."""
        if not status.get("slurm_nodes"):
            return status
        shown = dict(status)
        parts = shown.pop("slurm_nodes")
        shown["nodes"] = [{**p, "host": host} for p in parts if isinstance(p, dict)]
        return shown  # type: ignore[return-value]

    def fields(self, status: StatusAnswer) -> dict[str, Any]:
        return {"slurm_job": status.get("scheduler_job")}

    def node_label(self, node: Mapping[str, Any]) -> str:
        return str(node.get("slurm_node") or node["host"])  # Slurm's name for each node

    def doctor_checks(self, fleet: Fleet, host: HostConfig, workdir: str) -> list[Check]:
        return slurm_checks(fleet, host, workdir)


BACKEND = Slurm()


def host_retry(job: JobConfig, base_args: Sequence[str], host: str) -> dict[str, Any] | None:
    """What a Slurm run needs to submit its own next attempt at its time limit or when preempted, with no
    laptop following (agent/slurm.py, continue_itself): the job's `retry:` answers `timeout` or
    `preempted` and it can resume. `args` are the next attempt's job arguments, "{checkpoint}" filled on
    the cluster; None: it does not."""
    retry = job.retry
    on = [e for e in retry.on if e in HOST_RETRY_ON] if retry else []
    glob = checkpoints.checkpoint_glob(job)
    # `resume: {checkpoint_at: P}` alone continues with no arguments of its own: the next attempt runs in
    # the same tree (agent/slurm.py), where the job finds at P the checkpoint it last wrote there
    says = bool(job.resume or job.resume_at)
    template = job.resume if says else TRAINER_TEMPLATE if job.kind == "trainer" else None
    if retry is None or not on or not retry.max or glob is None or template is None:
        return None
    return {"on": on, "max": retry.max, "attempt": 0, "checkpoints": glob, "host": host,
            "args": [*base_args, *template], **({CHECKPOINT_AT: job.resume_at} if job.resume_at else {})}


def scheduled_gpus(options: Sequence[str], per_node: int) -> list[int]:
    """What GPU-hours count on a cluster: the GPUs asked of the scheduler, per node times its nodes (the
    login node's own GPUs, if any, are not the job's)."""
    nodes = next((int(o.split("=", 1)[1]) for o in options if o.startswith("--nodes=")), 1)
    return list(range(per_node * nodes))
