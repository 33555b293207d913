"""What only a run over several hosts needs: `train JOB --host a --host b` (docs/architecture.md,
"Several hosts"). The run's life itself, for one host or many, is lifecycle.py's.

Every node gets what one host gets (stages.check, then stages.set_up, then a detached launch),
all nodes at once, in threads (`each`): N nodes take about as long as the slowest one, not N times
one. In between, the nodes must agree (torch, CUDA or CPU, python) or nothing is set up anywhere (69). The
distributed part is torchrun's own: its c10d rendezvous at node 0's address and a port checked free
there (jobs.Rendezvous), NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME set on each node to the interface
that reaches node 0. There is no cluster layer of our own beyond two watches that turn a lost node
into a FAILED run instead of a hang: each node's supervisor probes its peers (agent/peerwatch.py),
and while the laptop follows, it polls every node and stops the others when one ends badly.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from thrust_remote.agent.protocol import LOG, RESUMED_FROM, USER_STOP, RunState, StatusAnswer, run_record
from thrust_remote.backends import RunAsk, backend_for
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ConnectionLostError, ThrustError, UnreachableError, UsageError
from thrust_remote.core.hints import config_file
from thrust_remote.host.fleet import each
from thrust_remote.host.netinfo import rendezvous_port, route, ssh_endpoint
from thrust_remote.host.session import HostSession
from thrust_remote.run import jobs, stages, vocab
from thrust_remote.run.stages import Checked, Prepared
from thrust_remote.run.vocab import Launched, Reporter, TrainRequest
from thrust_remote.runs import control

POLL_S = 2.0  # how often the laptop asks the other nodes while it follows node 0
ASK_TIMEOUT_S = 10.0  # a node that does not answer a status within this is lost (for the laptop)
PEER_TIMEOUT_S = 15.0  # a node stops when a peer's host has not answered this long (peerwatch.py)
AGREE = (("torch", "torch"), ("cuda_available", "CUDA available"), ("python", "Python"))


@dataclass(frozen=True)
class Plan:
    """Where the nodes meet: the rendezvous host's address and port, and each node's interface, own
    address and SSH endpoint, in the order of the hosts given (`ranked` puts them in rank order)."""

    address: str
    port: int
    ifnames: tuple[str | None, ...]
    local_addrs: tuple[str | None, ...]
    ssh: tuple[tuple[str, int], ...]  # each node's SSH endpoint as the laptop reached it
    rdzv_host: int = 0  # which node serves the rendezvous: the first host given

    def order(self) -> list[int]:
        """The nodes in torchrun's rank order. Its c10d rendezvous ranks the nodes by their
        --local-addr (as strings), not by --node-rank (ignored for c10d): node i must be rank i for
        `logs`, checkpoints and the model to be where we look. An unknown address sorts last."""
        return sorted(range(len(self.ifnames)), key=lambda i: (self.local_addrs[i] is None, self.local_addrs[i] or ""))

    def ranked(self) -> Plan:
        order = self.order()
        return Plan(self.address, self.port, tuple(self.ifnames[i] for i in order),
                    tuple(self.local_addrs[i] for i in order), tuple(self.ssh[i] for i in order),
                    order.index(self.rdzv_host))

    def rendezvous(self, rank: int, run_id: str, max_restarts: int, *, queued: bool = False) -> jobs.Rendezvous:
        return jobs.Rendezvous(len(self.ifnames), rank, self.address, self.port, run_id,
                               local_addr=self.local_addrs[rank], max_restarts=max_restarts,
                               is_host=rank == self.rdzv_host, queued=queued)


class Prefixed(vocab.NullReporter):
    """A node's steps and warnings, prefixed with its host (the nodes speak at once)."""

    def __init__(self, reporter: Reporter, name: str) -> None:
        self.reporter, self.name = reporter, name

    def step(self, message: str) -> None:
        self.reporter.step(f"[{self.name}] {message}")

    def warn(self, message: str) -> None:
        self.reporter.warn(f"[{self.name}] {message}")


# ------------------------------------------------------------------------------------------ checks

def check_request(request: TrainRequest, hosts: Sequence[HostConfig]) -> None:
    """What a run over several hosts cannot be, said before anything connects."""
    job = request.job
    if job.kind not in ("trainer", "python"):
        raise UsageError(f"job {job.name!r} is a {job.kind} job: a run over several hosts starts torchrun, so it "
                         "takes the built-in trainer or a python job", "give one --host")
    if job.workers is not None:  # refused here, not at launch on each node after every node's sync
        raise UsageError(f"job {job.name!r} starts its own workers (workers:): it runs once on one host, and a run "
                         "over several hosts starts torchrun on each",
                         f"give one --host; --nproc N there passes N by the job's {job.workers.count}")
    if any(h.is_local for h in hosts):
        raise UsageError("host 'local' cannot be a node of a run over several hosts: its runs live in the project "
                         "directory, not in a workdir of their own",
                         "add this machine under `hosts:` with an address (user@127.0.0.1) and a workdir")


def agree(checked: Sequence[Checked]) -> None:
    """The nodes run one program: the same torch, CUDA or not on all, the same Python minor version;
    and no two nodes share a machine's workdir (their run dirs would be one). Else 69, naming them."""
    for key, label in AGREE:
        values = [_fact(c, key) for c in checked]
        if len(set(values)) > 1:
            listed = ", ".join(f"{v} on {c.session.name} (node {i})"
                               for i, (c, v) in enumerate(zip(checked, values, strict=True)))
            raise UnreachableError(f"the nodes do not agree on {label}: {listed}; nothing was started",
                                   "install the same torch on every node (doctor --host NAME shows what each has)")
    seen: dict[tuple[str, str], str] = {}
    for c in checked:
        key = (str(c.report.facts.get("hostname")), c.session.paths.workdir)
        if key in seen:
            raise UsageError(f"{seen[key]} and {c.session.name} are one machine with one workdir ({key[1]}): "
                             "their nodes would share a run directory",
                             f"give hosts.{c.session.name} a workdir of its own in {config_file(c.session.host)}")
        seen[key] = c.session.name


def _fact(checked: Checked, key: str) -> str:
    value = checked.report.facts.get(key)
    if key == "python" and isinstance(value, str):
        value = ".".join(value.split(".")[:2])
    return str(value)


# ------------------------------------------------------------------------------------------ network

def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def plan(sessions: Sequence[HostSession], reporter: Reporter) -> Plan:
    """node 0's `rdzv_address:` (default: its SSH address), a port free there (`rdzv_port:` checked),
    and each node's interface towards it (`ifname:`, else `ip route get`)."""
    ssh = tuple(ssh_endpoint(s) for s in sessions)
    head = sessions[0].host
    address = head.rdzv_address or ssh[0][0]
    if _is_loopback(address) and not all(_is_loopback(a) for a, _ in ssh):
        raise UsageError(f"the rendezvous host ({head.name}) is reached at {address}, which the other nodes "
                         "cannot use",
                         f"set rdzv_address: under hosts.{head.name} in {config_file(head)} (an address the other "
                         "nodes reach it at)")
    port = rendezvous_port(sessions[0], address)
    routes = each(lambda s: route(s, address), sessions)
    ifnames, local_addrs = [], []
    for i, (session, found) in enumerate(zip(sessions, routes, strict=True)):
        dev = session.host.ifname or found.get("dev")
        if not dev:
            reporter.warn(f"[{session.name}] no interface found towards {address} ({found.get('error')}); NCCL and "
                          f"gloo choose their own (set ifname: under hosts.{session.name})")
        ifnames.append(dev)
        local_addrs.append(address if i == 0 else found.get("src"))
    if _is_loopback(address):
        # every node is this machine: one loopback address each (all of 127/8 is lo), in the order
        # given, so that torchrun's ranking by address keeps that order (3 digits: strings sort alike)
        local_addrs = [f"127.{100 + i}.0.1" for i in range(len(sessions))]
    return Plan(address, port, tuple(ifnames), tuple(local_addrs), ssh)


class PlanAhead:
    """The plan, asked in a thread of its own while the nodes are checked and set up: it needs only the
    sessions, so it is off the launch's critical path. A plan older than FRESH_S when the launch takes
    it (a set-up that built a venv) gets its port asked again: the one found free may be taken by then."""

    FRESH_S = 10.0

    def __init__(self, sessions: Sequence[HostSession], reporter: Reporter) -> None:
        self.sessions = list(sessions)
        self._asked = time.monotonic()
        self._result: Plan | BaseException | None = None
        self._done = threading.Event()
        # a daemon thread, not a pool: when a check fails first, nothing waits for the plan at exit
        threading.Thread(target=self._ask, args=(reporter,), name="plan", daemon=True).start()

    def _ask(self, reporter: Reporter) -> None:
        try:
            self._result = plan(self.sessions, reporter)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by result()
            self._result = exc
        finally:
            self._done.set()

    def result(self) -> Plan:
        self._done.wait()
        if isinstance(self._result, BaseException):
            raise self._result
        assert self._result is not None
        if time.monotonic() - self._asked > self.FRESH_S:
            return replace(self._result, port=rendezvous_port(self.sessions[0], self._result.address))
        return self._result


# ------------------------------------------------------------------------------------------ launch

def launch_nodes(prepared: Sequence[Prepared], request: TrainRequest, args: Sequence[str], run_id: str,
                 reporter: Reporter, max_restarts: int, *, queue_order: float = 0.0,
                 planned: PlanAhead | None = None) -> tuple[list[Launched], list[HostSession]]:
    """The plan (`planned`, asked beside the set-up, or asked now), then a launch on every node at once
    (a launch that fails stops the nodes already launched). The launched runs and the sessions come
    back in rank order (Plan.order): node 0 is rank 0's node."""
    sessions = [p.session for p in prepared]
    given = planned.result() if planned is not None else plan(sessions, reporter)
    order, where = given.order(), given.ranked()
    sessions, prepared = [sessions[i] for i in order], [prepared[i] for i in order]
    if order[0] != 0:
        reporter.warn(f"torchrun ranks the nodes by address: node 0 (rank 0: its log, checkpoints and model) is "
                      f"{sessions[0].name}; the rendezvous stays on {sessions[where.rdzv_host].name}")
    reporter.step(f"launching run {run_id} on {len(sessions)} nodes, rendezvous at {where.address}:{where.port}")
    nodes = [{"host": s.name, "address": a} for s, (a, _) in zip(sessions, where.ssh, strict=True)]
    launched: list[Launched | None] = [None] * len(sessions)

    def go(rank: int) -> None:
        launched[rank] = _launch_node(prepared[rank], rank, where, run_id, args, request, nodes, max_restarts,
                                      queue_order)

    try:
        each(go, list(range(len(sessions))))
    except BaseException:
        stop_all([s for s, n in zip(sessions, launched, strict=True) if n is not None], run_id, None)
        raise
    for node in launched:
        if node is not None and node.position:
            reporter.step(f"run {run_id} waits in {node.host}'s queue (position {node.position}); its training "
                          "starts when every node has")
    return [n for n in launched if n is not None], sessions


def _launch_node(prepared: Prepared, rank: int, where: Plan, run_id: str, args: Sequence[str],
                 request: TrainRequest, nodes: list[dict[str, Any]], max_restarts: int,
                 queue_order: float) -> Launched:
    env = dict(request.extra_env)
    if where.ifnames[rank]:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = str(where.ifnames[rank])
    peers = [{"node": i, "host": n["host"], "address": where.ssh[i][0], "port": where.ssh[i][1]}
             for i, n in enumerate(nodes) if i != rank]
    meta = run_record(node=rank, nodes=nodes, rdzv=f"{where.address}:{where.port}", watch_peers=peers,
                      peer_timeout=PEER_TIMEOUT_S, **stages.resume_meta(request))
    # every node is told where to export: the job's rank 0 alone writes, on the node it runs on
    ask = RunAsk(request, tuple(args), run_id, extra_env=env, meta=meta, queue_order=queue_order,
                 rdzv=where.rendezvous(rank, run_id, max_restarts, queued=request.queue))
    return backend_for(prepared.host).launch(prepared, ask, vocab.NullReporter())


def stop_all(sessions: Sequence[HostSession], run_id: str, verdict: dict[str, Any] | None) -> None:
    """Stop the run on every node that still answers; `verdict`: the node it fails for (not STOPPED)."""

    def one(session: HostSession) -> None:
        with contextlib.suppress(ThrustError):  # an unreachable node stops itself (peerwatch.py)
            control.stop(session, run_id, grace=5.0, peer_failed=verdict)

    each(one, list(sessions))


# ------------------------------------------------------------------------------------------ follow

STOP = "stopped"  # Watch._ask: the node ended STOPPED, which stops the run, not fails it


class Watch:
    """While the laptop follows one node's log: the other nodes' states every POLL_S seconds. The first
    node that ends other than FINISHED, or stops answering, is the verdict; every other node is stopped.
    A node that ended STOPPED (its max_duration:, its idle GPUs, a stop of that node) is a stop, not a
    failure: the others are stopped with no verdict, and the run ends STOPPED for its reason. With one
    node (or nothing to watch) it does nothing. A node without a session (not reachable when
    a reattach opened it) is lost."""

    def __init__(self, sessions: Sequence[HostSession | None], names: Sequence[str], run_id: str,
                 reporter: Reporter, *, followed: int = 0) -> None:
        self.sessions, self.names, self.run_id, self.reporter = list(sessions), list(names), run_id, reporter
        self.followed = followed
        self.verdict: dict[str, Any] | None = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="nodewatch", daemon=True)

    def __enter__(self) -> Watch:
        if len(self.sessions) > 1:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)

    def _loop(self) -> None:
        while not self.done.wait(POLL_S):
            for rank, session in enumerate(self.sessions):
                why = None if rank == self.followed else self._ask(session)
                if why is not None:
                    self.fail(rank, why)
                    return

    def _ask(self, session: HostSession | None) -> str | None:
        if session is None:
            return "lost: it could not be reached"
        try:
            st = status_within(session, self.run_id, ASK_TIMEOUT_S)
        except ThrustError as exc:
            return f"lost: {exc}"
        if RunState.of(st["state"]).ended_well:
            return None
        if st["state"] == RunState.STOPPED:
            return STOP
        return f"{st['state']} (exit code {st.get('exit_code')})"

    def fail(self, rank: int, why: str) -> None:
        """The run fails for node `rank`: every other node is stopped, FAILED naming it (one node: no other).
        `why` STOP: node `rank` was stopped, and so is the run, on the other nodes too (no verdict)."""
        if self.verdict is not None or len(self.sessions) < 2:
            return
        name = self.names[rank]
        if why == STOP:
            self.reporter.warn(f"node {rank} ({name}) was stopped: stopping the run on the other nodes")
            stop_all([s for i, s in enumerate(self.sessions) if i != rank and s is not None], self.run_id, None)
            return
        self.verdict = {"node": rank, "host": name, "why": why}
        self.reporter.warn(f"node {rank} ({name}) {why}: stopping the run on the other nodes")
        stop_all([s for i, s in enumerate(self.sessions) if i != rank and s is not None], self.run_id, self.verdict)


# ------------------------------------------------------------------------------------------ state

def log_tail(session: HostSession, run_id: str, limit: int = 4000) -> str | None:
    """The last lines of a node's log (at most `limit` bytes, from a line's start); None when it cannot
    be read now (the node is gone, or never wrote one)."""
    try:
        result = session.runner.run(["tail", "-c", str(limit), f"{session.paths.run(run_id)}/{LOG}"], timeout=10)
    except ThrustError:
        return None
    if not result.ok or not result.stdout:
        return None
    text = result.stdout
    return text.split("\n", 1)[1] if len(text.encode()) >= limit and "\n" in text else text


def status_within(session: HostSession, run_id: str, timeout: float) -> StatusAnswer:
    """control.status, or ConnectionLostError after `timeout` seconds: over a dead link an SSH request can
    wait for TCP's own give-up (many minutes); the connection is dropped so the next call starts afresh."""
    box: dict[str, Any] = {}

    def ask() -> None:
        try:
            box["status"] = control.status(session, run_id)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    if "status" in box:
        return box["status"]
    if "error" in box:
        raise box["error"]
    with contextlib.suppress(Exception):
        getattr(session.runner, "drop", session.runner.close)()
    raise ConnectionLostError(f"{session.name} did not answer within {timeout:g} s")


def node_states(sessions: Sequence[HostSession | None], run_id: str) -> list[StatusAnswer | None]:
    """Each node's status, None for a node that does not answer (or has no session)."""

    def one(session: HostSession | None) -> StatusAnswer | None:
        if session is None:
            return None
        try:
            return status_within(session, run_id, ASK_TIMEOUT_S)
        except ThrustError:
            return None

    return each(one, list(sessions))


# After the followed node FINISHED, how long the others get to end too: torchrun's workers leave the
# collective together, but a node's processes may take a few seconds more to tear down (gloo, the
# export on node 0 only). Asked again every END_POLL_S until then; still going after: the run is
# RUNNING over its nodes, as before.
END_GRACE_S = 30.0
END_POLL_S = 0.5


def states_at_end(sessions: Sequence[HostSession | None], run_id: str, followed: int,
                  clock: Callable[[], float] = time.monotonic,
                  sleep: Callable[[float], None] = time.sleep) -> list[StatusAnswer | None]:
    """Every node's status but the followed one's (None there), once the followed node ended well (or
    STOPPED, the others told to stop): a node
    still RUNNING is asked again until it ends or END_GRACE_S pass (before, a node a second slower to
    exit made a finished run read RUNNING and exit 1)."""
    asked = [None if i == followed else s for i, s in enumerate(sessions)]
    deadline = clock() + END_GRACE_S
    got = node_states(asked, run_id)
    while any(st is not None and RunState.of(st.get("state")).is_live for st in got) and clock() < deadline:
        sleep(END_POLL_S)
        got = node_states(asked, run_id)
    return got


def others_at_end(sessions: Sequence[HostSession | None], run_id: str, followed: int, state: str,
                  verdict: dict[str, Any] | None) -> list[StatusAnswer | None]:
    """The other nodes' status once the followed node ended in `state`. FINISHED: the others end with
    it (asked again for a few seconds' teardown). STOPPED (its max_duration:, idle GPUs, a stop of that
    node) stops the run: the others are stopped with no verdict, as the watch does when it sees it
    first, and asked until they end; a node whose own stop was still to come would otherwise leave the
    run RUNNING. Any other end: asked once (the caller decides what failed)."""
    if state == RunState.STOPPED and verdict is None:
        stop_all([s for i, s in enumerate(sessions) if i != followed and s is not None], run_id, None)
    if state in (RunState.FINISHED, RunState.STOPPED):
        return states_at_end(sessions, run_id, followed)
    return node_states([None if i == followed else s for i, s in enumerate(sessions)], run_id)


def aggregate(names: Sequence[str], states: Sequence[StatusAnswer | None],
              verdict: dict[str, Any] | None = None) -> StatusAnswer:
    """The run's state over its nodes: QUEUED while a node waits in its host's queue, RUNNING while none
    ended badly, FINISHED when all did, STOPPED
    when the user stopped it, else FAILED naming the node that failed first: the one a node or the
    laptop reported lost (`peer_failed`, `verdict`), else the one that ended first."""
    head = next((s for s in states if s), {}) or {}
    nodes = [{"node": i, "host": n, **({"state": RunState.UNREACHABLE} if s is None else
                                         {k: s.get(k) for k in ("state", "exit_code", "ended_at", "pid")})}
             for i, (n, s) in enumerate(zip(names, states, strict=True))]
    verdicts = [verdict] if verdict else []
    verdicts += [s["peer_failed"] for s in states if s and isinstance(s.get("peer_failed"), dict)]
    state = _overall([n["state"] for n in nodes], bool(verdicts))
    failed = _first_failed(nodes, states, verdicts) if state == RunState.FAILED else None
    codes = [n.get("exit_code") for n in nodes if failed and n["node"] == failed["node"]]
    codes += [n.get("exit_code") for n in nodes]  # the lost node has none: the first other node's then
    exit_code = 0 if state == RunState.FINISHED else next((c for c in codes if c), None)
    return {**{k: head.get(k) for k in ("run_id", "job", "commit", "started_at", "pid")}, "host": names[0],
            "state": state, "exit_code": exit_code, "failed_node": failed, "nodes": nodes,
            **(_stop_reason(states) if state == RunState.STOPPED else {}),
            **({RESUMED_FROM: head[RESUMED_FROM]} if head.get(RESUMED_FROM) else {})}


def _stop_reason(states: Sequence[StatusAnswer | None]) -> dict[str, Any]:
    """A STOPPED run's reason over its nodes: the first node's that stopped for a reason of its own (its
    max_duration:, idle GPUs) rather than by `stop`, else `user` when a node says so."""
    said = [s for s in states if s and s.get("reason")]
    own = next((s for s in said if s["reason"] != USER_STOP), None) or next(iter(said), None)
    if own is None:
        return {}
    return {"reason": own["reason"], **({"reason_detail": own["reason_detail"]} if own.get("reason_detail") else {})}


def _overall(states: list[str], lost_a_node: bool) -> str:
    if all(s == RunState.FINISHED for s in states):
        return RunState.FINISHED
    if lost_a_node or any(s in (RunState.FAILED, RunState.LOST) for s in states):
        return RunState.FAILED
    if RunState.QUEUED in states:
        return RunState.QUEUED  # its training starts when every node has: a queued node has not
    if RunState.RUNNING in states:
        return RunState.RUNNING  # a node that does not answer now is not a failure yet: the nodes table shows it
    return RunState.STOPPED if RunState.STOPPED in states else RunState.LOST


def _first_failed(nodes: list[dict[str, Any]], states: Sequence[StatusAnswer | None],
                  verdicts: list[dict[str, Any]]) -> dict[str, Any]:
    if verdicts:
        v = verdicts[0]
        return {"node": int(v.get("node", 0)), "host": v.get("host"), "why": v.get("why")}
    ended = [(s.get("ended_ts") or float("inf"), n) for n, s in zip(nodes, states, strict=True)
             if s and n["state"] in (RunState.FAILED, RunState.LOST)]
    if ended:
        n = min(ended, key=lambda x: x[0])[1]
        return {"node": n["node"], "host": n["host"], "why": f"{n['state']} (exit code {n.get('exit_code')})"}
    lost = next(n for n in nodes if not RunState.of(n["state"]).ended_well)
    return {"node": lost["node"], "host": lost["host"], "why": lost["state"]}
