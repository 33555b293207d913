"""Bring a run's model home: fetch (sha256 verified), check with onnx + onnxruntime, place atomically.

`web/public/<job>.onnx` + `<job>.json` (manifest) + `<job>.metrics.jsonl` change only after every
check passed; a cut or corrupt fetch leaves what was there untouched (exit 74).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .config import HostConfig
from .errors import ExitCode, ThrustError, TransferError
from .hints import command_hint
from .runner import Runner

MODEL = "model.onnx"
MANIFEST = "manifest.json"
METRICS = "metrics.jsonl"


@dataclass
class FetchResult:
    model: Path
    manifest: Path
    metrics: Path | None
    sha256: str
    bytes: int
    max_abs_output: float


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


def fetch_run_model(runner: Runner, run_dir: str, job: str, dest: Path, *,
                    host: HostConfig | None = None) -> FetchResult:
    """Fetch <run_dir>/model.onnx + manifest.json (+ metrics.jsonl) into dest as <job>.*"""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".incoming-{job}-", dir=dest) as tmp:
        staging = Path(tmp)
        if not runner.exists(f"{run_dir}/{MODEL}"):
            raise ThrustError(
                f"the run has no {MODEL} in {run_dir} (did training finish and export?)",
                "see its log with: " + command_hint("logs", os.path.basename(run_dir.rstrip("/")),
                                                    host=host or runner.name),
            )
        model_sha = runner.get(f"{run_dir}/{MODEL}", staging / MODEL)
        runner.get(f"{run_dir}/{MANIFEST}", staging / MANIFEST)
        metrics = None
        if runner.exists(f"{run_dir}/{METRICS}"):
            runner.get(f"{run_dir}/{METRICS}", staging / METRICS)
            metrics = staging / METRICS
        try:
            manifest = json.loads((staging / MANIFEST).read_text())
        except ValueError as exc:
            raise TransferError(f"manifest.json from the run is not JSON: {exc}") from None
        if manifest.get("sha256") != model_sha:
            raise TransferError(
                f"model sha256 {model_sha[:16]}… does not match its manifest ({str(manifest.get('sha256'))[:16]}…)",
                "the export on the host is inconsistent; run the export again",
            )
        size = (staging / MODEL).stat().st_size
        max_out = verify_model(staging / MODEL, manifest)
        # Everything checked: now replace, model first, manifest last (the page reads the manifest first).
        placed_model = dest / f"{job}.onnx"
        placed_manifest = dest / f"{job}.json"
        placed_metrics = dest / f"{job}.metrics.jsonl" if metrics else None
        os.replace(staging / MODEL, placed_model)
        if metrics and placed_metrics:
            os.replace(metrics, placed_metrics)
        os.replace(staging / MANIFEST, placed_manifest)
    return FetchResult(placed_model, placed_manifest, placed_metrics, model_sha, size, max_out)

