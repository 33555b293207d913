"""Export a policy to ONNX for the browser, check it, and describe it in manifest.json.

The model file is one self-contained `.onnx` (`external_data=False`: the browser loads one file), opset
18, input `obs` float32 `[batch, obs_dim]`, outputs `logits` `[batch, n_actions]` and `value`
`[batch, 1]`, with a dynamic batch dimension. After writing, `onnx.checker` validates it and
onnxruntime must reproduce torch's outputs, on real observations from the env and on random inputs,
within 1e-5 (max abs diff) plus float32 rounding of their magnitude (see `parity_ok`), else
`ExportError`. The measured differences are recorded in the manifest (`max_abs_diff`).

The TorchScript exporter writes it (~0.1 s); the dynamo exporter (1.3-4.5 s) where that one fails or
is gone, and the model kept is one that passed the checks (`_export_checked`).

`manifest.json` is written beside the model (same directory): sha256, bytes, opset, inputs/outputs
(name, shape, dtype), env (a built-in name or a gymnasium id), playable (whether the web page can play
it: snake only), grid_size, action_mode, (gymnasium ids) gymnasium_version, obs_dim, n_actions, policy,
steps, final_return, held_out (when the run chose its policy on held-out games: that policy's score),
max_abs_diff, exporter (`torchscript` or `dynamo`), commit (THRUST_COMMIT, else `git rev-parse HEAD`
when in a git checkout, else null), created_at.

CLI: `python -m trainer.export --checkpoint CKPT_OR_RUN_DIR --out model.onnx`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.envs.registry import close_env, get_spec

OPSET = 18
TOLERANCE = 1e-5


class ExportError(RuntimeError):
    """The exported model is invalid or does not match the torch policy."""


def git_commit() -> str | None:
    if os.environ.get("THRUST_COMMIT"):
        return os.environ["THRUST_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sample_observations(env_name: str, **settings: Any) -> torch.Tensor:
    """Observations the policy really sees: from the env, under random actions."""
    env = get_spec(env_name).make(32, **settings)
    gen = torch.Generator().manual_seed(0)
    seen = [env.reset(seed=0).clone()]
    for _ in range(8):
        obs, *_ = env.step(torch.randint(0, env.n_actions, (32,), generator=gen))
        seen.append(obs.clone())
    close_env(env)
    return torch.cat(seen)


def check_parity(
    path: Path, model: nn.Module, obs_dim: int, observations: torch.Tensor | None = None
) -> dict[str, float]:
    """Validate the file; max |onnxruntime - torch| per output and each output's max magnitude.

    Inputs: `observations` (real ones, if given) plus uniform random batches of sizes 1, 7 and 64.
    """
    import onnx
    import onnxruntime as ort

    onnx.checker.check_model(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(0)
    batches = [torch.rand(b, obs_dim, generator=gen) for b in (1, 7, 64)]
    if observations is not None:
        batches.append(observations)
    out = {"logits": 0.0, "value": 0.0, "logits_scale": 0.0, "value_scale": 0.0}
    for obs in batches:
        with torch.no_grad():
            ref = dict(zip(("logits", "value"), model(obs), strict=True))
        got = dict(zip(("logits", "value"), session.run(["logits", "value"], {"obs": obs.numpy()}), strict=True))
        for name in ("logits", "value"):
            if got[name].shape != tuple(ref[name].shape):
                raise ExportError(f"onnx {name} shape {got[name].shape} differs from torch {tuple(ref[name].shape)}")
            out[name] = max(out[name], float((torch.from_numpy(got[name]) - ref[name]).abs().max()))
            out[f"{name}_scale"] = max(out[f"{name}_scale"], float(ref[name].abs().max()))
    return out


def parity_ok(diff: dict[str, float]) -> bool:
    """Each output within 1e-5 absolute, plus float32 rounding of its magnitude (2e-6 relative).

    The slack is needed: onnxruntime and torch sum the 300-odd products of a layer in different
    orders, and a trained snake policy's logits reach tens, where one float32 ulp is ~4e-6; an exported
    snake model was measured 5.3e-5 off on logits of magnitude ~50 (about 12 ulps).
    """
    return all(diff[k] <= TOLERANCE + 2e-6 * diff[f"{k}_scale"] for k in ("logits", "value"))


def _torch_export(model: nn.Module, example: torch.Tensor, path: Path, *, dynamo: bool) -> None:
    """One `torch.onnx.export` of `model` to `path`: input `obs`, outputs `logits` and `value`, the batch
    dimension dynamic, one self-contained file."""
    names = {"input_names": ["obs"], "output_names": ["logits", "value"], "opset_version": OPSET}
    # The exporter reports progress on stdout; keep stdout for the trainer's machine-readable lines.
    # Its registry also logs a warning per torchvision op it cannot find, and the pytree code and the
    # TorchScript exporter a FutureWarning or DeprecationWarning, on every export: noise in the user's
    # run log, not news about their model.
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        if dynamo:
            torch.onnx.export(model, (example,), str(path), **names, dynamo=True, external_data=False,
                              dynamic_shapes={"obs": {0: torch.export.Dim("batch")}})
        else:
            batch = {0: "batch"}
            torch.onnx.export(model, (example,), str(path), **names, dynamo=False,
                              dynamic_axes={"obs": batch, "logits": batch, "value": batch})


def _export_checked(model: nn.Module, example: torch.Tensor, path: Path, obs_dim: int,
                    observations: torch.Tensor | None) -> tuple[str, dict[str, float]]:
    """Export `model` to `path` and check it (onnx.checker, onnxruntime against torch); (the exporter
    used, the measured differences).

    The TorchScript exporter goes first: it takes ~0.1 s here, where the dynamo exporter takes 1.3 s
    warm and up to 4.5 s cold (onnxscript's imports and torch.export's trace), at the end of every run.
    The dynamo exporter is the way back wherever that one fails, is missing (a future torch), or gives a
    model that does not match: either way the model that is kept has passed the same checks."""
    failures = []
    for name, dynamo in (("torchscript", False), ("dynamo", True)):
        try:
            _torch_export(model, example, path, dynamo=dynamo)
            diff = check_parity(path, model, obs_dim, observations)
        except Exception as exc:  # an exporter that cannot: the next one is tried, the reason kept
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if parity_ok(diff):
            return name, diff
        failures.append(f"{name}: onnxruntime differs from torch: {diff} (tolerance {TOLERANCE})")
    raise ExportError("; ".join(failures))


def export_onnx(
    policy: nn.Module,
    out: str | os.PathLike[str],
    *,
    env_name: str,
    policy_kind: str = "mlp",
    steps: int = 0,
    final_return: float | None = None,
    held_out: dict[str, Any] | None = None,
    **settings: Any,
) -> Path:
    """Write `out` (.onnx) and `manifest.json` beside it; returns the model path.

    `settings`: the env's (its spec's `settings`, e.g. `grid_size=6, action_mode="relative"`)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    spec = get_spec(env_name)
    params = spec.params(settings)
    obs_dim, n_actions = spec.obs_dim(params), spec.n_actions(params)
    model = copy.deepcopy(policy).to("cpu").eval()
    example = torch.zeros(2, obs_dim)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    observations = sample_observations(env_name, **spec.settings_of(params))
    try:
        exporter, diff = _export_checked(model, example, tmp, obs_dim, observations)
        os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    manifest: dict[str, Any] = {
        "file": out.name,
        "sha256": _sha256(out),
        "bytes": out.stat().st_size,
        "opset": OPSET,
        "inputs": [{"name": "obs", "shape": ["batch", obs_dim], "dtype": "float32"}],
        "outputs": [
            {"name": "logits", "shape": ["batch", n_actions], "dtype": "float32"},
            {"name": "value", "shape": ["batch", 1], "dtype": "float32"},
        ],
        "env": env_name,
        "playable": spec.playable,
        **spec.manifest_fields(params),
        "obs_dim": obs_dim,
        "n_actions": n_actions,
        "policy": policy_kind,
        # informational: the mask is in the graph (trainer/policy.py mask_deadly), so the page needs nothing
        "mask": getattr(policy, "mask_at", None) is not None,
        "steps": steps,
        "final_return": final_return,
        # --candidates / --snapshots: the exported policy's own greedy score on the held-out games (the
        # metrics' last score is a training run's, possibly of another policy)
        **({"held_out": held_out} if held_out is not None else {}),
        "max_abs_diff": {"logits": diff["logits"], "value": diff["value"]},
        "exporter": exporter,
        "commit": git_commit(),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_atomic(out.with_name("manifest.json"), (json.dumps(manifest, indent=2) + "\n").encode())
    return out


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint file, or the latest checkpoint of a run directory."""
    from trainer.checkpoint import load_latest

    p = Path(path)
    if p.is_dir():
        loaded = load_latest(p / "checkpoints" if (p / "checkpoints").is_dir() else p)
        if loaded is None:
            raise FileNotFoundError(f"no checkpoint under {p}")
        return loaded[0]
    return torch.load(p, map_location="cpu", weights_only=True)


def policy_from_checkpoint(state: dict[str, Any]) -> nn.Module:
    from trainer.policy import build_policy, load_weights

    cfg = state["config"]
    spec = get_spec(cfg["env"])
    params = spec.params(cfg)
    policy = build_policy(
        cfg["policy"],
        spec.obs_dim(params),
        spec.n_actions(params),
        cfg["hidden"],
        grid_size=spec.cnn_grid(params),
        activation=cfg.get("activation", "tanh"),
        mask_at=spec.mask_at(params) if cfg.get("mask") else None,
    )
    load_weights(policy, state["model"], f"{cfg['env']}'s observation of {spec.obs_dim(params)} values")
    return policy.eval()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.export", description="checkpoint -> ONNX + manifest")
    p.add_argument("--checkpoint", required=True, help="a ckpt-*.pt file or a run directory")
    p.add_argument("--out", required=True, help="where to write the .onnx (manifest.json goes beside it)")
    args = p.parse_args(argv)
    try:
        state = load_checkpoint(args.checkpoint)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cfg = state["config"]
    spec = get_spec(cfg["env"])
    out = export_onnx(
        policy_from_checkpoint(state),
        args.out,
        env_name=spec.name,
        policy_kind=cfg["policy"],
        steps=int(state["step"]),
        **spec.settings_of(spec.params(cfg)),
    )
    print(json.dumps({"model": str(out), "manifest": str(out.with_name("manifest.json"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
