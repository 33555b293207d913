"""A run you can hold (submitit's `Job`): `Run(fleet, run_id)`, over its N >= 1 nodes and its tree.

    run = Run(fleet, "snake-20250101-120000-ab12")
    run.status()            # its state over every node (run.json's `nodes`), `tree`, `tree_kept`, `tree_bytes`
    run.follow(reporter)    # the reattach: the same follow and end as `train`
    run.stop(); run.fetch(reporter); run.resume(reporter, hosts=["b"]); run.wait(view)

The handle is the CLI's one door to a run; the work stays lifecycle.py's (and resume.py's, waiting.py's).
Its host is `--host` when given, else the local index's (runs/index.py), else the default host; every
other node is opened by name through the fleet. `train` starts one; with a retry policy a followed run
and each retry that resumes it are one chain (resume.Chain), wired here for `train`, `resume` and
`watch` alike. Nothing here prints: what happens reaches the caller through its Reporter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrust_remote.agent.protocol import StatusAnswer
from thrust_remote.backends import backend_for
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.errors import ConnectionLostError, ThrustError, UnknownHostError, UnreachableError, UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.session import HostSession
from thrust_remote.run import lifecycle, repo, waiting
from thrust_remote.run import resume as resuming  # the module; `Run.resume` is the handle's
from thrust_remote.run.vocab import Reporter, TrainOutcome, TrainRequest
from thrust_remote.runs import control, index

LOOK_FOR_TIMEOUT_S = 10.0  # a run the index lacks: how long each host may take to list its runs


@dataclass(frozen=True)
class LogRead:
    """`logs RUN` without --follow: how many bytes of the log came, whose (the node's host when one was
    asked for) and the run's state then."""

    bytes: int
    node_host: str | None
    state: str | None


class Run:
    """One run by its id, reached through `fleet`; `host` is the --host given (None: the index's)."""

    def __init__(self, fleet: Fleet, run_id: str, host: str | None = None) -> None:
        self.fleet = fleet
        self.run_id = control.check_run_id(run_id)
        self.given_host = host
        self._host: tuple[str | None] | None = None  # host()'s answer, once found

    @property
    def config(self) -> Config:
        return self.fleet.config

    def host(self) -> str | None:
        """Node 0's host: --host, else the one the local index recorded, else the one configured host
        that has it when the default host does not; None: the default host. A host the index names that
        this config lacks is UnknownHostError (68) naming the config it came from."""
        if self._host is None:
            self._host = (index.resolve_host(self.config, self.run_id, self.given_host) or self._look_for(),)
        return self._host[0]

    def _look_for(self) -> str | None:
        """A run the index lacks (a launch its scheduler refused after its run dir was made, a run started from
        another checkout): asked of every configured host at once, as `runs --all` asks them, so that
        `status RUN` does not answer "no run on <default host>" for a run another host lists. The default
        host when it has it, or several or none do: None (its own error then says so)."""
        hosts = list(self.config.hosts)
        if len(hosts) < 2:
            return None
        listings = control.list_hosts(hosts, self.fleet.open, LOOK_FOR_TIMEOUT_S)
        having = [h.host for h in listings if any(r.get("run_id") == self.run_id for r in h.runs or [])]
        return having[0] if len(having) == 1 and having[0] != self.config.default_host else None

    def session(self) -> HostSession:
        """A new session on the run's host: the caller's to close."""
        return self.fleet.open(self.host())

    def status(self) -> StatusAnswer:
        """Its state over every node (docs/architecture.md, "JSON shapes"), with `continued_by` when a
        resume or a retry went on from it; its host gone, the error names the run that went on."""
        after = index.continued_by(self.config.root, self.run_id)
        try:
            with self.session() as session:  # over several hosts: every node's state, and the run's
                st = lifecycle.status(session, self.run_id, self.fleet)
        except ThrustError as exc:
            # its host is gone (down, or out of thrust.yaml): the run that went on is what to ask about
            if after and isinstance(exc, (UnreachableError, ConnectionLostError, UnknownHostError)):
                last = after[-1]
                went_on = (f"run {self.run_id} was resumed as {last.run_id} on {last.host}: "
                           f"{command_hint('status', last.run_id, config=self.config.given_path)}")
                exc.hint = "\n".join(filter(None, [went_on, exc.hint]))
            raise
        # the runs the laptop started from it (index), and those its cluster submitted itself (its run.json)
        went_on = [{"run_id": e.run_id, "host": e.host} for e in after]
        for e in st.get("continued_by") or []:
            if isinstance(e, dict) and e.get("run_id") not in {w["run_id"] for w in went_on}:
                went_on.append({"run_id": str(e["run_id"]), "host": str(e.get("host") or st.get("host") or "")})
                remember_continued(self.config, self.run_id, str(e["run_id"]), went_on[-1]["host"])
        if went_on:
            st["continued_by"] = went_on
        return st



    def read_log(self, on_bytes: Callable[[bytes], None], *, node: int | None = None, offset: int = 0) -> LogRead:
        """The log of node `node` (default node 0) from byte `offset`, as it is now, to `on_bytes`. The
        run's status is asked first: a clear error for an unknown id."""
        got = 0

        def counted(chunk: bytes) -> None:
            nonlocal got
            got += len(chunk)
            on_bytes(chunk)

        with self.session() as session:
            first = control.status(session, self.run_id)
            with lifecycle.open_nodes(session, self.run_id, self.fleet, first) as (nodes, _):
                if not nodes.many:  # one host: the nodes its scheduler spread the run over, if it did
                    nodes = backend_for(session.host).nodes(self.run_id, session, first) or nodes
                shown = nodes.nodes[lifecycle.check_node(nodes, node)]
                if shown.session is None:
                    raise UnreachableError(f"run {self.run_id}: node {node} ({nodes.names[node or 0]}) does not "
                                           "answer", f"thrust-remote doctor --host {nodes.names[node or 0]}")
                control.follow_log(shown.session, self.run_id, offset=offset, follow=False, on_bytes=counted,
                                   part=shown.part)
        return LogRead(got, nodes.names[node] if node is not None else None, first.get("state"))

    def follow(self, reporter: Reporter, *, node: int | None = None, offset: int = 0, fetch: bool = True,
               sync_every: float | None = None) -> TrainOutcome:
        """`logs RUN --follow`: the run's follow and end as `train` has them, over every node
        (lifecycle.reattach): a failed node named, a finished train run fetched, the same exit code."""
        with self.session() as session:
            return lifecycle.reattach(self.fleet, session, self.run_id, reporter, node=node, offset=offset,
                                      fetch=fetch, sync_every=sync_every)

    def wait(self, view: waiting.WaitView, *, timeout: float | None = None,
             sync_every: float | None = None) -> StatusAnswer:
        """Until it has ended (its checkpoint pulled meanwhile): its last status (waiting.wait)."""
        return waiting.wait(self.fleet, [self.run_id], view, host=self.given_host, timeout=timeout,
                            sync_every=sync_every)[0]

    def stop(self, grace: float = 10.0) -> list[tuple[str, dict[str, Any] | None]]:
        """Every node at once: each node's host and answer (None: it could not be reached)."""
        with self.session() as session:
            return lifecycle.stop(session, self.run_id, self.fleet, grace)

    def fetch(self, reporter: Reporter, *, force: bool = False, all_checkpoints: bool = False) -> lifecycle.Fetched:
        """Node 0's model, its newest checkpoint (`all_checkpoints`: every one) and its changed artifacts."""
        with self.session() as session:
            try:
                return lifecycle.fetch(self.fleet, session, self.run_id, reporter, force=force,
                                       all_checkpoints=all_checkpoints)
            except UsageError:  # its job is not this config's (`add it under jobs:`): whose run is it?
                not_ours(self.config, session, self.run_id)
                raise

    def resume(self, reporter: Reporter, *, hosts: Sequence[str] = (), sets: Sequence[str] = (),
               params: Path | None = None, detach: bool = False, force: bool = False,
               sync_every: float | None = None, retry: int | None = None,
               max_duration: float | None = None) -> TrainOutcome:
        """A new run of its job at its code, from its newest checkpoint, on `hosts` (default: its own);
        followed unless `detach`, and then by the job's retry policy (or `retry`) with its retries.
        `max_duration`: `resume --max-duration`, over the job's and the run's own bound."""
        source = resuming.plan(self.fleet, self.run_id, reporter, hosts=hosts, force=force)
        if max_duration is not None:
            source.job = dataclasses.replace(source.job, max_duration=max_duration)
        for note in source.notes:
            reporter.warn(note)
        reporter.step(f"resuming run {self.run_id} ({source.job.name}) from checkpoint "
                      f"{source.resume.label} on {', '.join(source.hosts)}")  # type: ignore[union-attr]
        make = _attempts(self.fleet, reporter, sets=sets, params=params, detach=detach, sync_every=sync_every)
        policy = None if detach else resuming.policy_for(source.job, retry)
        if policy is None:
            return make(source)
        return _chain(self.fleet, policy, reporter, make, sync_every).run(lambda: make(source))

    def watch(self, reporter: Reporter, *, retry: int | None = None, sync_every: float | None = None) -> TrainOutcome:
        """Follow it (as `follow`) and, by its job's retry policy (or `retry`), each run that resumes it."""
        config, run_id = self.config, self.run_id
        name = self.host() or config.default_host
        job = _job_of(self.fleet, run_id, name)
        follow = _reattach(self.fleet, reporter, sync_every)
        policy = resuming.policy_for(job, retry)
        if policy is None:
            reporter.warn(f"job {job.name} has no retry policy (`retry:` or --retry N): this follows run {run_id} "
                          "only")
            return follow(run_id, name)
        resuming.template_of(job)  # a job that cannot continue from a checkpoint: 64 now, not when a host dies
        make = _attempts(self.fleet, reporter, sync_every=sync_every)
        return _chain(self.fleet, policy, reporter, make, sync_every).run(lambda: follow(run_id, name))


def train(fleet: Fleet, request: TrainRequest, hosts: Sequence[HostConfig], reporter: Reporter, *,
          max_restarts: int = 0, retry: int | None = None) -> TrainOutcome:
    """`train JOB`: what the run cannot be, said before anything connects; then its life (lifecycle.train)
    over a session per host and, attached, by the job's retry policy (or `retry`), each retry as one
    chain. The reattach hints repeat the fleet's --config. The request is checked where it starts
    (lifecycle.train_request), once: nothing before it acts or speaks (a chain's first step is `first`)."""

    def first() -> TrainOutcome:
        return lifecycle.train_request(fleet, request, hosts, reporter, max_restarts=max_restarts, retry=retry,
                                       as_train=True)

    if request.detach:
        return first()
    policy = resuming.policy_of(request.job.retry, retry)
    if policy is None:
        return first()
    make = _attempts(fleet, reporter, sync_every=request.sync_every)
    return _chain(fleet, policy, reporter, make, request.sync_every).run(first)


# ------------------------------------------------------------------------------------------ a chain's parts

def not_ours(config: Config, session: HostSession, run_id: str) -> None:
    """A run on a host this project shares with another (`runs --all` lists both projects' runs) that
    this project did not start (its index has no entry) and whose job its config lacks: 64 saying whose
    it is by what its record holds (its job, its commit, here or not), and the fetch to run from there,
    never `add it under jobs:` (the other project has it). Returns when the run may be this project's."""
    st = control.status(session, run_id)
    job, commit = str(st.get("job") or ""), str(st.get("commit") or "")
    if not job or job in config.jobs or index.lookup(config.root, run_id) is not None:
        return
    here = bool(commit) and repo.git(config.root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0
    whose = ((f"its commit {commit[:12]} is in this repository, so another checkout of it" if here else
              f"its commit {commit[:12]} is not in this repository, so another project") if commit else
             "another project") + " launched it"
    fetch = command_hint("fetch", run_id, host=session.host)
    project = _launched_from(session, run_id)
    if project is not None:  # that project is on this laptop: the command goes there and fetches
        record_host = str(st.get("host") or "") or session.name  # its thrust.yaml's name for the host
        fetch = f"cd {shlex.quote(project)} && {command_hint('fetch', run_id, host=record_host)}"
    raise UsageError(f"run {run_id} on {session.name} is another project's run: its job {job!r} is not in "
                     f"{config.path or 'thrust.yaml'} and this project's index has no such run; {whose}",
                     f"fetch it from that project's directory (the one whose thrust.yaml has job {job}): {fetch}")


def _launched_from(session: HostSession, run_id: str) -> str | None:
    """The project directory run.json says the run was launched from, when it is one on this laptop (a
    record of another machine's, or of an older launch, has none that is here)."""
    try:
        record = control.read_run_json(session, session.paths.run(run_id)) or {}
    except ThrustError:
        return None
    project = record.get("project")
    return project if isinstance(project, str) and Path(project).is_absolute() and Path(project).is_dir() else None


def _job_of(fleet: Fleet, run_id: str, name: str) -> JobConfig:
    """The configured job of a run to watch: the index's, else the one its host names (64 without one)."""
    config = fleet.config
    entry = index.lookup(config.root, run_id)
    job = config.jobs.get(entry.job) if entry else None
    if job is None:
        with fleet.open(name) as session:
            job = config.jobs.get(str(control.status(session, run_id).get("job") or ""))
    if job is None:
        raise UsageError(f"run {run_id}'s job is not one of this config's: there is nothing to retry it as",
                         f"follow it with: thrust-remote logs {run_id} --follow --host {name}")
    return job


def _attempts(fleet: Fleet, reporter: Reporter, *, sets: Sequence[str] = (), params: Path | None = None,
              detach: bool = False, sync_every: float | None = None) -> Callable[[resuming.Source], TrainOutcome]:
    """A resumed run started (and followed unless detached) from a plan, on a session per host."""

    def make(source: resuming.Source) -> TrainOutcome:
        hosts = fleet.config.host_list(list(source.hosts))
        request = resuming.request_for(source, hosts[0], sets=list(sets), params_file=params, detach=detach,
                                       sync_every=sync_every)
        return lifecycle.train_request(fleet, request, hosts, reporter)

    return make


def remember_continued(config: Config, run_id: str, new_id: str, host: str) -> None:
    """A run its cluster submitted itself (the backend's `continues_on`), in the local index as its
    parent is (its host, job, code), so `status`, `logs` and `resume` of it need no --host."""
    entry = index.lookup(config.root, run_id)
    if entry is None or index.lookup(config.root, new_id) is not None or host not in config.hosts:
        return
    with contextlib.suppress(OSError):
        index.record(config.root, dataclasses.replace(
            entry, run_id=new_id, host=host, started_at=index.now(), resumed_from=run_id,
            run_dir=entry.run_dir.replace(run_id, new_id) if entry.run_dir else entry.run_dir))


def _reattach(fleet: Fleet, reporter: Reporter, sync_every: float | None) -> Callable[[str, str], TrainOutcome]:
    """A run followed again on the host `name` (a reattach)."""

    def follow(run_id: str, name: str) -> TrainOutcome:
        with fleet.open(name) as session:
            return lifecycle.reattach(fleet, session, run_id, reporter, sync_every=sync_every)

    return follow


def _chain(fleet: Fleet, policy: resuming.RetryPolicy, reporter: Reporter,
           make: Callable[[resuming.Source], TrainOutcome], sync_every: float | None) -> resuming.Chain:
    """The retry chain's callables over the fleet: resume a run on hosts, follow one again, ask a host
    whether it answers, a run's nodes from the index, the exact command a hint names."""
    config = fleet.config

    def attempt(run_id: str, hosts: list[str]) -> TrainOutcome:
        source = resuming.plan(fleet, run_id, reporter, hosts=hosts, force=True)
        reporter.note(f"retry: run {run_id} resumes from checkpoint {source.resume.label} on "  # type: ignore[union-attr]
                      f"{', '.join(source.hosts)}")
        return make(source)

    def hosts_of(run_id: str) -> list[str]:
        entry = index.lookup(config.root, run_id)
        return list(entry.nodes or (entry.host,)) if entry else []

    def hint(command: str, run_id: str, host: str) -> str:
        return command_hint(command, run_id, host=config.hosts.get(host) or host, config=fleet.config_path)

    return resuming.Chain(policy, reporter, attempt=attempt, follow=_reattach(fleet, reporter, sync_every),
                          answers=resuming.probe(fleet), hosts_of=hosts_of, hint=hint,
                          went_on=lambda old, new, host: remember_continued(config, old, new, host),
                          scheduler=lambda host: backend_for(config.hosts[host]).scheduler if host in config.hosts
                          else "its scheduler's")
