"""The end of a study: the Summary the CLI renders (and prints as JSON), parameter importances, and
the best parameters file that `thrust-remote train JOB --params FILE` reads."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from thrust_remote.core.config import BEST_PARAMS_MARK
from thrust_remote.core.errors import ExitCode
from thrust_remote.core.files import write_atomic
from thrust_remote.optimize.model import OptimizeRequest, TrialView, count_states
from thrust_remote.optimize.slots import Slot
from thrust_remote.optimize.store import JOURNAL, HostsStore, StudyStore


@dataclass
class Summary:
    study: str
    storage: str
    job: str
    host: str
    metric: str
    trials_target: int
    counts: dict[str, int]
    best: dict[str, Any] | None
    importances: dict[str, float] | None
    importance_note: str | None
    best_params_file: str | None
    slots: list[dict[str, Any]]
    trials: list[TrialView]
    wall_s: float
    stopped: str | None  # why the study stopped before N (abort, timeout, failures), else None
    sync: dict[str, float] = field(default_factory=dict)
    dashboard_url: str | None = None  # what optuna-dashboard opens on this machine
    direction: str = "maximize"
    hosts: dict[str, int] = field(default_factory=dict)  # COMPLETE + PRUNED trials per host
    lost_hosts: dict[str, str] = field(default_factory=dict)  # host -> why it left the study

    @property
    def exit_code(self) -> int:
        if self.stopped == "aborted":
            return ExitCode.INTERRUPTED
        return ExitCode.OK if self.best is not None else ExitCode.FAILED

    def as_json(self) -> dict[str, Any]:
        return {
            "study": self.study, "storage": self.storage, "job": self.job, "host": self.host, "metric": self.metric,
            "direction": self.direction, "trials_target": self.trials_target, "counts": self.counts, "best": self.best,
            "importances": self.importances, "importance_note": self.importance_note,
            "best_params_file": self.best_params_file, "slots": self.slots, "wall_s": round(self.wall_s, 3),
            "stopped": self.stopped, "sync": self.sync, "dashboard_url": self.dashboard_url,
            "hosts": self.hosts, "lost_hosts": self.lost_hosts, "trials": [t.as_json() for t in self.trials],
        }


def build_summary(study: Any, *, name: str, job: str, host: str, request: OptimizeRequest,
                  fixed: Mapping[str, Any], best_file: Path, store: StudyStore | HostsStore, slots: Sequence[Slot],
                  views: Mapping[int, TrialView], stopped: str | None, wall: float,
                  metric: str | None = None, direction: str = "maximize", hosts: Sequence[str] = (),
                  lost: Mapping[str, str] | None = None) -> Summary:
    counts = count_states(study)
    best = best_trial(study)
    importances, note = None, None
    if counts["COMPLETE"] >= 2:
        importances, note = param_importances(study)
    else:
        note = "needs at least 2 complete trials"
    written = None
    if best is not None:
        out = request.out or best_file
        write_best_params(out, name, job, best, fixed)
        written = str(out)
    hosts = list(hosts) or [host]
    trials = sorted(_all_views(study, views, set(hosts)), key=lambda v: v.number)
    sync = {"pushes": store.pushes, "push_s": round(store.push_s, 3)} if store.synced else {}
    dashboard = store.url if store.url.startswith("sqlite") else store.label.removeprefix(JOURNAL)
    slot_rows = [{"name": s.name, "cuda_visible_devices": s.cuda_visible_devices, "host": s.host} for s in slots]
    return Summary(name, store.label, job, host, metric or request.metric, request.trials, counts, best, importances,
                   note, written, slot_rows, trials, wall, None if counts["done"] >= request.trials else stopped, sync,
                   dashboard, direction, per_host(study, hosts), dict(lost or {}))


def per_host(study: Any, hosts: Sequence[str]) -> dict[str, int]:
    """COMPLETE + PRUNED trials per host: this run's hosts first (0 when none ran there), then any
    other host the study's earlier trials ran on."""
    out = dict.fromkeys(hosts, 0)
    for t in study.get_trials(deepcopy=False):
        if t.state.name in ("COMPLETE", "PRUNED"):
            name = t.user_attrs.get("host") or "?"
            out[name] = out.get(name, 0) + 1
    return out


def best_trial(study: Any) -> dict[str, Any] | None:
    try:
        bt = study.best_trial
    except ValueError:
        return None
    return {"number": bt.number, "value": bt.value, "params": dict(bt.params),
            "run_id": bt.user_attrs.get("run_id"), "metric": bt.user_attrs.get("value_metric"),
            "host": bt.user_attrs.get("host")}


def _all_views(study: Any, views: Mapping[int, TrialView], hosts: set[str]) -> list[TrialView]:
    """This driver's trials, and those an earlier driver of the study ran on these hosts."""
    out = dict(views)
    for frozen in study.get_trials(deepcopy=False):
        if frozen.number not in out and frozen.user_attrs.get("host") in hosts:
            view = TrialView.from_frozen(frozen)
            view.state = frozen.state.name
            view.value = frozen.value
            view.ended_at = frozen.user_attrs.get("ended_at")
            view.first_metric_at = frozen.user_attrs.get("first_metric_at")
            out[frozen.number] = view
    return list(out.values())


def param_importances(study: Any) -> tuple[dict[str, float] | None, str | None]:
    """fANOVA when Optuna can compute it here, else PED-ANOVA; a reason instead of an exception."""
    import optuna

    errors = []
    for evaluator in (optuna.importance.FanovaImportanceEvaluator, optuna.importance.PedAnovaImportanceEvaluator):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = optuna.importance.get_param_importances(study, evaluator=evaluator())
            return {k: round(float(v), 4) for k, v in result.items()}, evaluator.__name__
        except Exception as exc:  # noqa: BLE001 - any evaluator failure is just "not computable"
            errors.append(f"{evaluator.__name__}: {exc}")
    return None, "; ".join(errors)


def write_best_params(path: Path, study: str, job: str, best: Mapping[str, Any], fixed: Mapping[str, Any]) -> None:
    """The YAML that `thrust-remote train JOB --params FILE` reads: the searched values plus the flags
    fixed with --set during the study (so the run is the trial's run)."""
    params = {**{k: _plain(v) for k, v in best["params"].items()}, **{k: _plain(v) for k, v in fixed.items()}}
    body = {"params": params, "study": study, "job": job, "trial": best["number"], "value": best["value"]}
    on = ""
    if best.get("host"):  # where the best trial ran: the host its numbers are true for
        body["host"] = best["host"]
        on = f" --host {best['host']}"
    text = (f"# best trial of study {study} {BEST_PARAMS_MARK}\n"
            f"# use it with: thrust-remote train {job} --params {path.name}{on}\n"
            + yaml.safe_dump(body, sort_keys=False))
    write_atomic(path, text, mode=0o644)  # the user's own file, to keep and share


def _plain(value: Any) -> Any:
    """--set values arrive as strings: give numbers back their type so the YAML reads naturally."""
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value)
            except ValueError:
                continue
    return value
