"""What a study maximises or minimises, and where the values come from (docs/optimize.md, "Objective and pruning").

The built-in trainer: its metrics.jsonl (`--metric`, as always; maximised). A python or command job of
your own names its objective in thrust.yaml, `objective: {metric: NAME, mode: max|min}`, and the values
come from its `THRUST_METRICS {json}` lines (key NAME, `step` as the step) or, with
`metrics: {tensorboard: DIR}`, from the TensorBoard scalar NAME in the event files under the
checkout's DIR, read on the host by the job's own python (agent `scalars`).
"""

from __future__ import annotations

from dataclasses import dataclass

from thrust_remote.core.config import Config, JobConfig
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.run.jobs import config_label
from thrust_remote.runs.scalarwatch import RUN_ID_VARS, events_path


@dataclass(frozen=True)
class Objective:
    metric: str  # the trainer: auto | eval_return | return_mean | score_mean; else the job's name for it
    mode: str = "max"  # max | min
    source: str = "trainer"  # trainer (metrics.jsonl) | lines (THRUST_METRICS in the log) | tensorboard
    events_dir: str | None = None  # tensorboard: DIR under the checkout, $THRUST_RUN_ID allowed
    where: str = "thrust.yaml"  # `file:line: jobs.NAME.objective` for messages
    pattern: str | None = None  # lines: the job's `metrics: {pattern:}`, read from its own log lines too

    @property
    def direction(self) -> str:
        return "minimize" if self.mode == "min" else "maximize"

    @property
    def own(self) -> bool:
        return self.source != "trainer"

    @property
    def per_run_dir(self) -> bool:
        """Whether each run's event files are apart from the others' (DIR names the run)."""
        return any(v in (self.events_dir or "") for v in RUN_ID_VARS)

    def events_under(self, cwd: str, run_id: str) -> str:
        return events_path(cwd, self.events_dir, run_id)

    def better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b


def objective_for(config: Config, job: JobConfig, metric_flag: str) -> Objective:
    """The trainer keeps `--metric`; any other job must name its objective in thrust.yaml."""
    if job.kind == "trainer":
        return Objective(metric_flag)
    if job.kind not in ("python", "command"):
        raise UsageError(f"optimize runs trainer, python and command jobs; job {job.name!r} is a {job.kind} job")
    label = config_label(config.path)
    if metric_flag != "auto":
        raise UsageError(f"--metric is the built-in trainer's; job {job.name!r} names its metric in "
                         f"{label}: jobs.{job.name}.objective")
    if not job.objective:
        line = job.lines.get("job")
        where = f"{label}:{line}" if line else label
        raise ConfigError(f"{where}: job {job.name!r} has no objective for optimize to maximise or minimise",
                          f"add to jobs.{job.name}: objective: {{metric: charts/episodic_return, mode: max}}")
    line = job.lines.get("objective")
    where = f"{label}:{line}: jobs.{job.name}.objective" if line else f"{label}: jobs.{job.name}.objective"
    tb = job.metrics.tensorboard
    return Objective(job.objective.metric, job.objective.mode,
                     "tensorboard" if tb else "lines", tb, where, job.metrics.pattern)


def missing_metric(objective: Objective, trial: int, seen: list[str]) -> ConfigError:
    """The error when a study's first finished trial never reported the objective's metric."""
    names = ", ".join(seen[:20]) + (" ..." if len(seen) > 20 else "") if seen else "none"
    how = (f"TensorBoard scalars under {objective.events_dir}" if objective.source == "tensorboard"
           else f"THRUST_METRICS lines and lines matching {objective.pattern!r}" if objective.pattern
           else "THRUST_METRICS lines")
    return ConfigError(
        f"{objective.where}: metric {objective.metric!r} never appeared in trial {trial}'s {how} "
        f"(names seen: {names}); stopping the study rather than running useless trials",
        "set objective.metric to one of the names seen (a pattern's named groups are its names), or report it: "
        + ('writer.add_scalar(NAME, value, step)' if objective.source == "tensorboard"
           else 'print("THRUST_METRICS " + json.dumps({"step": step, NAME: value}), flush=True)'))
