"""A run's life over N >= 1 hosts, written once: start, follow, status, stop (docs/architecture.md,
"The flow of one train" and "Several hosts").

`train` (attached or `--detach`), `logs RUN --follow` (a reattach: after a detach, a Ctrl-C or a lost
link) and `status`/`stop` all come here; one host is the N = 1 case of the same code: the nodes are
checked, compared, set up and launched together (`agree` and the plan have nothing to compare or place
for one), and the follow's peer watch has no peer to mind. So a run over several hosts reattached
behaves as the attached one does: the other nodes watched, the node that failed first named with the
end of its log, the same exit status. The stages themselves are stages.py's (and following.py's,
fetching.py's); what only several nodes need (agree, plan, rendezvous, the watch, the state over
nodes) is multinode.py's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import MODEL, USER_STOP, RunState, StatusAnswer
from thrust_remote.backends import Backend, RunAsk, RunNodes, backend_for
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.errors import (
    ConnectionLostError,
    Detached,
    Interrupted,
    StillGoing,
    ThrustError,
    UnknownHostError,
    UnreachableError,
    UsageError,
)
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.fetch import artifacts, checkpoints
from thrust_remote.fetch.artifacts import DirFetch
from thrust_remote.fetch.models import FetchResult
from thrust_remote.host.fleet import Fleet, each
from thrust_remote.host.session import HostSession
from thrust_remote.run import arguments, endings, fetching, following, multinode, stages, vocab, workers
from thrust_remote.run import resume as resuming  # the module; `resume` is a train's ResumeFrom here
from thrust_remote.run.sync import LocalState
from thrust_remote.run.vocab import Launched, Reporter, Stage, TrainOutcome, TrainRequest
from thrust_remote.runs import control, index, notify, pull, scalarwatch, trees
from thrust_remote.runs.progress import RunProgress, last_metrics, pattern_of


@dataclass
class Started:
    launched: list[Launched]  # rank order: the head (node 0) first
    nodes: RunNodes
    outputs: fetching.Outputs  # what the job leaves to fetch, resolved once: the follow's pulls and end read it

    @property
    def head(self) -> Launched:
        return self.launched[0]


# ------------------------------------------------------------------------------------------ start

def check_request(request: TrainRequest, hosts: Sequence[HostConfig], max_restarts: int = 0) -> None:
    """What a run cannot be on these hosts, said before anything connects (64)."""
    if request.queue and request.share_gpus:
        raise UsageError("--queue waits for GPUs no running run holds; --allow-shared-gpus runs on held ones",
                         "give one of them")
    kinds: dict[Backend, list[HostConfig]] = {}  # each backend's own hosts, in the order given
    for h in hosts:
        kinds.setdefault(backend_for(h), []).append(h)
    for backend, own in kinds.items():
        backend.check(request, own, alone=len(kinds) == 1)
    if len(hosts) > 1:
        multinode.check_request(request, hosts)
        if request.gpus:
            raise UsageError("--gpus picks GPUs on one host; over several hosts every node uses its GPUs as "
                             f"CUDA_VISIBLE_DEVICES (or the host's gpus: in {config_file(hosts[0])}) gives them",
                             "drop --gpus, and give --nproc (processes per node)")
    elif max_restarts:  # one host runs torchrun --standalone with --max-restarts=0: say so, never ignore it
        raise UsageError(f"--max-restarts {max_restarts}: restarts are for a run over several hosts",
                         "give two or more --host (or a group), or drop --max-restarts")


def check_following(request: TrainRequest, retry: int | None, reporter: Reporter) -> None:
    """--retry needs a job that can continue from a checkpoint (64 now, not when a host dies hours in);
    --retry and --sync-every act while a run is followed: with --detach, nothing does (said)."""
    if request.detach and (retry or request.sync_every is not None):
        given = " and ".join(f for f, v in (("--retry", retry), ("--sync-every", request.sync_every)) if v is not None)
        reporter.warn(f"{given}: acted on while a run is followed, and with --detach nothing follows it; "
                      "`thrust-remote watch RUN` follows it with its retries (and pulls), `logs RUN -f` with pulls")
    elif retry:
        resuming.template_of(request.job)


def train_request(fleet: Fleet, request: TrainRequest, hosts: Sequence[HostConfig], reporter: Reporter, *,
                  max_restarts: int = 0, retry: int | None = None, as_train: bool = False) -> TrainOutcome:
    """A run's life from its request: what it cannot be, said before anything connects (check_request;
    `as_train`: `train`'s own request, whose --retry and --detach are checked with it: check_following;
    a resume's or a retry's is not), then `train` over a session per host (the fleet's). A train, a
    resume and each retry of a chain start here: the request is checked once and handed on once."""
    check_request(request, hosts, max_restarts)
    # a script that spawns its own workers, asked for several processes without `workers:`: 64 now
    workers.check_request(request.job, request.nproc, request.gpus, fleet.config.root, config_file(hosts[0]))
    if as_train:
        check_following(request, retry, reporter)
    with fleet.sessions(hosts) as sessions:
        return train(fleet.config, request, sessions, reporter, max_restarts=max_restarts,
                     config_path=fleet.config_path)


def start(config: Config, request: TrainRequest, sessions: Sequence[HostSession], reporter: Reporter, *,
          max_restarts: int = 0) -> Started:
    """Every node synced and checked, compared, set up and launched (all at once, in threads); the run
    recorded in the local index. The nodes come back in rank order (multinode.Plan.order). The request
    was checked before the sessions were opened (check_request: train_request, or the caller)."""
    many = len(sessions) > 1
    resolved = arguments.resolve(request)  # its arguments and parameters, once: every node's
    args = list(resolved.words)

    def told(session: HostSession) -> Reporter:  # the nodes speak at once: each line names its node
        return multinode.Prefixed(reporter, session.name) if many else reporter

    # the run id first: it names the run's tree on every node, made by the check
    run_id = control.check_run_id(request.run_id) if request.run_id else control.new_run_id(request.job.name)
    planned = multinode.PlanAhead(sessions, reporter) if many else None  # beside the check and set-up
    checked = each(lambda s: stages.check(config, request.job, s, told(s), args=args, code_at=request.resume,
                                           tree=run_id), sessions)
    if many:  # one host has nothing to compare
        multinode.agree(checked)
    for node in checked:  # what the host can never give (GPUs): 64 before any set-up
        backend_for(node.session.host).check_facts(request, node.report.facts, node.session.host)
    try:
        prepared = each(lambda c: stages.set_up(c, told(c.session)), checked)
        base_args = args  # before a checkpoint's: a cluster's run that continues itself adds its own
        if request.resume is not None:  # every node can read the checkpoint; the job's rank 0 does
            resume = request.resume
            reporter.step(f"placing checkpoint {resume.label} for run {run_id}")
            paths = each(lambda p: resuming.place(p, resume, run_id, relative=many), prepared)
            args = [*args, *stages.resume_args(resume, paths[0])]
        if many:  # a queued run's order, the same on every node (agent/runqueue.py); one host its own clock
            launched, ranked = multinode.launch_nodes(prepared, request, args, run_id, reporter, max_restarts,
                                                      queue_order=time.time(), planned=planned)
        else:
            meta = request.resume.record() if request.resume else {}  # run.json's link to the run it continues
            ask = RunAsk(request, tuple(args), run_id, extra_env=request.extra_env, meta=meta,
                         base_args=tuple(base_args))
            head = prepared[0]
            launched, ranked = [backend_for(head.session.host).launch(head, ask, reporter)], list(sessions)
    except ThrustError as exc:  # nothing launched (a failed setup): its tree stays to look into, unleased
        if not isinstance(exc, ConnectionLostError | Detached):
            each(lambda c: _release(c.session, run_id), checked)
        raise
    _remember(config, launched, reporter, request, prepared[0].local, resolved.params)
    outputs = fetching.outputs(request.job)
    fetches = Stage.FETCH in stages_of(request) and outputs.any
    for p in prepared:  # each host's `keep:`: the trees of older ended runs go (never a live run's, nor this)
        _keep(p.session, config.root, told(p.session), run_id, release=not (fetches and p.session is ranked[0]))
    return Started(launched, RunNodes.on_hosts(run_id, [s.name for s in ranked], list(ranked)), outputs)


def _keep(session: HostSession, root: Path, reporter: Reporter, run_id: str, *, release: bool) -> None:
    """The host's `keep:` after the launch of `run_id`, whose own tree stays (and, unless `release`, stays
    until this train has fetched from it)."""
    try:
        pruned = trees.keep_policy(session, root, run_id, release=release)
    except ThrustError as exc:  # the run is launched: a tree not reclaimed is a warning, never a failure
        reporter.warn(f"the trees of older runs on {session.name} were not reclaimed: {exc.message}")
        return
    if pruned is not None and pruned.removed:
        reporter.step(f"keep: {{runs: {session.host.keep_runs}}}: removed the trees of "
                      f"{', '.join(trees.describe(t) for t in pruned.removed)}")


def _release(session: HostSession | None, run_id: str) -> None:
    """This train is done with the run's tree on `session` (fetching.release)."""
    fetching.release(session, run_id)


def _remember(config: Config, launched: Sequence[Launched], reporter: Reporter, request: TrainRequest,
              local: LocalState | None, params: Mapping[str, Any]) -> None:
    """The run in the project's local index, so status/logs/stop/fetch find its host without --host,
    and `resume` its job, arguments and code (the patch kept beside the entry)."""
    head = launched[0]
    patch = local.patch if local is not None and head.commit == local.commit else b""
    entry = index.IndexEntry(run_id=head.run_id, host=head.host, job=head.job, commit=head.commit,
                             started_at=index.now(), run_dir=head.run_dir,
                             config=str(config.path.resolve()) if config.path else None,
                             nodes=tuple(n.host for n in launched) if len(launched) > 1 else (),
                             sets=tuple(request.sets), params=dict(params) or None,
                             patch_sha256=hashlib.sha256(patch).hexdigest() if patch else None,
                             resumed_from=request.resume.run_id if request.resume else None)
    try:
        if patch:
            index.record_patch(config.root, head.run_id, patch)
        index.record(config.root, entry)
    except OSError as exc:
        reporter.warn(f"run {head.run_id} is not in the local index ({exc}): give --host {head.host} to status, "
                      "logs, stop and fetch")


def stages_of(request: TrainRequest) -> tuple[Stage, ...]:
    """What `train` runs for a request: every stage; `--detach` ends with the launch, `--no-fetch`
    leaves the fetch out."""
    last = Stage.LAUNCH if request.detach else Stage.FETCH
    every = list(Stage)
    return tuple(s for s in every[:every.index(last) + 1] if s is not Stage.FETCH or request.fetch)


def train(config: Config, request: TrainRequest, sessions: Sequence[HostSession], reporter: Reporter | None = None,
          *, stages: Sequence[Stage] | None = None, max_restarts: int = 0,
          config_path: Path | str | None = None) -> TrainOutcome:
    """The run's stages (default: `stages_of(request)`) on every node given: sync → preflight → setup →
    launch (always: a run starts with them) → follow → fetch. `config_path` (the --config the user
    gave) goes into the reattach hints."""
    reporter = reporter or vocab.NullReporter()
    stages = tuple(stages) if stages is not None else stages_of(request)
    started = start(config, request, sessions, reporter, max_restarts=max_restarts)
    if Stage.FOLLOW not in stages:
        return TrainOutcome(started.head, None, None, 0, dict(started.head.timings))
    return follow(config, started.nodes, started.head, request.job, reporter, fetch=Stage.FETCH in stages,
                  force=request.force, config_path=config_path, sync_every=request.sync_every,
                  outputs=started.outputs)


# ------------------------------------------------------------------------------------------ follow

def follow(config: Config, nodes: RunNodes, head: Launched, job: JobConfig | None, reporter: Reporter, *,
           fetch: bool = True, force: bool = False, offset: int = 0, node: int = 0,
           config_path: Path | str | None = None, sync_every: float | None = None,
           outputs: fetching.Outputs | None = None) -> TrainOutcome:
    """Follow node `node`'s log (rank 0's by default) while the watch minds the other nodes and node 0's
    checkpoint and artifacts are pulled every `sync_every` s (runs/pull.py); then the run's state over
    every node and, when it FINISHED, node 0's model and artifacts; whatever the end, its newest
    checkpoint (`job` None: an optimize trial or a job this config lacks: nothing fetched). The nodes a
    host's scheduler holds together are ended by it: its host alone is watched."""
    followed = nodes.nodes[node]
    assert followed.session is not None
    followed_session = followed.session
    timings = dict(head.timings)
    if head.scheduler_job:  # in a cluster's scheduler: said once, here (the detach says it otherwise)
        reporter.step(f"run {head.run_id} submitted to {backend_for(config.host(head.host)).scheduler} on "
                      f"{head.host} as job {head.scheduler_job}: it starts when the scheduler gives it its nodes; "
                      "its log follows then")
        reporter.queued(head.host, None)
    elif head.position is not None:  # still waiting on its host: the view says so until its log starts
        if not (nodes.many and head.sync is not None):  # a launch over several hosts said it for each node
            where = f" (position {head.position})" if head.position else ""
            reporter.step(f"run {head.run_id} waits in {head.host}'s queue{where}: it starts by itself when what it "
                          "asks frees; its log follows then")
        reporter.queued(head.host, head.position or None)
    if fetch and job is not None and nodes.sessions[0] is not None:
        nodes.sessions[0].runner.warm_transfers(1)  # the model's get at the end finds its helper started
    # what the job leaves to fetch, resolved once (a train's start did; a reattach does here)
    outs = outputs if outputs is not None or job is None else fetching.outputs(job)
    pattern = pattern_of(job.metrics if job is not None else None)
    name, events = (job.name, job.metrics.tensorboard) if job is not None else ("", None)  # scalarwatch's fields
    progress = RunProgress(pattern)  # the follow's, read by the pulls: the step a checkpoint came at
    watched = nodes.watched()
    at = node if nodes.many else 0  # the followed node among the watched ones
    with multinode.Watch(watched.sessions, watched.names, nodes.run_id, reporter, followed=at) as watch, \
            _pulling(config, nodes, head, job, reporter, sync_every if fetch else 0.0, progress, outs) as puller:
        try:
            read = following.follow(followed_session, nodes.run_id, reporter, offset=offset, config_path=config_path,
                                    node=node if nodes.many or node else None,
                                    scalars=scalarwatch.source_for(followed_session, nodes.run_id, name, events),
                                    pattern=pattern, progress=progress, part=followed.part)
        except ConnectionLostError as exc:
            watch.fail(at, "lost: the connection to it broke while following")
            exc.run_id, exc.host = nodes.run_id, nodes.nodes[0].host  # what a retry resumes (run/resume.py)
            raise
        except Detached as exc:
            exc.run_id, exc.host = nodes.run_id, nodes.nodes[0].host  # a retry's hint names `watch` (run/resume.py)
            raise
    status = _over_nodes_at_end(nodes, node, read.status, watch) if nodes.many else read.status
    tell_ended(config, status, reporter.warn)
    # the run's end in one call: its model and artifacts (FINISHED), its newest checkpoint, its tree released
    end = fetching.at_end(config, nodes.sessions[0], head, job, status, reporter, fetch=fetch, force=force,
                          timings=timings, step=progress.metrics.get("step"), config_path=config_path, outs=outs)
    return TrainOutcome(head, status, end.fetched, vocab.exit_code_for(status), timings, read.progress,
                        fetchable=end.fetchable, artifacts=end.artifacts, checkpoint=end.checkpoint,
                        pulled=puller.last if puller is not None else None,
                        next_steps=_next_steps(config, status, job, read.progress, head, config_path))


def _next_steps(config: Config, status: StatusAnswer, job: JobConfig | None, progress: RunProgress,
                head: Launched, config_path: Path | str | None) -> list[str]:
    """What to type after the run's end (run/endings.py), with node 0's host in the commands."""
    if job is None:
        return []
    entry = index.lookup(config.root, head.run_id)
    return endings.of_run(config, status, job, progress, config.host(head.host), config_path,
                          entry.sets if entry else (), entry.params if entry else None)


@contextmanager
def _pulling(config: Config, nodes: RunNodes, head: Launched, job: JobConfig | None, reporter: Reporter,
             given: float | None, progress: RunProgress, outs: fetching.Outputs | None,
             ) -> Iterator[pull.Puller | None]:
    """Node 0's checkpoint and artifacts pulled every `sync_every` s while the run is followed; each
    checkpoint that came is noted with the step the follow had seen then (checkpoints.note_step)."""
    every = pull.interval(outs.pulled, job.sync_every, given) if job is not None and outs is not None else 0.0
    session = nodes.sessions[0]
    if not every or job is None or session is None:
        yield None
        return
    def pulled(got: pull.Pulled) -> None:
        if got.fresh:
            checkpoints.note_step(config.root, nodes.run_id, progress.metrics.get("step"))
        reporter.pulled(got)

    with pull.Puller(session, job, head.run_dir, nodes.run_id, config.root, every, pulled, reporter.warn) as puller:
        yield puller


def last_checkpoint(config: Config, session: HostSession, run_id: str, job: JobConfig,
                    reporter: Reporter) -> checkpoints.CheckpointPull | None:
    """An ended run's newest checkpoint (node 0's `session`), pulled (fetching.last_checkpoint)."""
    return fetching.last_checkpoint(config, session, run_id, job, reporter)


def pull_at_end(config: Config, session: HostSession, run_id: str, job: JobConfig, reporter: Reporter) -> None:
    """An ended run's newest checkpoint and changed artifacts, whatever its state (`wait`'s end, as a
    follow's Puller pulls them meanwhile); a failure is a warning naming the `fetch` that tries again."""
    last_checkpoint(config, session, run_id, job, reporter)
    try:
        fetching.fetch_artifacts(config, session, job, session.paths.run(run_id), run_id, reporter)
    except ThrustError as exc:
        reporter.warn(f"run {run_id}'s artifacts were not fetched ({exc.message}); "
                      f"later: {command_hint('fetch', run_id, host=session.host)}")


def ended_metrics(session: HostSession, run_id: str, job: JobConfig | None) -> dict[str, Any]:
    """The metrics an ended run's log ends with (its THRUST_METRICS lines, or its `metrics: {pattern:}`
    read from its own lines): what `wait` says of it; {} when the log's end has none."""
    text = multinode.log_tail(session, run_id)
    return last_metrics(text or "", pattern_of(job.metrics if job is not None else None))


def _over_nodes_at_end(nodes: RunNodes, node: int, followed: StatusAnswer, watch: multinode.Watch) -> StatusAnswer:
    """The run's state once the followed node ended: every other node asked; a node that failed first
    other than the followed one shows the end of its log (the followed one's was on screen); and the
    nodes still running are stopped, FAILED for the failed one (the watch may not have seen it yet)."""
    others = multinode.others_at_end(nodes.sessions, nodes.run_id, node, str(followed.get("state")), watch.verdict)
    states = [followed if i == node else st for i, st in enumerate(others)]
    status = multinode.aggregate(nodes.names, states, watch.verdict)
    failed = status.get("failed_node")
    if failed and status["state"] == RunState.FAILED and watch.verdict is None:
        others = [s for i, s in enumerate(nodes.sessions) if i != failed["node"] and s is not None]
        multinode.stop_all(others, nodes.run_id, failed)  # a node without a session stops itself (peerwatch)
    if failed and failed["node"] != node and status["nodes"][failed["node"]]["state"] == RunState.FAILED:
        session = nodes.sessions[failed["node"]]  # one that answered: a lost node has no log to give
        failed["log_tail"] = multinode.log_tail(session, nodes.run_id) if session is not None else None
    return status


# ------------------------------------------------------------------------------------------ a run started before

@contextmanager
def open_nodes(session: HostSession, run_id: str, fleet: Fleet,
               status: StatusAnswer | None = None) -> Iterator[tuple[RunNodes, StatusAnswer]]:
    """Every node of a run, from the status of the node `session` is on (its run.json lists the nodes in
    rank order); the sessions opened here (through `fleet`) are closed at the end, `session` is the
    caller's. A node that does not answer is None (the run's state shows it UNREACHABLE; a follow's
    watch takes it as lost); any other failure to open one (a host this config lacks, a changed host
    key) is raised before anything is asked or stopped: it says nothing about the run."""
    status = status if status is not None else control.status(session, run_id)
    names = [str(n) for n in status.get("nodes") or [session.name]]
    sessions: list[HostSession | None] = [None] * len(names)
    errors: dict[int, ThrustError] = {}

    def one(i: int) -> None:
        try:
            sessions[i] = session if names[i] == session.name else _open_node(fleet, run_id, names[i])
        except (UnreachableError, ConnectionLostError):
            pass
        except ThrustError as exc:
            errors[i] = exc

    each(one, list(range(len(names))))
    if errors:
        for s in sessions:
            if s is not None and s is not session:
                s.close()
        raise errors[min(errors)]
    try:
        yield RunNodes.on_hosts(run_id, names, sessions), status
    finally:
        for s in sessions:
            if s is not None and s is not session:
                s.close()


def _open_node(fleet: Fleet, run_id: str, name: str) -> HostSession:
    """A session on another node of run `run_id`; a host this config lacks is an error naming the
    config the run was started with (from the local index), not a node that is gone."""
    try:
        return fleet.open(name)
    except UnknownHostError as exc:
        entry = index.lookup(fleet.config.root, run_id)
        started = entry.config if entry and entry.config else None
        raise UnknownHostError(
            f"run {run_id} has a node on host {name!r}, which this configuration does not define",
            f"give the config the run was started with: thrust-remote --config {started} ..." if started
            else exc.hint) from None


def reattach(fleet: Fleet, session: HostSession, run_id: str, reporter: Reporter | None = None, *,
             node: int | None = None, offset: int = 0, fetch: bool = True, force: bool = False,
             sync_every: float | None = None) -> TrainOutcome:
    """`logs RUN --follow`: follow a run already started and end it as `train` would, over all its
    nodes: the same watch, the same failed node named, the same fetch and exit code. `node`: the node
    whose log is shown (default node 0's). The reattach hints repeat the fleet's --config."""
    reporter = reporter or vocab.NullReporter()
    config = fleet.config
    with open_nodes(session, run_id, fleet) as (nodes, status):
        if not nodes.many:  # one host: the nodes its scheduler spread the run over, if it did
            nodes = backend_for(session.host).nodes(run_id, session, status) or nodes
        node = check_node(nodes, node)
        head_session = nodes.sessions[0]
        if head_session is None or nodes.sessions[node] is None:
            down = nodes.names[node if nodes.sessions[node] is None else 0]
            raise UnreachableError(f"run {run_id}: node {nodes.names.index(down)} ({down}) does not answer",
                                      f"thrust-remote doctor --host {down}")
        head_status = status if head_session is session else control.status(head_session, run_id)
        job = _train_job(config, head_session, run_id, head_status)
        head = Launched(run_id, head_session.paths.run(run_id), int(head_status.get("pid") or 0), head_session.name,
                        str(head_status.get("job") or ""), head_status.get("commit"), head_session.paths, None, True,
                        {}, position=(status.get("position") or 0) if status.get("state") == RunState.QUEUED else None)
        return follow(config, nodes, head, job, reporter, fetch=fetch, force=force, offset=offset, node=node,
                      config_path=fleet.config_path, sync_every=sync_every)


def check_node(nodes: RunNodes, node: int | None) -> int:
    """`--node I`: a node of this run (64 otherwise); default node 0."""
    if node is None:
        return 0
    if node >= len(nodes.names):
        if len(nodes.names) == 1:
            raise UsageError(f"--node {node}: run {nodes.run_id} ran on one host ({nodes.names[0]})",
                             "drop --node: its one log is node 0's")
        raise UsageError(f"--node {node}: run {nodes.run_id} has {len(nodes.names)} nodes "
                         f"({', '.join(nodes.names)})", f"give --node 0 to {len(nodes.names) - 1}")
    return node


def _train_job(config: Config, session: HostSession, run_id: str, status: StatusAnswer) -> JobConfig | None:
    """The configured job a run was trained for; None for an optimize trial (run.json has `trial`:
    it exported nothing) or a job this config no longer has."""
    record = control.read_run_json(session, session.paths.run(run_id))  # typed: a RunRecord
    if record is not None and "trial" in record:
        return None
    return config.jobs.get(str(status.get("job") or ""))


def status(session: HostSession, run_id: str, fleet: Fleet) -> StatusAnswer:
    """`status RUN`: one host's status object, or over several hosts the run's state over its nodes
    (every other node asked at once; docs/architecture.md, "JSON shapes")."""
    first = control.status(session, control.check_run_id(run_id))
    backend = backend_for(session.host)
    if backend.nodes(run_id, session, first) is not None:  # one host's scheduler's nodes: its answer says them
        return backend.shown(first, session.name)
    if len(first.get("nodes") or []) <= 1:
        return first
    with open_nodes(session, run_id, fleet, first) as (nodes, _):
        return _state_over(nodes, session, first)


def _state_over(nodes: RunNodes, asked: HostSession, answer: StatusAnswer) -> StatusAnswer:
    """The run's state over its nodes, the node `asked` having given `answer` already."""
    if not nodes.many:
        return answer
    got = multinode.node_states([None if s is asked else s for s in nodes.sessions], nodes.run_id)
    states = [answer if s is asked else st for s, st in zip(nodes.sessions, got, strict=True)]
    return multinode.aggregate(nodes.names, states)


@dataclass
class Fetched:
    host: str  # node 0's: where the model and the artifacts came from
    model: FetchResult | None
    artifacts: DirFetch | None
    checkpoint: checkpoints.CheckpointPull | None = None
    state: str | None = None  # the run's state over its nodes when it was fetched


def fetch(fleet: Fleet, session: HostSession, run_id: str, reporter: Reporter, *,
          force: bool = False, all_checkpoints: bool = False) -> Fetched:
    """`fetch RUN`: node 0's model (the job exports one and the run has ended), its newest checkpoint
    (`all_checkpoints`: every one) and its changed artifacts, placed by the rules of "Kept models"
    judged on the run's state over every node. A run still going brings its checkpoint and artifacts
    so far; its model comes when it ends."""
    config = fleet.config
    session.runner.warm_transfers(1)  # beside the status requests: the gets after them find it started
    with open_nodes(session, control.check_run_id(run_id), fleet) as (nodes, first):
        head = nodes.sessions[0]
        if head is None:
            raise UnreachableError(f"run {run_id}: node 0 ({nodes.names[0]}), which holds its model, does not answer",
                                   command_hint("doctor", host=nodes.names[0], config=session.host.config_path))
        st = _state_over(nodes, session, first)
        job_name = st.get("job")
        if not job_name:
            raise ThrustError(f"run {run_id} has no job recorded")
        job, run_dir = config.job(job_name), head.paths.run(run_id)
        glob = checkpoints.checkpoint_glob(job)
        if not fetching.exports_model(job) and not glob and not artifacts.artifact_globs(job):
            raise UsageError(f"job {job_name} exports no model and has no `checkpoints:` or `artifacts:`: nothing "
                             "to fetch", f"add `export:`, `checkpoints:` or `artifacts:` under jobs.{job_name} in "
                             f"{config_file(session.host)}")
        state = RunState.of(st.get("state"))
        if state.is_live:  # said for every kind: what comes now, and what only comes at the end
            later = "; its model when it ends" if fetching.exports_model(job) else ""
            reporter.step(f"run {run_id} is {state}: its newest checkpoint and changed artifacts come now{later}")
        model = _fetch_model(config, head, job, run_dir, run_id, st, reporter, force=force, others=bool(glob))
        pulled = fetching.pull_checkpoint(config, head, job, run_dir, run_id, reporter, every=all_checkpoints)
        got = fetching.fetch_artifacts(config, head, job, run_dir, run_id, reporter)
        if model is None:  # the tree they were in is gone: said, 69
            fetching.check_tree_gone(head, run_id, got, pulled)
        return Fetched(head.name, model, got, pulled, str(st.get("state")))


def _fetch_model(config: Config, head: HostSession, job: JobConfig, run_dir: str, run_id: str, st: StatusAnswer,
                 reporter: Reporter, *, force: bool, others: bool) -> FetchResult | None:
    """The run's model when it has one to give: none while it runs (said), none from a run that ended
    without exporting when there are checkpoints to bring instead (said); else `fetching.finish`."""
    if not fetching.exports_model(job):
        return None
    state = RunState.of(st.get("state"))
    if state.is_live:
        return None
    if state != RunState.FINISHED and others and not head.runner.exists(f"{run_dir}/{MODEL}"):
        reporter.warn(f"run {run_id} ended {state} without a model: its checkpoint and artifacts come; "
                      f"continue it with: {command_hint('resume', run_id)}")
        return None
    return fetching.finish(config, head, job, run_dir, run_id=run_id, status=st, force=force)


def stop(session: HostSession, run_id: str, fleet: Fleet, grace: float = 10.0,
         ) -> list[tuple[str, dict[str, Any] | None]]:
    """`stop RUN`: every node at once; each node's answer, None for one that cannot be reached (it
    stops itself when it loses the others: agent/peerwatch.py)."""
    with open_nodes(session, control.check_run_id(run_id), fleet) as (nodes, _):

        def one(s: HostSession | None) -> dict[str, Any] | None:
            if s is None:
                return None
            try:
                return control.stop(s, run_id, grace)
            except ConnectionLostError:
                return None

        answers = each(one, nodes.sessions)
        return list(zip(nodes.names, answers, strict=True))


# ------------------------------------------------------------------------------------------ ended

def tell_ended(config: Config, status: StatusAnswer, warn: Callable[[str], None]) -> None:
    """A followed run has ended: the `notify:` of its job (else the top level's) told, once per run
    whoever follows it (runs/notify.py). A run still going tells nothing."""
    state = RunState.of(status.get("state"))
    job = str(status.get("job") or "")
    cfg = config.notify_for(job)
    if not state.is_terminal or not cfg.enabled:
        return
    reason = str(status.get("reason") or "")
    ended = notify.Ended(str(status.get("run_id")), state.value, status.get("exit_code"),
                         str(status.get("host") or ""), job, "" if reason == USER_STOP else reason)
    with notify.claim(config.root, ended.run_id) as ours:  # marked told only once its notifiers are done
        if ours:
            notify.tell(cfg, ended, warn, cwd=config.path.parent if config.path else config.root)


# ------------------------------------------------------------------------------------------ wait

Ask = Callable[[], StatusAnswer]  # one run's status, asked again (lifecycle.status over its nodes)


def wait(asks: Sequence[tuple[str, Ask]], *, timeout: float | None = None, every: float = 2.0,
         on_end: Callable[[StatusAnswer], None] = lambda _: None,
         on_trouble: Callable[[str, ThrustError], None] = lambda *_: None,
         again: Callable[[Sequence[str]], str] = lambda going: f"thrust-remote wait {' '.join(going)}",
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
         ) -> list[StatusAnswer]:
    """`wait RUN...`: each run asked every `every` s until every one has ended (a terminal state);
    their last statuses, in the order given. `on_end` hears each one as it ends. A host that answered
    once and then does not for a while (a reboot, a link down) is told to `on_trouble` and asked again
    next round: the runs go on there. Past `timeout` seconds: StillGoing (75) naming the runs that go on, `again(them)`
    the command to wait again, and `.statuses` the last answer of each (None: never answered)."""
    ended: dict[str, StatusAnswer] = {}
    last: dict[str, StatusAnswer | None] = dict.fromkeys((run_id for run_id, _ in asks), None)
    done: set[str] = set()  # the ended runs whose `on_end` has returned
    try:
        return _wait_rounds(asks, ended, done, last, timeout, every, on_end, on_trouble, again, clock, sleep)
    except KeyboardInterrupt:
        raise _wait_cut(asks, ended, done, again) from None


def _wait_cut(asks: Sequence[tuple[str, Ask]], ended: Mapping[str, StatusAnswer], done: set[str],
              again: Callable[[Sequence[str]], str]) -> ThrustError:
    """Ctrl-C in `wait`: the runs still going go on (75, as a detach, with the command to wait again). A
    run that had ended while what follows its end ran (its notification, its last checkpoint) is said as
    ended, and the command named waits for it too: its notification was not marked told, so that wait
    tells it. With every run ended, nothing goes on: 130."""
    going = [run_id for run_id, _ in asks if run_id not in ended]
    cut = [run_id for run_id in ended if run_id not in done]
    ends = ", ".join(f"{run_id} ended {ended[run_id].get('state')}" for run_id in cut)
    if not going and cut:
        return Interrupted(f"stopped by Ctrl-C after the end of every run ({ends}), before its notification was "
                           "done", f"tell it with: {again(cut)}")
    if not going:
        return Interrupted("stopped by Ctrl-C after the end of every run")
    note = f" ({ends}; its notification was cut)" if cut else ""
    return Detached(f"from waiting: {len(going)} of {len(asks)} run(s) still going: {', '.join(going)}{note}",
                    f"they go on; wait again with: {again(going + cut)}")


def _wait_rounds(asks: Sequence[tuple[str, Ask]], ended: dict[str, StatusAnswer], done: set[str],
                 last: dict[str, StatusAnswer | None], timeout: float | None, every: float,
                 on_end: Callable[[StatusAnswer], None], on_trouble: Callable[[str, ThrustError], None],
                 again: Callable[[Sequence[str]], str], clock: Callable[[], float],
                 sleep: Callable[[float], None]) -> list[StatusAnswer]:
    deadline = None if timeout is None else clock() + timeout
    while True:
        for run_id, ask in asks:
            if run_id in ended:
                continue
            try:
                last[run_id] = answer = ask()
            except (UnreachableError, ConnectionLostError) as exc:
                if last[run_id] is None:
                    raise  # never answered: a wrong host, not an outage to sit out
                on_trouble(run_id, exc)
                continue
            if RunState.of(answer.get("state")).is_terminal:
                ended[run_id] = answer
                on_end(answer)
                done.add(run_id)
        if len(ended) == len(asks):
            return [ended[run_id] for run_id, _ in asks]
        if deadline is not None and clock() >= deadline:
            going = [run_id for run_id, _ in asks if run_id not in ended]
            seen = ", ".join(f"{run_id} ({_as_seen(last[run_id])})" for run_id in going)
            still = StillGoing(f"after {timeout:g} s {len(going)} of {len(asks)} run(s) still going: {seen}",
                               f"they go on; wait again with: {again(going)}")
            still.statuses = [last[run_id] for run_id, _ in asks]  # type: ignore[attr-defined]
            raise still
        sleep(every if deadline is None else max(0.0, min(every, deadline - clock())))


def _as_seen(st: StatusAnswer | None) -> str:
    """A run's last answer in a word or two: QUEUED for what (the scheduler's reason), RUNNING..."""
    if st is None:
        return "never answered"
    reason = st.get("reason")
    return f"{st.get('state')}: {reason}" if reason else str(st.get("state"))


def wait_code(statuses: Sequence[StatusAnswer]) -> int:
    """0 when every run FINISHED, else the code `train` would give for the first that did not."""
    failed = next((st for st in statuses if st.get("state") != RunState.FINISHED), None)
    return 0 if failed is None else vocab.exit_code_for(failed)
