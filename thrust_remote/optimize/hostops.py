"""Every remote action of `optimize`, and every call it makes into runs.* and run.*, in one
module (docs/architecture.md, "Packages and what each may import"): the rest of the package reaches
the host only through here.

The host side is the agent's: `poll` (one command for every running trial) and `lease` (the study's
driver lease, compare-and-swap under a lock on the host); see docs/architecture.md, "The host agent".
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from thrust_remote.agent.protocol import AgentExit, RunState
from thrust_remote.backends import RunAsk, backend_for
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.errors import ThrustError
from thrust_remote.host.runner import Runner
from thrust_remote.host.session import HostPaths, HostSession
from thrust_remote.run import arguments, data, jobs, stages, vocab
from thrust_remote.runs import control, scalarwatch, trees

# a run's reporting protocol (run/vocab.py), named here so the package imports run/ in one place
Reporter = vocab.Reporter
NullReporter = vocab.NullReporter
Prepared = stages.Prepared


# ------------------------------------------------------------------------------------------ poll

def poll(session: HostSession, request: Sequence[Sequence[Any]], stop_path: str,
         wait: float = 0.0) -> dict[str, Any]:
    """One command for every (run_dir, byte offset[, "log"]) in `request`: {"runs": {run_dir: {state,
    exit_code, data, offset, more, slot, log_tail}}, "stop": bool}. Waits on the host up to `wait`
    seconds. "log": the THRUST_METRICS lines of the run's log instead of metrics.jsonl."""
    result = session.agent("poll", "--runs", json.dumps(request), "--stop-file", stop_path,
                           "--wait", f"{wait:.3f}", timeout=60 + wait)
    if not result.ok:
        raise ThrustError(f"polling the trials on {session.name} failed: {result.stderr.strip()[-300:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])

# ------------------------------------------------------------------------------ TensorBoard scalars

def scalars(prepared: Prepared, request: Sequence[tuple[str, str, int]], tag: str) -> dict[str, Any]:
    """`agent scalars` with the job's venv python (site-packages on: it imports tensorboard):
    {run_dir: {"tags": [...], "points": [[step, value], ...]}} for each (run_dir, events_dir, since_step)."""
    return scalarwatch.read_scalars(prepared.session, prepared.python, request, tag, prepared.job.name)


# ----------------------------------------------------------------------------------------- lease

def lease_read(session: HostSession, path: str) -> str | None:
    """The lease file's text; None when there is none (or it is empty)."""
    text = session.runner.read_text(path)
    return text if text and text.strip() else None


def lease_create(session: HostSession, path: str, body: str) -> bool:
    """Create the lease only if it still does not exist (O_EXCL on the host); False if it does."""
    result = session.agent("lease", "create", path, stdin=body.encode())
    if result.exit_code == AgentExit.REFUSED:  # `lease create/renew`: the file exists / not our token
        return False
    result.check("create the study lease")
    return True


def lease_take_over(session: HostSession, path: str, body: str) -> None:
    """Overwrite a dead driver's lease (atomic); the caller reads it back, as two takers may race."""
    session.runner.write_text(path, body)


def lease_owned(session: HostSession, path: str, token: str) -> bool:
    text = lease_read(session, path)
    if not text:
        return False
    try:
        return json.loads(text).get("token") == token
    except (ValueError, AttributeError):
        return False


def lease_swap(session: HostSession, path: str, body: str, token: str) -> bool:
    """Compare-and-swap: write `body` only while the lease holds `token`; False when it no longer does."""
    result = session.agent("lease", "renew", path, "--token", token, stdin=body.encode())
    if result.exit_code == AgentExit.REFUSED:  # `lease create/renew`: the file exists / not our token
        return False
    result.check("write the study lease")
    return True


def lease_release(session: HostSession, path: str, token: str) -> None:
    """Remove the lease if it still holds `token` (never another driver's)."""
    session.agent("lease", "release", path, "--token", token)


# ------------------------------------------------------------------------------------- stop file

def write_stop(session: HostSession, path: str) -> None:
    """Ask a study's driver to stop: it sees the file in its next poll."""
    session.runner.write_text(path, time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))


def clear_stop(session: HostSession, path: str) -> None:
    session.runner.run(["rm", "-f", "--", path])


# ----------------------------------------------------------------------------- runs and run calls

def open_session(runner: Runner, host: HostConfig, config: Config) -> HostSession:
    return HostSession.open(runner, host, config)


def parse_sets(sets: Sequence[str], job: JobConfig) -> dict[str, str | bool]:
    """`--set` as `train` reads it for `job` (bare words too); a refusal's example in the job's own style."""
    return arguments.parse_sets(sets, job)


def trial_args(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    return arguments.job_arguments(job, sets, params)


def prepare(config: Config, job: JobConfig, host: HostConfig, runner: Runner, reporter: Reporter,
            args_for_preflight: Sequence[str]) -> Prepared:
    return stages.prepare(config, job, open_session(runner, host, config), reporter,
                          args_for_preflight=args_for_preflight)


def running_run_ids(session: HostSession) -> list[str]:
    return [r["run_id"] for r in control.list_runs(session) if RunState.of(r["state"]).is_live]


def stop_run(session: HostSession, run_id: str, grace: float = 10.0) -> None:
    control.stop(session, run_id, grace=grace)


@dataclass(frozen=True)
class StudyHost:
    """One study's host, prepared: what the scheduler and the monitor need to launch, poll and stop."""

    prepared: Prepared
    stop_path: str

    @classmethod
    def open(cls, prepared: Prepared, study: str) -> StudyHost:
        prepared.session.runner.makedirs(studies_dir(prepared.paths))
        return cls(prepared, f"{studies_dir(prepared.paths)}/{study}.stop")

    @property
    def session(self) -> HostSession:
        return self.prepared.session

    @property
    def runner(self) -> Runner:
        return self.session.runner

    @property
    def host(self) -> HostConfig:
        return self.prepared.host

    @property
    def paths(self) -> HostPaths:
        return self.prepared.paths

    def run_dir(self, run_id: str) -> str:
        return self.paths.run(run_id)

    @property
    def own_trees(self) -> bool:
        """Each trial runs in a tree of its own (docs/architecture.md, "Trees"), as every run on a remote
        host does; the local host's trials run in the project itself, a cargo job's in its one build."""
        sync = self.prepared.sync
        return sync is not None and bool(sync.tree) and self.prepared.cargo is None

    def cwd_of(self, run_id: str) -> str:
        """Where trial `run_id` runs: its own tree, or the checkout the study's trials share."""
        return self.paths.tree(run_id) if self.own_trees else self.prepared.cwd

    def poll(self, request: Sequence[Sequence[Any]], wait: float = 0.0) -> dict[str, Any]:
        return poll(self.session, request, self.stop_path, wait)

    def scalars(self, request: Sequence[tuple[str, str, int]], tag: str) -> dict[str, Any]:
        return scalars(self.prepared, request, tag)

    def clear_stop(self) -> None:
        clear_stop(self.session, self.stop_path)

    def running_run_ids(self) -> list[str]:
        return running_run_ids(self.session)

    def stop_run(self, run_id: str, grace: float = 10.0) -> None:
        stop_run(self.session, run_id, grace)

    def launch(self, run_id: str, args: Sequence[str], gpus: Sequence[int], env: Mapping[str, str],
               meta: Mapping[str, Any]) -> None:
        """One trial = one detached run, without `--export`: a trial's ONNX export would cost seconds
        each and nobody reads it (`train --params` makes the model of the best one)."""
        job = self.prepared.job
        nproc = 1 if job.kind == "trainer" else jobs.process_count(job, None, gpus)  # a DDP job stays one
        request = vocab.TrainRequest(job=job, host=self.host, nproc=nproc)
        ask = RunAsk(request, tuple(args), run_id, slot=tuple(gpus), extra_env=env, meta=meta, export=False)
        prepared = self._trial_tree(run_id) if self.own_trees else self.prepared
        backend_for(self.host).launch(prepared, ask, vocab.NullReporter())
        if self.own_trees:  # the host's keep:, as after any launch; no train fetches from a trial's tree
            with contextlib.suppress(ThrustError):  # a tree not reclaimed is never a failed trial
                trees.keep_policy(self.session, self.prepared.config.root, run_id, release=True)

    def _trial_tree(self, run_id: str) -> Prepared:
        """The study's preparation with trial `run_id`'s own tree (named as the run) in place of the one
        it was prepared in: the same commit, `files:` and `shared:`, the setup's kept outputs placed
        (its setup run there when they do not fit it), so a job writing a fixed path (out/ckpt.pt)
        writes its own trial's. About 0.1 s on the host."""
        p = self.prepared
        assert p.local is not None and p.sync is not None
        own = data.job_data(p.config, p.job)
        quiet = vocab.NullReporter()
        made = data.make_run_tree(p.config, own, self.session, p.local, p.sync, run_id, quiet)
        sync = replace(p.sync, tree=made.path, tree_setup=made.setup)
        data.run_setup(p.config, own, self.session, p.local, sync, cwd=made.path, env=p.env, python=p.python,
                       reporter=quiet)
        return replace(p, cwd=made.path, sync=sync)


def studies_dir(paths: HostPaths) -> str:
    return f"{paths.thrust}/studies"
