"""What a run leaves, brought here at its end (docs/architecture.md, "Kept models", "Artifacts",
"Checkpoints and resume"): a FINISHED run's model (verified, kept, placed by the rules), its artifacts
and its newest checkpoint whatever the end (a failed run's logs and metrics are what says why); and
where the model lands.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from thrust_remote.agent.protocol import MANIFEST, MODEL, RUN_DIR_PREFIX, RUN_JSON_MAX, RunState, StatusAnswer
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.errors import DISK_FULL, DiskFullError, ExitCode, ThrustError, disk_full
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.fetch import artifacts, checkpoints, models
from thrust_remote.host.session import HostSession
from thrust_remote.run import cargo
from thrust_remote.run.vocab import ARTIFACTS_TIMING, CHECKPOINT_TIMING, Launched, Reporter, Stage
from thrust_remote.runs import control, trees


def fetch_command(run_id: str, host: HostConfig, config_path: Path | str | None = None) -> str:
    return command_hint("fetch", run_id, host=host, config=config_path)


@dataclass(frozen=True)
class Outputs:
    """What a run of a job leaves to fetch, resolved once from the job (`outputs`): a model (`model`),
    its checkpoints' glob (None: it declares none), its artifacts' globs."""

    model: bool
    checkpoints: str | None
    artifacts: tuple[str, ...]

    @property
    def pulled(self) -> bool:
        """What a follow pulls meanwhile (runs/pull.py): its checkpoints or its artifacts."""
        return self.checkpoints is not None or bool(self.artifacts)

    @property
    def any(self) -> bool:
        return self.model or self.pulled


def outputs(job: JobConfig) -> Outputs:
    return Outputs(exports_model(job), checkpoints.checkpoint_glob(job), artifacts.artifact_globs(job))


@dataclass
class End:
    """What a followed run's end brought: its model (FINISHED), its artifacts and newest checkpoint
    (whatever the end), and whether a model is there to offer a fetch of (`fetchable`)."""

    fetched: models.FetchResult | None = None
    artifacts: artifacts.DirFetch | None = None
    checkpoint: checkpoints.CheckpointPull | None = None
    fetchable: bool = False


def at_end(config: Config, session: HostSession | None, head: Launched, job: JobConfig | None, status: StatusAnswer,
           reporter: Reporter, *, fetch: bool, force: bool, timings: dict[str, float], step: Any,
           config_path: Path | str | None, outs: Outputs | None = None) -> End:
    """A followed run has ended (node 0's `session`; `job` None: nothing to fetch): a FINISHED run's model,
    whatever the end its artifacts and newest checkpoint (noted at the follow's `step`), then its tree
    released unless a fetch did; and whether a run that did not finish left a model worth a fetch hint.
    `outs`: the job's outputs when the caller resolved them already."""
    end = End()
    if job is not None and outs is None:
        outs = outputs(job)
    if status["state"] != RunState.FINISHED and fetch and job is not None and session is not None:
        end.artifacts = ended_artifacts(config, session, head, job, reporter, timings, outs)
    if status["state"] == RunState.FINISHED and fetch and job is not None and session is not None:
        try:
            end.fetched, end.artifacts = fetch_finished(config, session, head, job, status, reporter, force=force,
                                                        timings=timings, outs=outs)
        except (DiskFullError, OSError) as exc:  # the run is done: what to type is a fetch, never the train again
            if isinstance(exc, OSError) and exc.errno not in DISK_FULL:
                raise
            full = exc if isinstance(exc, DiskFullError) else disk_full(exc)
            full.hint = (f"the run FINISHED on {head.host}; free some space there, then fetch it: "
                         f"{fetch_command(head.run_id, session.host, config_path)}")
            raise full from None
    if fetch and job is not None and session is not None:
        end.checkpoint = last_checkpoint(config, session, head.run_id, job, reporter, outs)
        if end.checkpoint is not None:
            timings[CHECKPOINT_TIMING] = end.checkpoint.seconds
            if end.checkpoint.fetched:
                checkpoints.note_step(config.root, head.run_id, step)
    if fetch and session is not None and head.run_id not in trees.fetched_runs(config.root):
        release(session, head.run_id)  # a fetch that brought something released it already
    # a run that did not finish is worth a fetch hint only when it left a whole model (a stopped trainer
    # exports; a killed one usually has none; a full disk leaves a model without its manifest); node 0's
    end.fetchable = job is not None and outs is not None and outs.model and session is not None and (
        status["state"] == RunState.FINISHED or left_a_model(session, head.run_dir, job))
    return end


def ended_artifacts(config: Config, session: HostSession, head: Launched, job: JobConfig, reporter: Reporter,
                    timings: dict[str, float], outs: Outputs | None) -> artifacts.DirFetch | None:
    """The artifacts of a run that ended other than FINISHED (its logs, metrics and config are what says
    why), as a FINISHED run's come. A failure is a warning naming the `fetch` that tries again: the run's
    end is what the exit code tells; Ctrl-C still stops it (130)."""
    try:
        got = fetch_artifacts(config, session, job, head.run_dir, head.run_id, reporter, outs=outs)
    except ThrustError as exc:
        if exc.exit_code == ExitCode.INTERRUPTED:
            raise
        reporter.warn(f"run {head.run_id}'s artifacts were not fetched ({exc.message}); "
                      f"later: {command_hint('fetch', head.run_id, host=session.host)}")
        return None
    except OSError as exc:  # a full disk here, say: the same words, the same way on
        reporter.warn(f"run {head.run_id}'s artifacts were not fetched ({exc}); "
                      f"later: {command_hint('fetch', head.run_id, host=session.host)}")
        return None
    if got is not None:
        timings[ARTIFACTS_TIMING] = got.seconds
    return got


def last_checkpoint(config: Config, session: HostSession, run_id: str, job: JobConfig,
                    reporter: Reporter, outs: Outputs | None = None) -> checkpoints.CheckpointPull | None:
    """An ended run's newest checkpoint (node 0's `session`), pulled: what `resume` continues from,
    whatever the host does next. A failure is a warning: the run's end is what the exit code tells."""
    try:
        return pull_checkpoint(config, session, job, session.paths.run(run_id), run_id, reporter, outs=outs)
    except ThrustError as exc:
        reporter.warn(f"run {run_id}'s newest checkpoint was not pulled ({exc.message}); "
                      f"later: {command_hint('fetch', run_id, host=session.host)}")
        return None


def release(session: HostSession | None, run_id: str) -> None:
    """This train is done with the run's tree on `session` (best effort: an unreleased lease lapses)."""
    if session is None:
        return
    with suppress(ThrustError):
        trees.release(session, run_id)


def fetch_finished(config: Config, session: HostSession, launched: Launched, job: JobConfig, status: StatusAnswer,
                   reporter: Reporter, *, force: bool, timings: dict[str, float], outs: Outputs | None = None,
                   ) -> tuple[models.FetchResult | None, artifacts.DirFetch | None]:
    """A FINISHED run's model (when the job exports one) and artifacts, each timed into `timings`;
    its newest checkpoint is pulled by the caller (`pull_checkpoint`), as for any end."""
    fetched = None
    t0 = time.monotonic()
    if (outs.model if outs is not None else exports_model(job)):
        reporter.step("fetching the model")
        fetched = finish(config, session, job, launched.run_dir, run_id=launched.run_id,
                         status=status, force=force)
        timings[Stage.FETCH] = time.monotonic() - t0
    got = fetch_artifacts(config, session, job, launched.run_dir, launched.run_id, reporter, outs=outs)
    if got is not None:
        timings[ARTIFACTS_TIMING] = got.seconds
    if fetched is None and got is not None:
        check_tree_gone(session, launched.run_id, got)
    return fetched, got


def check_tree_gone(session: HostSession, run_id: str, got: artifacts.DirFetch | None,
                    checkpoint: checkpoints.CheckpointPull | None = None) -> None:
    """Nothing could be fetched because the run's tree was removed (prune, keep:): 69, saying so plainly,
    never a quiet "matches nothing" or "no checkpoint yet" with exit 0. A job with `artifacts:` or
    `checkpoints:` alone (None for the other) is judged on what it has."""
    removed = (got.tree_removed if got is not None else None) or (checkpoint.tree_removed if checkpoint else None)
    if not removed or (got is not None and got.files) or (checkpoint is not None and checkpoint.came):
        return
    logs, dry = command_hint("logs", run_id, host=session.host), command_hint("prune", "--dry-run", host=session.host)
    raise ThrustError(f"nothing fetched of run {run_id}: {removed}",
                      f"its log: {logs}; to keep the trees of more ended runs, raise keep: {{runs: N}} under "
                      f"hosts.{session.name} in {config_file(session.host)} ({dry} lists what a prune would remove)",
                      ExitCode.UNAVAILABLE)


def fetch_artifacts(config: Config, session: HostSession, job: JobConfig, run_dir: str, run_id: str,
                    reporter: Reporter, *, outs: Outputs | None = None) -> artifacts.DirFetch | None:
    """The job's artifacts into .thrust/fetched/<run-id>/artifacts/, only what changed (fetch/artifacts.py),
    a checkpoint among them linked from the one pulled here already; None when the job has none. A glob
    that matches nothing is a warning. `outs`: the job's, resolved."""
    outs = outs if outs is not None else outputs(job)
    globs = outs.artifacts
    if not globs:
        return None
    reporter.step("fetching the artifacts")
    got = artifacts.fetch_artifacts(session, run_dir, run_id, config.root, globs, warn=reporter.warn,
                                    others=checkpoints.kept_twins(config.root, run_id))
    reporter.step(got.summary(config.root))
    return got


def pull_checkpoint(config: Config, session: HostSession, job: JobConfig, run_dir: str, run_id: str,
                    reporter: Reporter, *, every: bool = False,
                    outs: Outputs | None = None) -> checkpoints.CheckpointPull | None:
    """The run's newest checkpoint (`every`: all) into .thrust/fetched/<run-id>/checkpoints/, verified,
    only what changed (fetch/checkpoints.py); None when the job declares no checkpoints. `outs`: the
    job's outputs, resolved."""
    glob = outs.checkpoints if outs is not None else checkpoints.checkpoint_glob(job)
    if glob is None:
        return None
    got = checkpoints.pull(session, run_dir, run_id, config.root, glob, every=every)
    if got.newest is None and not got.tree_removed:  # none yet, or none ever: the run's state tells
        got.ended = _ended(session, run_id)
    if not glob.startswith(RUN_DIR_PREFIX) and not _own_tree(session, run_dir):
        got.warnings += _sharing_checkpoints(session, job, run_id, glob)
    for text in got.warnings:
        reporter.warn(text)
    reporter.step(got.summary(config.root))
    return got


def _ended(session: HostSession, run_id: str) -> bool:
    """The run has ended (asked only when no checkpoint was found: what the pull's line says then)."""
    try:
        return RunState.of(control.status(session, run_id).get("state")).is_terminal
    except ThrustError:
        return False  # unknown: "none on the host yet" says no more than is known


def _own_tree(session: HostSession, run_dir: str) -> bool:
    """The run ran in a tree of its own (run.json's `tree`): no other run writes there."""
    record = control.read_run_json(session, run_dir)  # typed: a RunRecord
    return record is not None and isinstance(record.get("tree"), str)


def _sharing_checkpoints(session: HostSession, job: JobConfig, run_id: str, glob: str) -> list[str]:
    """Runs of the same job going on in the same checkout (a run without a tree of its own: a layout
    before trees) write where this one's `checkpoints:` looks
    (a glob under the checkout): the newest file there may be theirs. Said, with the way out."""
    others = [r["run_id"] for r in control.list_runs(session)
              if r.get("run_id") != run_id and r.get("job") == job.name and RunState.of(r.get("state")).is_live]
    if not others:
        return []
    return [f"checkpoints: {', '.join(others)} (the same job, going on in the same checkout on {session.name}) "
            f"write(s) where {glob!r} looks: the newest checkpoint may be theirs; give each run its own directory "
            f"with a glob under $THRUST_RUN_DIR/ (your code writes there: $THRUST_RUN_DIR is set for it)"]


def left_a_model(session: HostSession, run_dir: str, job: JobConfig) -> bool:
    """A run that did not finish left a whole model to offer: a model.onnx that is not empty and, from
    the built-in trainer, the manifest its export writes after the model (an export cut by a full disk
    leaves neither whole; your own job may write only $THRUST_EXPORT)."""
    if not session.runner.run(["test", "-s", f"{run_dir}/{MODEL}"]).ok:
        return False
    text = session.runner.read_text(f"{run_dir}/{MANIFEST}", max_bytes=RUN_JSON_MAX)
    if text is None:
        return job.kind != "trainer"
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False


def exports_model(job: JobConfig) -> bool:
    """The trainer and cargo jobs always leave a model in the run dir; your own python or command job
    only when it says so with `export:` (it writes $THRUST_EXPORT)."""
    return job.kind in ("trainer", "cargo") or bool(job.export)


def export_target(config: Config, job: JobConfig) -> tuple[Path, str]:
    """(directory, stem) where the job's model lands: job.export, else web/public/<job>.onnx."""
    target = config.root / (job.export or f"web/public/{job.name}.onnx")
    return target.parent, target.stem


def finish(config: Config, session: HostSession, job: JobConfig, run_dir: str, *,
           run_id: str | None = None, status: Mapping[str, Any] | None = None,
           force: bool = False) -> models.FetchResult:
    """Fetch the run's model (verified), keep it in .thrust/fetched/<run-id>/ and place it in web/public
    when its run FINISHED and it is not clearly worse than the placed one, or with `force`
    (docs/architecture.md, "Kept models"). Cargo jobs fetch `artifact:`, relative to the run's cwd (the
    crate). `status` is the run's status when the caller has it already (train), else asked here (fetch)."""
    dest, stem = export_target(config, job)
    run_id = run_id or PurePosixPath(run_dir).name
    status = status if status is not None else control.status(session, run_id)
    if job.kind == "cargo":
        if not job.artifact:
            raise ThrustError(f"job {job.name} has no `artifact:` to fetch", exit_code=ExitCode.USAGE)
        cargo.stage_artifact(session, run_dir, str(status.get("cwd") or session.paths.workdir), job.name,
                             job.artifact)
    run = models.RunFacts(run_id, session.name, job.name, status.get("state"), status.get("exit_code"))
    return models.fetch_run_model(session.runner, run_dir, stem, dest, project_root=config.root, run=run,
                                     force=force)
