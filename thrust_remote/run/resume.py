"""Runs that outlive their host: `resume RUN` and the retry of a followed run (docs/architecture.md,
"Checkpoints and resume").

`resume` is a new run (a new id, `resumed_from` in its run.json and in the local index) of the same
job at the same code (the run's commit and the uncommitted patch it ran with, kept beside its index
entry), started from the run's newest checkpoint: the one on its own host when it stays there and that
host answers (pulled first, so a copy is here too), else the newest one pulled before, hashed again
and uploaded verified to every node. The job's `resume:` template ("{checkpoint}" filled) is what
tells it to continue; the built-in trainer's is known. A job that reads its checkpoint from a fixed place
of its own tree (`resume: {args: [...], checkpoint_at: out/ckpt.pt}`) finds it copied there, verified,
before it starts, and its arguments go as they are.

`Chain` is the retry: a followed run whose host stops answering, or that ends LOST (or FAILED, when
asked), is resumed on its host when it answers again, else on the next of the job's `retry: hosts`;
each attempt is said and recorded, first attempt first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import posixpath
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrust_remote.agent import placing
from thrust_remote.agent.protocol import (
    CHECKPOINT_FIELD,
    MAX_DURATION,
    PATCH,
    PREEMPTED,
    TIMEOUT,
    RunState,
    StatusAnswer,
)
from thrust_remote.core.config import RETRY_ON_DEFAULT, Config, JobConfig, RetryConfig
from thrust_remote.core.errors import (
    ConnectionLostError,
    Detached,
    ExitCode,
    ThrustError,
    TransferError,
    UnreachableError,
    UsageError,
)
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.fetch import checkpoints
from thrust_remote.host.fleet import Fleet
from thrust_remote.host.session import HostSession
from thrust_remote.run import fetching, stages, vocab
from thrust_remote.run.vocab import Reporter, ResumeFrom, TrainOutcome
from thrust_remote.runs import control, index

TRAINER_TEMPLATE = ("--resume-from", CHECKPOINT_FIELD)  # trainer/args.py: --resume-from CKPT


RESUME_EXAMPLE = (f'`resume: [--resume-from, "{CHECKPOINT_FIELD}"]` (the arguments your code takes, '
                  f'"{CHECKPOINT_FIELD}" where the path goes), or `resume: {{args: [--init_from=resume], '
                  "checkpoint_at: out/ckpt.pt}` (where your code reads it)")


def template_of(job: JobConfig) -> tuple[str, ...]:
    """The arguments that continue the job from a checkpoint (none, or none naming it, for a job that
    reads it from a fixed place of its tree: its `resume_at`, where `place` puts it); a job that does not
    say how it continues cannot be resumed (64)."""
    if checkpoints.checkpoint_glob(job) is None:
        raise UsageError(f"job {job.name} declares no checkpoints: there is nothing to resume it from",
                         f"add `checkpoints: GLOB` (where your code writes them) and {RESUME_EXAMPLE} "
                         f"under jobs.{job.name} in {config_file(job)}")
    if job.resume or job.resume_at:
        return job.resume
    if job.kind == "trainer":
        return TRAINER_TEMPLATE
    raise UsageError(f"job {job.name} does not say how to continue from a checkpoint (`resume:`)",
                     f"add {RESUME_EXAMPLE} under jobs.{job.name} in {config_file(job)}")


def place(prepared: stages.Prepared, resume: ResumeFrom, run_id: str, *, relative: bool) -> str:
    """The checkpoint a resumed run starts from placed on this node (stages.place_checkpoint: verified,
    in the new run's directory), and, for a job that reads it from a fixed place of its tree, copied
    there too before the job starts: whole (renamed into place), with the sha256 it was verified by,
    refused when that place leaves the run's tree (links resolved on the host)."""
    path = stages.place_checkpoint(prepared, resume, run_id, relative=relative)
    at = prepared.job.resume_at  # the job's (template_of made resume.template from the same job)
    if at is None:
        return path
    session = prepared.session
    source = posixpath.normpath(posixpath.join(prepared.cwd, path))  # absolute already unless `relative`
    tree = session.paths.tree(run_id)
    root = tree if prepared.cwd == tree or prepared.cwd.startswith(f"{tree}/") else prepared.cwd
    answer = session.agent_json("place-checkpoint", "place-checkpoint", "--src", source, "--root", root,
                                "--cwd", prepared.cwd, "--at", at,
                                *(("--sha256", sha) if (sha := _verified_sha(prepared, resume)) else ()))
    if not isinstance(answer, dict) or "error" in answer or "path" not in answer:
        why = answer.get("error") if isinstance(answer, dict) else repr(answer)
        said = f"run {run_id}: the checkpoint {resume.label} was not placed at {at} on {session.name}: {why}"
        if isinstance(answer, dict) and answer.get("why") == placing.OUTSIDE:
            file = config_file(session.host)
            raise UsageError(said, f"`resume: {{checkpoint_at: {at}}}` under jobs.{prepared.job.name} in {file} "
                                   "names where your code reads it, relative to its working directory, inside the "
                                   "run's tree (no link out of it): fix it, then run the resume again")
        raise TransferError(said, "nothing was placed and the run did not start: fetch the checkpoint again from the "
                                  f"run's host, then: {command_hint('resume', resume.run_id, host=session.host)}")
    return path


def _verified_sha(prepared: stages.Prepared, resume: ResumeFrom) -> str | None:
    """The sha256 the checkpoint was verified by: the pulled copy's, else the run's own file as its
    newest pull recorded it (the pull that just ran on its host, in `plan`)."""
    if resume.local_sha256:
        return resume.local_sha256
    if resume.on_host is None:
        return None
    files = checkpoints.read_record(prepared.config.root, resume.run_id).get("files") or {}
    row = files.get(posixpath.basename(resume.on_host)) or {}
    sha = row.get("sha256")
    return sha if isinstance(sha, str) else None


@dataclass
class Source:
    """The run `resume` continues, as far as it is known here: its job, its hosts, what it was given."""

    run_id: str
    job: JobConfig
    hosts: tuple[str, ...]  # its nodes, node 0 first: where it resumes unless told otherwise
    sets: tuple[str, ...] = ()
    params: dict[str, Any] | None = None
    resume: ResumeFrom | None = None
    notes: list[str] = field(default_factory=list)


def plan(fleet: Fleet, run_id: str, reporter: Reporter, *, hosts: Sequence[str] = (), force: bool = False) -> Source:
    """What resuming `run_id` on `hosts` (default: its own) takes, checked before anything starts: the
    run not still going (unless `force`), its job's template, its code, its newest checkpoint verified."""
    config, run_id = fleet.config, control.check_run_id(run_id)
    entry = index.lookup(config.root, run_id)
    head = entry.host if entry else (hosts[0] if hosts else config.default_host)
    own = tuple(entry.nodes or (entry.host,)) if entry else (head,)
    targets = tuple(hosts) or own
    if entry is not None and entry.job in config.jobs:
        template_of(config.jobs[entry.job])  # a job that cannot resume is refused before anything is asked
    meta, on_host, patch = _ask_head(fleet, run_id, head, reporter, force=force,
                                     same_host=tuple(targets) == (head,), known=entry is not None)
    job_name = (entry.job if entry else "") or str(meta.get("job") or "")
    if not job_name:
        raise UsageError(f"run {run_id} is not in this project's index and {head} did not say its job",
                         "give --host the host it ran on (it must answer), or resume from the project that started it")
    job = _bounded_as_it_ran(config.job(job_name), meta)
    template = template_of(job)
    commit = (entry.commit if entry else None) or meta.get("commit")
    want = (entry.patch_sha256 if entry else None) or meta.get("patch_sha256")
    patch = _patch(config, run_id, want, patch)
    local = None if on_host else checkpoints.newest_verified(config.root, run_id)
    if local is None and on_host is None:
        raise ThrustError(f"run {run_id} has no checkpoint to resume from here: {_why_none(meta, head)}",
                          _none_hint(config, run_id, job, head, meta, entry.sets if entry else ()), ExitCode.USAGE)
    label = Path(on_host).name if on_host else local.path.name  # type: ignore[union-attr]
    resume = ResumeFrom(run_id, commit, patch, template, local=local.path if local else None,
                        local_sha256=local.sha256 if local else None, on_host=on_host, label=label)
    source = Source(run_id, job, targets, entry.sets if entry else (), entry.params if entry else None, resume)
    if local is not None:  # how old the copy is: the run may have gone further on a host that did not answer
        further = "" if meta.get("answered") else f"; {head} did not answer, so the run may have gone further there"
        source.notes.append(f"resuming from the checkpoint pulled here: "
                            f"{checkpoints.describe(config.root, run_id) or local.path.name}{further}")
    if entry is None:
        source.notes.append(f"run {run_id} is not in this project's index: the --set and --params it was given are "
                            "not known here; it continues with the job's own arguments and yours")
    return source


def _bounded_as_it_ran(job: JobConfig, meta: Mapping[str, Any]) -> JobConfig:
    """The job as the continuation runs it: a run given `train --max-duration` (its run.json's bound) goes
    on with that bound unless the job now has one of its own in thrust.yaml (`resume --max-duration` is
    applied over either by the caller)."""
    bound = meta.get("max_duration")
    if job.max_duration is not None or not isinstance(bound, int | float) or isinstance(bound, bool) or bound <= 0:
        return job
    return dataclasses.replace(job, max_duration=float(bound))


def _ask_head(fleet: Fleet, run_id: str, head: str, reporter: Reporter, *,
              force: bool, same_host: bool, known: bool) -> tuple[dict[str, Any], str | None, bytes | None]:
    """The run's host, when it answers: refuse a run still going, pull its newest checkpoint (fresher
    than any copy here, and a copy here whatever happens next), and read its run.json and patch.
    (run.json, the checkpoint's path there when the new run stays on that host, the patch) — empty and
    None when the host does not answer. A run this project did not start (`known` False) is only known
    by its host: one that does not answer leaves nothing to go on."""
    try:
        with fleet.open(head) as session:  # the link opens on first use: inside, so a host down is caught
            return _asked(fleet.config, session, run_id, reporter, force=force, same_host=same_host)
    except (UnreachableError, ConnectionLostError) as exc:
        if not known:
            raise UnreachableError(f"run {run_id} is not in this project's index, and {head}, where it was looked "
                                   f"for, does not answer ({exc.message})",
                                   "give --host the host it ran on once that answers, or resume from the project "
                                   "that started it") from None
        reporter.warn(f"{head}, where run {run_id} ran, does not answer ({exc.message}): resuming from the "
                      "checkpoint pulled before")
        return {}, None, None


def _asked(config: Config, session: HostSession, run_id: str, reporter: Reporter, *, force: bool,
           same_host: bool) -> tuple[dict[str, Any], str | None, bytes | None]:
    st = control.status(session, run_id)
    state = RunState.of(st.get("state"))
    if state.is_live and not force:
        raise UsageError(f"run {run_id} is still {state} on {session.name}: a resumed copy would train beside it",
                         f"stop it first: {command_hint('stop', run_id, host=session.host)}; or give --force "
                         "to resume it anyway")
    run_dir = session.paths.run(run_id)
    meta = control.read_run_json(session, run_dir) or {}
    job = config.jobs.get(str(meta.get("job") or st.get("job") or ""))
    on_host = None
    if job is not None and checkpoints.checkpoint_glob(job) is not None:
        got = fetching.pull_checkpoint(config, session, job, run_dir, run_id, reporter)
        on_host = got.newest_on_host if (same_host and got is not None) else None
    patch = _host_patch(session, run_dir) if meta.get("dirty") else None
    return {**meta, "answered": True, "live": state.is_live}, on_host, patch


def _host_patch(session: HostSession, run_dir: str) -> bytes | None:
    """The patch the run ran with, from its run directory (verified transfer); None when it is not there."""
    with tempfile.TemporaryDirectory(prefix="thrust-patch-") as tmp:
        try:
            session.runner.get(f"{run_dir}/{PATCH}", Path(tmp) / PATCH)
        except ThrustError:
            return None
        return (Path(tmp) / PATCH).read_bytes()


def _patch(config: Config, run_id: str, want: str | None, from_host: bytes | None) -> bytes:
    """The uncommitted patch the run ran with (b"" for a clean tree): kept beside its index entry, else
    its host's copy; either must match the sha256 recorded at launch."""
    if not want:
        return b""
    for patch in (index.read_patch(config.root, run_id), from_host):
        if patch is not None and hashlib.sha256(patch).hexdigest() == want:
            return patch
    raise TransferError(f"run {run_id} ran with uncommitted changes (patch {want[:12]}), and neither this project "
                        "nor its host has that patch now: its code cannot be rebuilt",
                        "commit the changes you want and start a new run: thrust-remote train JOB")


def _none_hint(config: Config, run_id: str, job: JobConfig, head: str, meta: dict[str, Any],
               sets: Sequence[str]) -> str:
    """What works when there is nothing to continue from. A host that answered has none of it, so a `fetch`
    brings none either: an ended run is run again (its --set words, as a followed run's end says), a live
    one (--force) waits for its first; a host that did not answer may hold one a fetch brings later."""
    host = config.hosts.get(head)
    if not meta.get("answered"):
        return ("a followed run pulls its newest checkpoint every --sync-every seconds and when it ends; once "
                f"{head} answers, pull one by hand with: {command_hint('fetch', run_id, host=host)}")
    if meta.get("live"):
        return (f"it has written none yet (its checkpoints: glob, {checkpoints.checkpoint_glob(job)}); resume it once "
                f"it has: {command_hint('resume', run_id, '--force', host=host)}")
    again = command_hint("train", job.name, *(w for s in sets for w in ("--set", s)), host=host)
    return f"there is none to continue from, here or on {head}; run it again: {again}"


def _why_none(meta: dict[str, Any], head: str) -> str:
    if meta.get("answered"):
        return f"{head} has none of it (did the job write any yet? see its `checkpoints:` glob)"
    return f"{head} does not answer, and none was pulled while the run was followed"


def request_for(source: Source, host_config: Any, *, sets: Sequence[str] = (), params_file: Path | None = None,
                detach: bool = False, sync_every: float | None = None, force: bool = False) -> vocab.TrainRequest:
    """The new run's request: the job, the run's own --set words and parameters, then yours (later wins)."""
    return vocab.TrainRequest(job=source.job, host=host_config, sets=[*source.sets, *sets], params=source.params,
                              params_file=params_file, detach=detach, resume=source.resume, sync_every=sync_every,
                              force=force)


# ------------------------------------------------------------------------------------------ retry

RETRY_GRACE_S = 60.0  # how long a host that stopped answering gets to answer again before its run moves
GRACE_POLL_S = 5.0  # how often it is asked meanwhile
RETRY_POLL_S = 15.0  # how often a lost host with nowhere else to go is asked whether it is back


@dataclass(frozen=True)
class RetryPolicy:
    """What a Chain answers: the job's `retry:` (RetryConfig) with the laptop's defaults filled and
    `--retry N` applied; built from the section in one place, `of`."""

    max: int
    on: tuple[str, ...] = RETRY_ON_DEFAULT
    hosts: tuple[str, ...] = ()
    grace: float = RETRY_GRACE_S

    @classmethod
    def of(cls, section: RetryConfig | None, count: int) -> RetryPolicy:
        if section is None:
            return cls(count)
        grace = RETRY_GRACE_S if section.grace is None else float(section.grace)
        return cls(count, section.on or RETRY_ON_DEFAULT, section.hosts, grace)  # `on: []`: the default


def policy_for(job: JobConfig, given: int | None) -> RetryPolicy | None:
    """`--retry N` (with the job's `on:`/`hosts:`/`grace:` when it has them), else the job's `retry:`;
    None: off."""
    return policy_of(job.retry, given)


def policy_of(section: RetryConfig | None, given: int | None) -> RetryPolicy | None:
    """policy_for from the one field it reads (the job's `retry:`): what a caller holding a request
    hands, rather than the request's whole job."""
    count = given if given is not None else (section.max if section else 0)
    return RetryPolicy.of(section, int(count)) if count else None


Answers = Callable[..., "StatusAnswer | None"]  # (host, run_id=None) -> the run's status, None: no answer
Hint = Callable[[str, str, str], str]  # (command, run id, host) -> the exact command to type


def event_of(status: StatusAnswer | None) -> str | None:
    """The retry event a run's end is: `lost`, `failed`, or None (finished, stopped); on a cluster
    its time limit (`timeout`) and a preemption (`preempted`) are events of their own, and so is a stop
    at the job's `max_duration:` (`max-duration`, retried only when `on:` names it)."""
    state = RunState.of((status or {}).get("state"))
    reason = (status or {}).get("reason")
    if (state, reason) in ((RunState.FAILED, TIMEOUT), (RunState.LOST, PREEMPTED),
                           (RunState.STOPPED, MAX_DURATION)):
        return str(reason)
    return {RunState.LOST: "lost", RunState.FAILED: "failed"}.get(state)


class Chain:
    """A followed run and its retries. `first` follows the run (train, a reattach); `attempt(run_id,
    hosts)` resumes `run_id` on `hosts` and follows the new run; `follow(run_id, host)` reattaches to a
    run that turned out to go on; `answers(host, run_id)` is None when the host does not answer now, else
    the run's status there ({} without a run id); `hint(command, run_id, host)` the command to type."""

    def __init__(self, policy: RetryPolicy, reporter: Reporter, *, attempt: Callable[[str, list[str]], TrainOutcome],
                 follow: Callable[[str, str], TrainOutcome], answers: Answers,
                 hosts_of: Callable[[str], list[str]],
                 hint: Hint = lambda command, run_id, host: command_hint(command, run_id, host=host),
                 went_on: Callable[[str, str, str], None] = lambda old, new, host: None,
                 scheduler: Callable[[str], str] = lambda host: "its scheduler's",
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.reporter = policy, reporter
        self.attempt, self.follow_again, self.answers = attempt, follow, answers
        self.hosts_of, self.hint, self.sleep, self.clock = hosts_of, hint, sleep, clock
        self.went_on = went_on  # (run, the run its cluster submitted itself, host): recorded (the index)
        self.scheduler = scheduler  # a host's scheduler by name (its backend's), for the words said
        self.attempts: list[dict[str, Any]] = []
        self.used: set[str] = set()
        self.moved: list[tuple[str, str]] = []  # (run, host) resumed elsewhere while its host was silent

    def run(self, first: Callable[[], TrainOutcome]) -> TrainOutcome:
        step, retries = first, 0
        while True:
            outcome, lost = self._one(step)
            run_id = outcome.launched.run_id if outcome else lost.run_id  # type: ignore[union-attr]
            host = outcome.launched.host if outcome else lost.host  # type: ignore[union-attr]
            event = "host-lost" if outcome is None else event_of(outcome.status)
            ended = (outcome.status or {}).get("state") if outcome else RunState.UNREACHABLE.value
            self.attempts.append({"run_id": run_id, "host": host, "state": ended})
            went_on = (outcome.status or {}).get("continued_by") if outcome else None
            if went_on and event in self.policy.on:  # the cluster resubmitted it itself: that one, never a second
                retries += 1
                step = self._went_on(run_id, str(host), event, went_on[-1])
                continue
            if event is None or event not in self.policy.on or retries >= self.policy.max or run_id is None:
                self._say_moved()
                if outcome is None:
                    raise lost  # type: ignore[misc]
                if len(self.attempts) > 1:
                    outcome.attempts = self.attempts
                return outcome
            retries += 1
            step = self._next(run_id, str(host), event, retries)

    def _went_on(self, run_id: str, host: str, event: str, went_on: dict[str, Any]) -> Callable[[], TrainOutcome]:
        """A cluster's run that submitted its next attempt itself at its time limit or when preempted
        (the backend's `continues_on`): followed."""
        new_id, where = str(went_on.get("run_id")), str(went_on.get("host") or host)
        why = "it was preempted" if event == PREEMPTED else "it reached its time limit"
        self.reporter.warn(f"run {run_id}: {why}; the cluster resubmitted it as {new_id} "
                           f"({self.scheduler(where)} job {went_on.get('scheduler_job')}) from its checkpoint: "
                           "following it")
        self.went_on(run_id, new_id, where)
        return lambda: self.follow_again(new_id, where)

    def _one(self, step: Callable[[], TrainOutcome]) -> tuple[TrainOutcome | None, ConnectionLostError | None]:
        try:
            return step(), None
        except ConnectionLostError as exc:
            if exc.run_id is None:
                raise
            return None, exc
        except Detached as exc:  # Ctrl-C: the way back in keeps the retries (`logs -f` has none)
            if exc.run_id and exc.host:
                exc.hint = (f"follow it again with its retries: {self.hint('watch', exc.run_id, exc.host)}   "
                            f"(without them: {exc.hint})")
            self._say_moved()
            raise

    def _next(self, run_id: str, host: str, event: str, n: int) -> Callable[[], TrainOutcome]:
        """Where the next attempt goes: back to a run that went on after all (its host answers again
        within the grace), else a resume on the run's hosts, each one that does not answer replaced by
        the next of `retry: hosts`."""
        what = {"host-lost": f"{host} stopped answering", "lost": "it ended LOST (its host restarted?)",
                "failed": "it FAILED", TIMEOUT: "it reached its time limit",
                PREEMPTED: "the scheduler preempted it",
                MAX_DURATION: "it reached its max_duration"}[event]
        self.reporter.warn(f"run {run_id}: {what}; retry {n} of {self.policy.max}")
        nodes = self.hosts_of(run_id) or [host]
        if event == "host-lost":
            st = self._back_within_grace(host, run_id)
            if st is not None and RunState.of(st.get("state")).is_live:
                self.reporter.step(f"{host} answers again and run {run_id} goes on there: following it again")
                return lambda: self.follow_again(run_id, host)
        targets = [self._where(node, run_id) for node in nodes]
        if event == "host-lost" and host not in targets:
            self.moved.append((run_id, host))
            self.reporter.warn(f"if run {run_id} still goes on on {host} (only its link may be down), it trains "
                               f"beside the resumed one until stopped: {self.hint('stop', run_id, host)}")
        self.reporter.step(f"resuming run {run_id} on {', '.join(targets)}")
        return lambda: self.attempt(run_id, targets)

    def _back_within_grace(self, host: str, run_id: str) -> StatusAnswer | None:
        """The run's status on `host` once it answers again, asked every GRACE_POLL_S s for the policy's
        grace; None when it stays silent that long."""
        if self.policy.grace > 0:
            self.reporter.step(f"asking {host} again for up to {self.policy.grace:g} s before moving run {run_id}")
        deadline = self.clock() + self.policy.grace
        while True:
            st = self.answers(host, run_id)
            if st is not None or self.clock() >= deadline:
                return st
            self.sleep(min(GRACE_POLL_S, max(0.0, deadline - self.clock())))

    def _where(self, node: str, run_id: str) -> str:
        """`node` when it answers, else the next host of `retry: hosts` that does; with none to go to, the
        node itself once it answers again (asked every RETRY_POLL_S s; Ctrl-C leaves)."""
        if self.answers(node) is not None:
            return node
        self.used.add(node)
        for other in self.policy.hosts:
            if other not in self.used and self.answers(other) is not None:
                self.used.add(other)
                return other
        why = "no host of `retry: hosts` answers" if self.policy.hosts else "the job's `retry:` names no other hosts"
        self.reporter.step(f"{why}: waiting for {node} to come back (Ctrl-C leaves; what was pulled stays here)")
        try:
            while self.answers(node) is None:
                self.sleep(RETRY_POLL_S)
        except KeyboardInterrupt:
            raise Detached(f"from waiting for {node} to come back",
                           f"what was pulled stays here; continue later with: {self.hint('resume', run_id, node)}"
                           ) from None
        return node

    def _say_moved(self) -> None:
        """A run moved off a silent host that turns out to be going on there: said, with the stop command."""
        for run_id, host in self.moved:
            st = self.answers(host, run_id)
            if st is not None and RunState.of(st.get("state")).is_live:
                self.reporter.warn(f"run {run_id} is still {st.get('state')} on {host}, beside the run that resumed "
                                   f"it: stop it with: {self.hint('stop', run_id, host)}")
        self.moved = []


def probe(fleet: Fleet) -> Answers:
    """`answers(host, run_id)` for a Chain: None when the host does not answer now, else the run's
    status there ({} when no run is asked about)."""

    def answers(host: str, run_id: str | None = None) -> StatusAnswer | None:
        with contextlib.suppress(UnreachableError, ConnectionLostError), fleet.open(host) as session:
            if run_id:
                return control.status(session, run_id)
            session.runner.run(["true"], timeout=30).check(f"true on {host}")  # the link opens on first use
            return {}
        return None

    return answers
