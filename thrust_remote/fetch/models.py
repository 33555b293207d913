"""Bring a run's model home: fetch (sha256 verified), check with onnx + onnxruntime, keep, place.

Every fetched model is kept per run in `<project>/.thrust/fetched/<run-id>/` (`model.onnx`,
`manifest.json`, `metrics.jsonl`, `fetch.json`). `web/public/<job>.onnx` + `<job>.json` (manifest) +
`<job>.metrics.jsonl` move to it only when the run FINISHED and its score is not clearly worse than
the placed model's (`force` places it anyway); see docs/architecture.md, "Kept models". A cut or
corrupt fetch leaves both the kept copy and the placed model untouched (exit 74).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from thrust_remote.agent import protocol
from thrust_remote.agent.protocol import RunState
from thrust_remote.core.errors import ExitCode, ThrustError, TransferError
from thrust_remote.core.files import copy_atomic, tool_dir, write_atomic
from thrust_remote.core.hints import command_hint
from thrust_remote.host.runner import Runner

MODEL, MANIFEST, METRICS = protocol.MODEL, protocol.MANIFEST, protocol.METRICS  # kept under the run dir's names
FETCH_INFO = "fetch.json"
KEPT_DIR = Path(".thrust") / "fetched"
# A FINISHED run whose score is lower than the placed model's by more than this fraction of it is not
# placed without force. The score is a training mean over the last episodes: two runs of the same
# settings differ by a few percent (snake: 59.9 and 62.4 apples), which must not count as worse.
WORSE_MARGIN = 0.10
# What makes two scores comparable: the same env on the same board.
SETTINGS_KEYS = ("env", "grid_size", "action_mode")


@dataclass
class FetchResult:
    model: Path  # the placed model when placed, else the kept one
    manifest: Path
    metrics: Path | None
    sha256: str
    bytes: int
    max_abs_output: float
    kept: Path  # .thrust/fetched/<run-id>/
    info: dict[str, Any]  # what fetch.json says
    target: Path  # <dest>/<job>.onnx: where a placed model lands
    placed: bool
    why_not: str | None = None  # "state" (not FINISHED) or "worse" (score), when not placed
    previous: dict[str, Any] | None = None  # the model that was placed before: score, steps, run_id, sha256
    backup: Path | None = None  # where that model was kept when it had no kept copy yet
    forced: bool = False  # placed only because of force (not FINISHED, or clearly worse)


def kept_root(project_root: Path) -> Path:
    return project_root / KEPT_DIR


def verify_model(model: Path, manifest: dict) -> float:
    """onnx.checker + one onnxruntime inference on the manifest's input shape; returns max |logit|."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    try:
        onnx.checker.check_model(str(model))
    except Exception as exc:  # noqa: BLE001 - onnx raises several types for a bad model
        raise ThrustError(f"{model.name} fails onnx.checker: {exc}", exit_code=ExitCode.TRANSFER) from None
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    if len(inputs) != 1:
        raise ThrustError(f"{model.name} has {len(inputs)} inputs, expected 1 (obs)")
    obs_dim = manifest.get("obs_dim") or inputs[0].shape[-1]
    if not isinstance(obs_dim, int):
        raise ThrustError(f"{model.name}: cannot tell the observation size (manifest has no obs_dim)")
    obs = np.random.default_rng(0).random((4, obs_dim), dtype=np.float32)
    outputs = session.run(None, {inputs[0].name: obs})
    first = np.asarray(outputs[0])
    if first.shape[0] != 4 or not np.isfinite(first).all():
        raise ThrustError(f"{model.name} gives output of shape {first.shape} with non-finite values for a batch of 4")
    n_actions = manifest.get("n_actions")
    if n_actions is not None and first.shape[-1] != n_actions:
        raise ThrustError(f"{model.name} has {first.shape[-1]} actions, the manifest says {n_actions}")
    return float(np.abs(first).max())


# ------------------------------------------------------------------------------------------ scores

# A held-out score's kind per env (else "held-out return"): never compared with a training score's kind.
HELD_OUT_KIND = {"snake": "held-out apples"}


def score_of(manifest: dict, metrics: Path | None) -> tuple[float | None, str | None]:
    """(score, kind): the model's own greedy score on held-out games when the run chose it on them (the
    manifest's `held_out`), else the env's score from the last metrics line that has one — snake's mean
    apples (`score_mean`), else the greedy `eval_return`, else the training `return_mean` — else the
    manifest's `final_return`. (None, None) when nothing says."""
    held_out = manifest.get("held_out")
    if isinstance(held_out, dict) and isinstance(held_out.get("mean"), int | float):
        return float(held_out["mean"]), HELD_OUT_KIND.get(str(manifest.get("env")), "held-out return")
    lines: list[str] = []
    if metrics is not None and metrics.is_file():
        with contextlib.suppress(OSError, UnicodeDecodeError):
            lines = metrics.read_text().splitlines()
    for key, kind in (("score_mean", "apples"), ("eval_return", "eval return"), ("return_mean", "return")):
        for line in reversed(lines):
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and isinstance(row.get(key), int | float):
                return float(row[key]), kind
    final = manifest.get("final_return")
    return (float(final), "return") if isinstance(final, int | float) else (None, None)


def clearly_worse(new: dict[str, Any], old: dict[str, Any] | None) -> bool:
    """True when both scores are known and comparable (same env settings and score kind) and the new
    one is lower by more than WORSE_MARGIN of the old one."""
    if old is None or new.get("score") is None or old.get("score") is None:
        return False
    if new.get("score_kind") != old.get("score_kind"):
        return False
    if any(new.get("settings", {}).get(k) != old.get("settings", {}).get(k) for k in SETTINGS_KEYS):
        return False
    return float(new["score"]) < float(old["score"]) - WORSE_MARGIN * abs(float(old["score"]))


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


# ------------------------------------------------------------------------------------------ kept models

def list_kept(project_root: Path) -> list[dict[str, Any]]:
    """Every kept model's fetch.json plus `dir`, newest fetch first."""
    root = kept_root(project_root)
    if not root.is_dir():
        return []
    rows = []
    for info_path in root.glob(f"*/{FETCH_INFO}"):
        if info_path.parent.name.startswith("."):
            continue  # a fetch in progress
        info = _read_json(info_path)
        if info is not None and (info_path.parent / MODEL).is_file():
            rows.append({**info, "dir": info_path.parent})
    rows.sort(key=lambda r: str(r.get("fetched_at") or ""), reverse=True)
    return rows


def placed_facts(dest: Path, stem: str, project_root: Path) -> dict[str, Any] | None:
    """What web/public/<stem>.onnx is now: sha256, steps, score and the kept run it came from."""
    manifest = _read_json(dest / f"{stem}.json")
    if manifest is None or not (dest / f"{stem}.onnx").is_file():
        return None
    metrics = dest / f"{stem}.metrics.jsonl"
    score, kind = score_of(manifest, metrics if metrics.is_file() else None)
    sha = manifest.get("sha256")
    source = next((r for r in list_kept(project_root) if sha and r.get("sha256") == sha), None)
    return {"sha256": sha, "steps": manifest.get("steps"), "score": score, "score_kind": kind,
            "settings": {k: manifest.get(k) for k in SETTINGS_KEYS},
            "run_id": source.get("run_id") if source else None, "kept": source["dir"] if source else None}


def _replace_dir(staging: Path, final: Path) -> None:
    """final := staging (a directory), the old one removed only after the new one is in place."""
    old = None
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _ensure_kept_root(project_root: Path) -> Path:
    """.thrust/fetched/, owner-only (0700, also when an older version made it 0755): what a run brings
    home is the user's alone, whatever the modes of the files under it."""
    root = kept_root(project_root)
    tool_dir(project_root, *root.relative_to(project_root / ".thrust").parts)
    if stat.S_IMODE(root.stat().st_mode) != 0o700:
        root.chmod(0o700)
    return root


def _keep_placed(dest: Path, stem: str, project_root: Path, previous: dict[str, Any], replaced_by: str) -> Path:
    """Keep a copy of the placed model before it is replaced, when no kept run holds it (a model
    placed before models were kept, or by hand): a good model is never lost by a fetch."""
    from thrust_remote.host.runner import sha256_file

    sha = previous.get("sha256") or sha256_file(dest / f"{stem}.onnx")
    name = f"{stem}-placed-{str(sha)[:12]}"
    keep = kept_root(project_root) / name
    keep.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(dest / f"{stem}.onnx", keep / MODEL)
    shutil.copyfile(dest / f"{stem}.json", keep / MANIFEST)
    if (dest / f"{stem}.metrics.jsonl").is_file():
        shutil.copyfile(dest / f"{stem}.metrics.jsonl", keep / METRICS)
    target = relative(dest / f"{stem}.onnx", project_root)
    _write_json(keep / FETCH_INFO, {
        "run_id": name, "host": None, "job": stem, "state": None, "exit_code": None,
        "steps": previous.get("steps"), "score": previous.get("score"), "score_kind": previous.get("score_kind"),
        "fetched_at": _now(), "sha256": sha, "placed": False, "target": target,
        "note": f"was {target} until run {replaced_by} replaced it",
    })
    return keep


def relative(path: Path, root: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def place(kept: Path, dest: Path, stem: str) -> Path:
    """Copy a kept model into dest as <stem>.onnx/.json/.metrics.jsonl: model first, manifest last (the
    page reads the manifest first), a metrics file of an older model removed."""
    dest.mkdir(parents=True, exist_ok=True)
    copy_atomic(kept / MODEL, dest / f"{stem}.onnx")
    metrics = dest / f"{stem}.metrics.jsonl"
    if (kept / METRICS).is_file():
        copy_atomic(kept / METRICS, metrics)
    else:
        metrics.unlink(missing_ok=True)
    copy_atomic(kept / MANIFEST, dest / f"{stem}.json")
    return dest / f"{stem}.onnx"


def _mark_placed(project_root: Path, kept: Path, info: dict[str, Any]) -> None:
    """fetch.json's `placed`: true for this run, false for the one it replaced at the same target."""
    for row in list_kept(project_root):
        if row.get("placed") and row.get("target") == info["target"] and row["dir"] != kept:
            _write_json(row["dir"] / FETCH_INFO, {**{k: v for k, v in row.items() if k != "dir"}, "placed": False})
    info["placed"] = True
    _write_json(kept / FETCH_INFO, info)


# ------------------------------------------------------------------------------------------ fetch

@dataclass(frozen=True)
class RunFacts:
    """The run a model comes from, as fetch.json records it."""

    run_id: str
    host: str
    job: str
    state: str | None
    exit_code: int | None = None


def _stage(runner: Runner, run_dir: str, staging: Path, run: RunFacts) -> tuple[str, dict[str, Any], bool]:
    """Get model, manifest (and metrics) into staging; (model sha256, manifest, has metrics)."""
    if not runner.exists(f"{run_dir}/{MODEL}"):
        raise ThrustError(
            f"run {run.run_id} has no {MODEL} in {run_dir} (did training finish and export?)",
            "see its log with: " + command_hint("logs", run.run_id, host=run.host),
        )
    model_sha = runner.get(f"{run_dir}/{MODEL}", staging / MODEL)
    if runner.exists(f"{run_dir}/{MANIFEST}"):
        runner.get(f"{run_dir}/{MANIFEST}", staging / MANIFEST)
    else:  # your own job wrote only $THRUST_EXPORT: the manifest records what we know of it
        (staging / MANIFEST).write_text(json.dumps({"sha256": model_sha, "job": run.job, "source": "THRUST_EXPORT"}))
    has_metrics = runner.exists(f"{run_dir}/{METRICS}")
    if has_metrics:
        runner.get(f"{run_dir}/{METRICS}", staging / METRICS)
    try:
        manifest = json.loads((staging / MANIFEST).read_text())
    except ValueError as exc:
        raise TransferError(f"manifest.json from the run is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("sha256") != model_sha:
        got = manifest.get("sha256") if isinstance(manifest, dict) else None
        raise TransferError(
            f"model sha256 {model_sha[:16]}… does not match its manifest ({str(got)[:16]}…)",
            "the export on the host is inconsistent; run the export again",
        )
    return model_sha, manifest, has_metrics


def fetch_run_model(runner: Runner, run_dir: str, stem: str, dest: Path, *, project_root: Path, run: RunFacts,
                    force: bool = False) -> FetchResult:
    """Fetch <run_dir>/model.onnx + manifest.json (+ metrics.jsonl), verify, keep them in
    .thrust/fetched/<run-id>/, then place them in dest as <stem>.* when the run FINISHED and is not
    clearly worse than the placed model (or `force`)."""
    root = _ensure_kept_root(project_root)
    staging = Path(tempfile.mkdtemp(prefix=f".incoming-{run.run_id}-", dir=root))
    kept = root / run.run_id
    try:
        sha, manifest, has_metrics = _stage(runner, run_dir, staging, run)
        size = (staging / MODEL).stat().st_size
        max_out = verify_model(staging / MODEL, manifest)
        score, kind = score_of(manifest, staging / METRICS if has_metrics else None)
        info: dict[str, Any] = {
            "run_id": run.run_id, "host": run.host, "job": run.job, "state": run.state, "exit_code": run.exit_code,
            "steps": manifest.get("steps"), "score": score, "score_kind": kind, "fetched_at": _now(),
            "sha256": sha, "placed": False, "target": relative(dest / f"{stem}.onnx", project_root),
        }
        _write_json(staging / FETCH_INFO, info)
        # the run's artifacts and checkpoints (fetch/artifacts.py, fetch/checkpoints.py) stay with it
        for name in ("artifacts", "artifacts.json", "checkpoints", "checkpoints.json"):
            if (kept / name).exists():
                os.replace(kept / name, staging / name)
        _replace_dir(staging, kept)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    result = FetchResult(kept / MODEL, kept / MANIFEST, kept / METRICS if has_metrics else None, sha, size, max_out,
                         kept, info, dest / f"{stem}.onnx", placed=False)
    _settle(result, manifest, stem, project_root, force)
    return result


def _settle(result: FetchResult, manifest: dict[str, Any], stem: str, project_root: Path, force: bool) -> None:
    """Place the kept model, or say why not (result.why_not); keep what it replaces."""
    dest = result.target.parent
    previous = placed_facts(dest, stem, project_root)
    result.previous = previous
    if previous is not None and previous.get("sha256") == result.sha256:
        place(result.kept, dest, stem)  # the same model: already placed (metrics refreshed)
    else:
        new = {**result.info, "settings": {k: manifest.get(k) for k in SETTINGS_KEYS}}
        if result.info["state"] != RunState.FINISHED:
            result.why_not = "state"
        elif clearly_worse(new, previous):
            result.why_not = "worse"
        if result.why_not is not None and not force:
            return
        result.forced, result.why_not = result.why_not is not None, None
        if previous is not None and previous.get("kept") is None:
            result.backup = _keep_placed(dest, stem, project_root, previous, result.info["run_id"])
        place(result.kept, dest, stem)
    _mark_placed(project_root, result.kept, result.info)
    result.placed = True
    result.model = result.target
    result.manifest = dest / f"{stem}.json"
    result.metrics = dest / f"{stem}.metrics.jsonl" if result.metrics is not None else None
