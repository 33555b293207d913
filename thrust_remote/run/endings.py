"""A next step after every ending of a followed run (docs/architecture.md, "Checkpoints and resume"):
what to type once a run ended other than FINISHED. A LOST, STOPPED or FAILED run of a job that can
resume names `resume RUN --host H` with the checkpoint pulled here (its step and age), and with none
pulled the train command again (resume would find none: 64); a job of your own that refused one of its
`--set`/`--params` names before its first metrics says which, quoting the job, and the train command without
that name or with the one the job takes (the same command would fail the same way); one whose first words
refused how its flags were spelled names its flag style (run/flags.py); a LOST run that cannot resume says why it
is lost and how to run it again. Library code: the lines, never printed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from thrust_remote.agent.protocol import RunState, StatusAnswer
from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.fetch import checkpoints
from thrust_remote.run import flags
from thrust_remote.runs.progress import RunProgress

SCRIPT_READ_MAX = 1 << 20  # a training script's top-level names are near its top; nanoGPT's train.py is 14 kB


def next_steps(config: Config, status: StatusAnswer, job: JobConfig | None, progress: RunProgress,
               host: HostConfig, config_path: Path | str | None = None, *, gave_flags: bool = False,
               now: float | None = None, sets: Sequence[str] = (),
               params: Mapping[str, object] | None = None) -> list[str]:
    """The lines that say what to do after the run's end (none after FINISHED: that end says itself);
    `sets`: the run's --set words, which the train command that runs it again repeats; `params`: its
    --params (a name the job refused may be one of them)."""
    state = RunState.of(status.get("state"))
    run_id = str(status.get("run_id"))
    if state == RunState.FINISHED or job is None:
        return []
    out = []
    if state == RunState.FAILED and not progress.metrics and gave_flags:
        given = {**(params or {}), **dict(_key_value(s) for s in sets)}
        refusal = flags.refused_name(job, "\n".join(progress.tail), given)
        if refusal is not None:  # run again as it was, it fails the same way: neither resume nor the same train
            refusal = flags.with_script_names(refusal, job.script or "", _script_text(config, job))
            return _refused_steps(run_id, job, refusal, sets, given.get(refusal.key), host, config_path)
    if state == RunState.FAILED and not progress.metrics:
        hint = flags.refused_hint(job, "\n".join(progress.tail), gave_flags=gave_flags,
                                  config_file=config_file(host, config_path))
        if hint:
            out.append(f"run {run_id} died of its arguments before its first metrics: {hint}")
    resume = command_hint("resume", run_id, host=host, config=config_path)
    again = command_hint("train", job.name, *(w for s in sets for w in ("--set", s)), host=host, config=config_path)
    if resumable(job) and state in (RunState.LOST, RunState.STOPPED, RunState.FAILED):
        pulled = checkpoints.describe(config.root, run_id, now)
        if pulled:
            out.append(f"continue it from its checkpoint {pulled}: {resume} (or --host another host; the pulled "
                       "copy is used when its host does not answer)")
        else:  # none came at its end, where `resume` would find none either (64): the train is what works
            out.append(f"no checkpoint of it came here at its end, so there is none to continue from; run it "
                       f"again: {again}")
    elif state == RunState.LOST:
        out.append(f"nothing recorded its end (its host restarted, or its supervisor was killed); run it again: "
                   f"{again}" + ("" if job.kind == "trainer" else
                                 f"; with `checkpoints:` and `resume:` under jobs.{job.name}, a LOST run continues"))
    return out


def of_run(config: Config, status: StatusAnswer, job: JobConfig, progress: RunProgress, host: HostConfig,
           config_path: Path | str | None, sets: Sequence[str], params: Mapping[str, object] | None) -> list[str]:
    """`next_steps` for a run that was given `sets` and `params` (its index entry's): whether thrust-remote
    wrote it flags (`gave_flags`) is read from them here, in the one call a follow's end makes."""
    return next_steps(config, status, job, progress, host, config_path, gave_flags=gave_flags(job, sets, params),
                      sets=sets, params=params)


def _script_text(config: Config, job: JobConfig) -> str:
    """The job's script as the project has it here (the names it sets), "" for none or one unreadable."""
    if not job.script:
        return ""
    try:
        with open(config.root / job.script, encoding="utf-8", errors="replace") as f:
            return f.read(SCRIPT_READ_MAX)
    except OSError:
        return ""


def _key_value(word: str) -> tuple[str, str]:
    key, _, value = word.partition("=")
    return key.strip().removeprefix("--"), value


def _refused_steps(run_id: str, job: JobConfig, refusal: flags.Refusal, sets: Sequence[str], value: object,
                   host: HostConfig, config_path: Path | str | None) -> list[str]:
    """The end of a run whose job refused one of its names: which, in the job's own words, and the train
    command with that name as the job takes it (`n-timesteps`), or without it where none is evident."""
    words = [s for s in sets if _key_value(s)[0] == refusal.key]
    given = f"--set {words[0]}" if words else "--params"
    said = (f"run {run_id} died before its first metrics: the job refused {refusal.flag} ({given}), saying: "
            f"{refusal.said[:200]}")
    kept: list[str] = []
    for word in sets:  # the refused word replaced where it stood, or left out
        key, value = _key_value(word)
        if key != refusal.key:
            kept.append(word)
        elif refusal.instead:
            kept.append(f"{refusal.instead}={value}")
    if refusal.instead and not words:  # given by --params: its value under the name the job takes
        kept.append(f"{refusal.instead}={value}")
    again = command_hint("train", job.name, *(w for s in kept for w in ("--set", s)), host=host, config=config_path)
    also = "" if words else f" (and take {refusal.key} out of the --params file)"
    if refusal.dashed:
        fix = (f"its flags are written with dashes ({refusal.shown}): {again}{also}, or write every name so with "
               f"jobs.{job.name}.flags: {{names: {flags.DASHES}}} in {config_file(host, config_path)}")
    elif refusal.instead:
        fix = f"did you mean {refusal.instead} ({refusal.source} has {refusal.shown})? {again}{also}"
    else:
        fix = f"{refusal.key} is not a name the job knows (check its spelling); without it: {again}{also}"
    return [said, fix]


def resumable(job: JobConfig) -> bool:
    """The job says where its checkpoints are and how it continues from one (the trainer's are known)."""
    says = bool(job.resume or job.resume_at)  # `resume: {checkpoint_at: P}` alone says how, with no arguments
    return checkpoints.checkpoint_glob(job) is not None and (job.kind == "trainer" or says)


def gave_flags(job: JobConfig, entry_sets: Sequence[str], params: Mapping[str, object] | None) -> bool:
    """Whether thrust-remote wrote flags for the run (an `args:` mapping, --set, --params): only then can
    their style be why it died."""
    return bool((isinstance(job.args, Mapping) and job.args) or entry_sets or params)
