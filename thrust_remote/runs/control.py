"""Detached runs on a host: launch, status, list, logs from a byte offset, stop.

Everything that must outlive the link happens on the host, in the agent's `runs` module
(thrust_remote/agent/supervisor.py). This module only builds its argv and reads its JSON answers, through
a HostSession (docs/architecture.md, "The run directory on the host" and "JSON shapes").
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from thrust_remote.agent.protocol import (
    LOG,
    LOG_START,
    RUN_JSON,
    RUN_JSON_MAX,
    AgentExit,
    LaunchAnswer,
    RunRecord,
    RunState,
    StatusAnswer,
    new_run_id,
    run_record,
)
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ConnectionLostError, ExitCode, ThrustError, TransferError, UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.session import HostPaths, HostSession, check_run_id, host_paths, parse_json

__all__ = ["HostPaths", "HostSession", "check_run_id", "follow_log", "host_paths", "launch",
           "HostListing", "launch_lock", "list_hosts", "list_runs", "new_run_id", "see_or_stop", "status", "stop"]


LAUNCH_S = 60.0  # the launch request's deadline (and its outcome's, asked again when no answer came)

# a launch answer's refusal told in a backend's own words: the error to raise, None when not its own
Explain = Callable[[Mapping[str, object], str, HostConfig], "ThrustError | None"]


@dataclass(frozen=True)
class Submission:
    """A run handed to the host's scheduler instead of started (thrust_remote/backends/): the agent's
    launch flags and payload keys its backend gives, and how that backend explains a refusal. The answer
    is then {"queued", "scheduler_job"}."""

    flags: tuple[str, ...]
    payload: Mapping[str, object]
    explain: Explain


@dataclass(frozen=True)
class QueueAsk:
    """`train --queue`: what the run waits for on the host (agent/runqueue.py). `order`: over several
    hosts, the laptop's submit time, the same on every node so all hosts queue runs alike; None on one
    host, where the host's own clock orders its queue (a laptop's clock may be off)."""

    order: float | None
    gpus: tuple[int, ...] = ()  # these GPUs (--gpus 0,2, or every GPU of the host when none was asked)
    count: int = 0  # or this many of `pool`, chosen on the host when it starts (--gpus N)
    pool: tuple[int, ...] = ()
    cpu_slots: int = 1  # neither: one of the host's CPU slots (hosts.H.cpu_slots)

    def argv(self) -> list[str]:
        """The launch's queue options (`gpus` travel as its --gpus claim)."""
        return ["--queue", *(["--order", repr(self.order)] if self.order is not None else []),
                *(["--gpu-count", str(self.count), "--gpu-pool", ",".join(map(str, self.pool))] if self.count else []),
                "--cpu-slots", str(self.cpu_slots)]


def launch(
    session: HostSession,
    *,
    run_id: str,
    job: str,
    argv: Sequence[str],
    cwd: str,
    env: Mapping[str, str],
    meta: Mapping[str, object],  # run.json's fields (RunRecord's): checked by name, run_record
    claim_gpus: Sequence[int] = (),
    queue: QueueAsk | None = None,
    submit: Submission | None = None,
) -> LaunchAnswer:
    """Start argv detached under the supervisor; returns {"pid", "run_dir", "marker"}.

    Several runs of one job may run at once, each in its own run dir. `claim_gpus`: refuse (under
    the host's launch lock) when a RUNNING run holds one of these GPUs (docs/architecture.md). A launch
    whose answer never comes (the link lost, the agent stopped answering, its deadline) is asked again
    before anything else (`_settle`): a run that started is carried on with, one that did not never will.
    `submit`: the agent hands the run to the host's scheduler instead of starting it (Submission)."""
    host, paths = session.host, session.paths
    marker = secrets.token_hex(8)
    args = [
        "launch",
        "--run-dir", paths.run(run_id),
        "--cwd", cwd,
        "--lock", launch_lock(paths),
        *(["--gpus", ",".join(str(g) for g in claim_gpus)] if claim_gpus else []),
        *(queue.argv() if queue else []),
        *(submit.flags if submit is not None else ()),
        "--marker", marker,
        "--stdin",
        "--", *argv,
    ]
    # meta and env go on stdin: a command line is world-readable (ps), env values may be secrets. The
    # record's job and host come first, the caller's fields over them; a field RunRecord lacks is a
    # TypeError here, never a key nobody on the host reads
    record = run_record(**{"job": job, "host": host.name, **meta})
    payload = json.dumps({"meta": record, "env": dict(env),
                          **(dict(submit.payload) if submit is not None else {})}).encode()
    try:
        result = session.agent(*args, timeout=LAUNCH_S, stdin=payload)
    except ConnectionLostError as exc:
        return _settle(session, run_id, exc.message)
    if result.timed_out:
        return _settle(session, run_id, f"its launch did not answer within {LAUNCH_S:g} s")
    try:
        answer = json.loads(result.stdout.strip().splitlines()[-1]) if result.stdout.strip() else {}
    except ValueError:
        answer = {}
    explained = submit.explain(answer, run_id, host) if submit is not None else None
    if explained is not None:
        raise explained
    _refused(answer, run_id, host)
    if not result.ok or ("pid" not in answer and not answer.get("queued")):
        raise ThrustError(
            f"could not launch {argv[0]} on {host.name}: {answer.get('error') or result.stderr.strip()[-300:]}"
        )
    return answer


def _settle(session: HostSession, run_id: str, cause: str) -> LaunchAnswer:
    """A launch whose answer never came (`cause`), asked again on a fresh link under the host's launch
    lock (agent `launch-outcome`): the answer of a run that started (or queued), to carry on with as
    launched; else it is withdrawn there (a launch that arrives late is refused) and the error says so."""
    host = session.host
    try:
        answer: LaunchAnswer = session.agent_json(
            "launch-outcome", "launch-outcome", "--run-dir", session.paths.run(run_id),
            "--lock", launch_lock(session.paths), timeout=LAUNCH_S)
    except ThrustError as exc:
        raise ConnectionLostError(
            f"launching run {run_id} on {host.name} got no answer ({cause}), nor did asking again whether it "
            f"started ({exc.message}): it may have started",
            f"check with: {command_hint('status', run_id, host=host)}, then "
            f"{command_hint('logs', run_id, '--follow', host=host)}",
        ) from None
    if answer.get("launched"):
        return answer
    if answer.get("error") == "lock-busy":  # whether it started cannot be told while the lock is held
        busy = _lock_busy(answer, run_id, host)
        raise ThrustError(f"launching run {run_id} on {host.name} got no answer ({cause}), and whether it started "
                          f"cannot be told: its launch lock {answer.get('lock')} has been held for "
                          f"{answer.get('seconds')} s{_holder(answer)}",
                          f"{busy.hint}; check with: {command_hint('status', run_id, host=host)}",
                          ExitCode.UNAVAILABLE)
    raise ThrustError(f"run {run_id} was not launched on {host.name}: {cause}; it will not start later "
                      "(withdrawn there)", "nothing of it runs; run the command again", ExitCode.UNAVAILABLE)


def launch_lock(paths: HostPaths) -> str:
    """The host's one launch lock: held only while a launch checks for collisions and starts."""
    return f"{paths.thrust}/locks/launch.lock"


def see_or_stop(run_id: str, host: HostConfig | str) -> str:
    """The exact commands that show and stop a run, with its host (a hint's tail)."""
    return (f"see it with: {command_hint('status', run_id, host=host)}; "
            f"stop it with: {command_hint('stop', run_id, host=host)}")


def _refused(answer: Mapping[str, object], run_id: str, host: HostConfig) -> None:
    """The agent's refusals (exit 3) as errors that name the other run and how to reach it."""
    other = str(answer.get("run_id"))
    name = host.name
    if answer.get("error") == "exists":
        raise ThrustError(f"run {run_id} is already running on {name}", see_or_stop(run_id, host),
                          ExitCode.FAILED)
    if answer.get("error") == "lock-busy":
        raise _lock_busy(answer, run_id, host)
    if answer.get("error") == "withdrawn":
        raise ThrustError(f"run {run_id} on {name} was withdrawn: an earlier launch of it never answered and was "
                          "found not started", "run the command again (a new run id)", ExitCode.UNAVAILABLE)
    if answer.get("error") == "never-fits":
        raise UsageError(f"run {run_id} can never start on {name}: it {answer.get('why')}",
                         "ask for fewer with --gpus, or choose another host with --host")
    if answer.get("error") == "gpus-taken":
        gpus = ",".join(str(g) for g in answer.get("gpus") or [])  # type: ignore[union-attr]
        raise ThrustError(
            f"GPU {gpus} on {name} is taken by running run {other}",
            f"{see_or_stop(other, host)}; or choose other GPUs with --gpus, or share them with "
            f"--allow-shared-gpus",
            ExitCode.FAILED,
        )


def _holder(answer: Mapping[str, object]) -> str:
    return f" by process {answer.get('holder')}" if answer.get("holder") else ""


def _lock_busy(answer: Mapping[str, object], run_id: str, host: HostConfig) -> ThrustError:
    """The host's launch lock held past the agent's wait: nothing was launched, the holder is named."""
    pid = str(answer.get("holder") or "").split(" ")[0]
    holder = _holder(answer)
    look = command_hint("exec", "--", "ps", "-o", "pid,stat,etime,args", "-p", pid, host=host) if pid else \
        command_hint("exec", "--", "ps", "-ef", host=host)
    return ThrustError(f"run {run_id} was not launched on {host.name}: its launch lock {answer.get('lock')} has "
                       f"been held for {answer.get('seconds')} s{holder}",
                       f"a launch holds it for well under a second: see what holds it ({look}), then launch again",
                       ExitCode.UNAVAILABLE)


def status(session: HostSession, run_id: str) -> StatusAnswer:
    run_dir = session.paths.run(run_id)
    if not session.runner.exists(run_dir):
        raise ThrustError(
            f"no run {run_id!r} on {session.name} (looked in {session.paths.runs})",
            f"find it on every configured host with: "
            f"{command_hint('runs', '--all', config=session.host.config_path)} "
            f"(or: {command_hint('runs', host=session.host)})",
            ExitCode.USAGE,  # a run id that names nothing is a bad value, not a failed job (1)
        )
    answer: StatusAnswer = session.agent_json("status", "status", "--run-dir", run_dir)
    if answer.get("unreadable"):
        raise permission_denied(session, run_id, str(answer["unreadable"]))
    big = answer.get("oversize")
    if big:  # its state and job would be guesses, as for a file this account cannot read
        raise TransferError(f"run {run_id} on {session.name}: {big} is larger than {RUN_JSON_MAX:,} bytes: not read",
                            f"a run.json is a few KB; look at it there (ls -l {big}): something other than "
                            "thrust-remote wrote it")
    return answer


def read_run_json(session: HostSession, run_dir: str) -> RunRecord | None:
    """A run's run.json as the laptop reads it, the one reader on this side (the agent's is runjson.py's
    `read_record`, with the same cap): None when absent or not a JSON object; one larger than
    RUN_JSON_MAX is a TransferError (74) naming the host and the file, never read whole (the runner's
    read_text takes RUN_JSON_MAX + 1 bytes at most, over SSH as here)."""
    text = session.runner.read_text(f"{run_dir}/{RUN_JSON}", max_bytes=RUN_JSON_MAX)
    try:
        meta = json.loads(text) if text else None
    except (ValueError, RecursionError):
        return None
    return run_record(meta) if isinstance(meta, dict) else None


def permission_denied(session: HostSession, run_id: str, path: str) -> ThrustError:
    """A run whose files this account may not read: its state and job would be guesses (LOST, none), so
    say so, and where, instead of answering them."""
    return ThrustError(
        f"run {run_id} on {session.name}: permission denied: {path} cannot be read by the account "
        "thrust-remote logs in as there",
        f"the run belongs to another account or lost its read bits: look with `ls -ld {path}` on "
        f"{session.name}, and give that account read access or use the account that started the run",
        ExitCode.UNAVAILABLE,
    )


def list_runs(session: HostSession, timeout: float | None = 60, *, trees: bool = False) -> list[StatusAnswer]:
    """The host's runs, oldest first; `trees`: with each one's tree and its size (`runs`)."""
    return session.agent_json("runs", "list", "--runs-dir", session.paths.runs, *(["--trees"] if trees else []),
                              timeout=timeout)


def gpus_taken(session: HostSession) -> dict[int, str]:
    """GPU index -> the RUNNING run that holds it (run.json `gpus`, what `--gpus` gave it)."""
    taken: dict[int, str] = {}
    for run in list_runs(session):
        if run.get("state") == RunState.RUNNING:
            for gpu in run.get("gpus") or []:
                taken.setdefault(int(gpu), run["run_id"])
    return taken


@dataclass
class HostListing:
    """One host's answer to `runs --all`: its runs, or why there are none (`error`, `exit_code`)."""

    host: str
    runs: list[dict] | None = None
    error: str | None = None
    exit_code: int = 0


def list_hosts(hosts: Sequence[str], open_session: Callable[[str], HostSession],
               timeout: float) -> list[HostListing]:
    """Every host's runs, listed in parallel, one thread per host, in the order given. A host that
    fails, or has not answered within `timeout` seconds (connecting included), is a listing with
    an error. Threads still waiting on a dead host are daemons: they never hold up the exit."""
    results: dict[str, HostListing] = {}
    guard = threading.Lock()

    def one(name: str) -> None:
        try:
            session = open_session(name)
            try:
                items = list_runs(session, timeout=timeout, trees=True)
            finally:
                session.close()
            listing = HostListing(name, runs=[{**r, "host": name} for r in items])
        except ThrustError as exc:
            listing = HostListing(name, error=exc.message, exit_code=exc.exit_code)
        except Exception as exc:  # a thread's failure must reach the caller as data, not vanish
            listing = HostListing(name, error=f"{type(exc).__name__}: {exc}", exit_code=ExitCode.FAILED)
        with guard:
            results[name] = listing

    threads = [threading.Thread(target=one, args=(h,), name=f"runs-{h}", daemon=True) for h in hosts]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with guard:
        return [results.get(h) or HostListing(h, error=f"no answer within {timeout:g} s",
                                              exit_code=ExitCode.UNAVAILABLE) for h in hosts]


def stop(session: HostSession, run_id: str, grace: float = 10.0, *,
         peer_failed: Mapping[str, object] | None = None) -> dict:
    """TERM the run's process group, KILL after `grace`. `peer_failed` ({node, host, why}): a node of a
    run over several hosts stopped because that node failed; it ends FAILED, not STOPPED."""
    status(session, run_id)  # a clear error for an unknown id
    extra = ["--peer-failed", json.dumps(dict(peer_failed))] if peer_failed else []
    result = session.agent("stop", "--run-dir", session.paths.run(run_id), "--grace", str(grace), *extra,
                           timeout=grace + 60)
    return parse_json(result, "stop")


def follow_log(
    session: HostSession,
    run_id: str,
    *,
    offset: int = 0,
    follow: bool = True,
    on_bytes: Callable[[bytes], None],
    part: str = "",
) -> int:
    """Copy the run's log from `offset` to `on_bytes`; returns the new offset.

    The offset is counted from the bytes actually delivered, so after a lost link (ConnectionLostError,
    carrying `.offset`) a reattach from that offset repeats and loses nothing.
    """
    position = offset
    before = b""  # what came before the agent's LOG_START: an account's start-up file's words, not the log
    started = False

    def take(name: str, chunk: bytes) -> None:
        nonlocal position, before, started
        if name != "out":
            return
        if not started:
            before += chunk
            at = before.find(LOG_START)
            if at < 0:
                before = before[-(len(LOG_START) - 1):]  # keep only what may be the start of a split marker
                return
            started, chunk, before = True, before[at + len(LOG_START):], b""
        if chunk:
            on_bytes(chunk)
            position += len(chunk)

    # `part`: a node's part of the run dir (backends.Node.part; "" the run dir itself)
    run_dir = session.paths.run(run_id) + (f"/{part}" if part else "")
    args = ["logs", "--run-dir", run_dir, "--offset", str(offset)]
    if follow:
        args.append("--follow")
    try:
        result = session.agent(*args, timeout=None, on_bytes=take)
    except ConnectionLostError as exc:
        exc.offset = position
        raise
    if result.exit_code == AgentExit.MISSING:
        raise ThrustError(f"run {run_id} on {session.name} has no log yet ({run_dir}/{LOG})")
    if not result.ok:
        raise ThrustError(f"reading the log of {run_id} failed with exit code {result.exit_code}")
    return position
