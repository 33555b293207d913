"""The search space: which trainer flags a study may search, the built-in spaces, and thrust.yaml's
`search:` specs turned into Optuna distributions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from thrust_remote.core.config import Config, JobConfig
from thrust_remote.core.errors import ConfigError, UsageError
from thrust_remote.run.jobs import config_label
from trainer.args import flag_specs

# The trainer's flags come from its one table (trainer/args.py TrainArgs, torch-free): searching a
# name not in it would only fail later, on the host, as an argparse error in every trial.
TRAINER_FLAGS = frozenset(flag_specs())
# Flags that name files or switch modes: the study decides them, not the sampler.
NOT_SEARCHABLE = frozenset({"env", "run-dir", "resume", "export", "tensorboard"})

# Built-in search spaces (thrust.yaml `search.<job>` replaces the one for its job). Power-of-two
# choices keep num-envs * num-steps divisible by num-minibatches.
DEFAULT_SEARCH: dict[str, dict[str, dict[str, Any]]] = {
    "cartpole": {
        "learning-rate": {"low": 3.0e-4, "high": 1.0e-2, "log": True},
        "num-envs": {"choices": [4, 8, 16, 32]},
        "num-steps": {"choices": [16, 32, 64, 128]},
        "num-minibatches": {"choices": [1, 2, 4, 8]},
        "update-epochs": {"low": 1, "high": 8},
        "clip-coef": {"low": 0.1, "high": 0.3},
        "ent-coef": {"low": 1.0e-5, "high": 1.0e-2, "log": True},
        "gamma": {"low": 0.95, "high": 0.999},
        "gae-lambda": {"low": 0.8, "high": 0.99},
        "hidden": {"choices": [32, 64, 128]},
    },
    "snake": {
        "learning-rate": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
        "num-envs": {"choices": [128, 256, 512, 1024]},
        "num-steps": {"choices": [32, 64, 128]},
        "num-minibatches": {"choices": [2, 4, 8]},
        "update-epochs": {"low": 1, "high": 4},
        "clip-coef": {"low": 0.1, "high": 0.3},
        "ent-coef": {"low": 1.0e-4, "high": 5.0e-2, "log": True},
        "gamma": {"low": 0.95, "high": 0.999},
        "point-gamma": {"low": 0.9, "high": 1.0},
        "gae-lambda": {"low": 0.8, "high": 0.99},
        "hidden": {"choices": [128, 256, 512]},
    },
}


def search_space(config: Config, job: JobConfig, fixed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The job's space (thrust.yaml `search:` or the built-in one) minus the flags fixed with --set."""
    if job.kind != "trainer":
        return own_space(config, job, fixed)
    where = f"{config.path or 'thrust.yaml'}: search.{job.name}"
    if job.name in config.search:
        space = {k: dict(v) for k, v in config.search[job.name].items()}
    else:
        env = str(dict(job.args).get("env") or job.name)  # type: ignore[arg-type]
        if env not in DEFAULT_SEARCH:
            raise ConfigError(f"job {job.name!r} has no search space",
                              f"add search.{job.name} to {config_label(config.path)}")
        space = {k: dict(v) for k, v in DEFAULT_SEARCH[env].items()}
        where = f"built-in search space of {env}"
    for name in space:
        if name not in TRAINER_FLAGS or name in NOT_SEARCHABLE:
            known = ", ".join(sorted(TRAINER_FLAGS - NOT_SEARCHABLE))
            raise ConfigError(f"{where}.{name}: not a trainer flag that can be searched", f"known: {known}")
        _check_spec(where, name, space[name])
    for name in fixed:
        if name not in TRAINER_FLAGS:
            raise UsageError(f"--set {name}=...: not a trainer flag", f"known: {', '.join(sorted(TRAINER_FLAGS))}")
    return _unfixed(space, fixed)


def own_space(config: Config, job: JobConfig, fixed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A python or command job's space: thrust.yaml `search.<job>` only (its flags are its own, so any
    plain name may be searched; each arrives as `--name value`, or `name=value` for a command job)."""
    where = f"{config.path or 'thrust.yaml'}: search.{job.name}"
    if job.name not in config.search:
        raise ConfigError(f"job {job.name!r} has no search space",
                          f"add search.{job.name} to {config_label(config.path)}, e.g. search: {{{job.name}: "
                          "{lr: {low: 1.0e-4, high: 1.0e-2, log: true}}}")
    space = {k: dict(v) for k, v in config.search[job.name].items()}
    for name, spec in space.items():
        _check_spec(where, name, spec)
    return _unfixed(space, fixed)


def _check_spec(where: str, name: str, spec: Mapping[str, Any]) -> None:
    if "choices" in spec:
        bad = [c for c in spec["choices"] if not isinstance(c, str | int | float | bool) and c is not None]
        if bad:
            raise ConfigError(f"{where}.{name}.choices: {bad[0]!r} is not a plain value")
    elif not all(isinstance(spec.get(k), int | float) for k in ("low", "high")) or spec["low"] >= spec["high"]:
        raise ConfigError(f"{where}.{name}: expected {{low: X, high: Y}} with X < Y, or {{choices: [...]}}")


def _unfixed(space: dict[str, dict[str, Any]], fixed: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    space = {k: v for k, v in space.items() if k not in fixed}
    if not space:
        raise UsageError("every searched parameter is fixed with --set: nothing left to search")
    return space


def distributions(space: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """thrust.yaml specs → Optuna distributions (ints stay ints when low, high and step are ints)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out: dict[str, Any] = {}
    for name, spec in space.items():
        if "choices" in spec:
            out[name] = CategoricalDistribution(list(spec["choices"]))
            continue
        low, high, log, step = spec["low"], spec["high"], bool(spec.get("log")), spec.get("step")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) and (
                step is None or isinstance(step, int)):
            out[name] = IntDistribution(low, high, log=log, step=1 if log else (step or 1))
        else:
            out[name] = FloatDistribution(float(low), float(high), log=log,
                                          step=None if log or step is None else float(step))
    return out
