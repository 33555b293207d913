"""Small real ONNX policies for tests, built with onnx.helper in milliseconds (a torch export takes
seconds): input `obs` [batch, obs_dim], outputs `logits` [batch, n_actions] and `value` [batch, 1],
with a manifest.json as trainer/export.py writes it. onnx.checker, onnxruntime and the page accept them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


def tiny_policy(path: Path, *, seed: int, env: str = "snake", grid_size: int = 6, steps: int = 1000,
                final_return: float | None = None, manifest_name: str = "manifest.json",
                obs_dim: int | None = None) -> dict:
    """Write a linear policy to `path` and its manifest beside it (`manifest_name`); returns the manifest.
    `obs_dim`: the input width when it is not the env's (a model of another observation)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    width, n_actions = (3 * grid_size * grid_size + 8, 3) if env == "snake" else (4, 2)
    obs_dim = obs_dim or width
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.standard_normal((obs_dim, n_actions)).astype(np.float32), "w")
    value_w = numpy_helper.from_array(rng.standard_normal((obs_dim, 1)).astype(np.float32), "v")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w"], ["logits"]), helper.make_node("MatMul", ["obs", "v"], ["value"])],
        "tiny",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", obs_dim])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_actions]),
         helper.make_tensor_value_info("value", TensorProto.FLOAT, ["batch", 1])],
        initializer=[weights, value_w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = model.SerializeToString()
    path.write_bytes(data)
    manifest = {
        "file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "opset": 18,
        "inputs": [{"name": "obs", "shape": ["batch", obs_dim], "dtype": "float32"}],
        "outputs": [{"name": "logits", "shape": ["batch", n_actions], "dtype": "float32"},
                    {"name": "value", "shape": ["batch", 1], "dtype": "float32"}],
        "env": env, "grid_size": grid_size if env == "snake" else None,
        "action_mode": "relative" if env == "snake" else None, "obs_dim": obs_dim, "n_actions": n_actions,
        "policy": "mlp", "steps": steps, "final_return": final_return,
    }
    (path.parent / manifest_name).write_text(json.dumps(manifest, indent=2))
    return manifest


def metrics_lines(*, score: float, env: str = "snake", steps: int = 1000) -> str:
    """metrics.jsonl as the trainer writes it: snake reports `score_mean` (apples), cartpole only returns."""
    rows = []
    for i in range(1, 4):
        row = {"step": steps * i // 3, "return_mean": score * i / 3 - 1}
        if env == "snake":
            row["score_mean"] = score * i / 3
        rows.append(json.dumps(row))
    return "\n".join(rows) + "\n"
