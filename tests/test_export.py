"""ONNX export: one file, dynamic batch, onnxruntime matches torch, manifest fields."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch
from tiny_onnx import tiny_policy

from trainer.eval import evaluate, onnx_actor, random_actor, torch_actor
from trainer.export import check_parity, export_onnx
from trainer.policy import CNNPolicy, MLPPolicy

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_snake_policy_export_matches_torch_and_writes_the_manifest(tmp_path: Path, kind: str) -> None:
    torch.manual_seed(0)
    g = 6
    policy = MLPPolicy(3 * g * g + 8, 3, hidden=32) if kind == "mlp" else CNNPolicy(g, 3, hidden=32, channels=8)
    out = export_onnx(
        policy,
        tmp_path / "snake.onnx",
        env_name="snake",
        grid_size=g,
        action_mode="relative",
        policy_kind=kind,
        steps=1234,
        final_return=2.5,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "snake.onnx"], "one model file"
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    assert model.opset_import[0].version >= 17
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert inp.name == "obs"
    assert inp.type == "tensor(float)"
    assert isinstance(inp.shape[0], str)  # dynamic batch
    assert inp.shape[1] == 3 * g * g + 8
    assert [o.name for o in session.get_outputs()] == ["logits", "value"]
    for batch in (1, 5, 300):
        obs = torch.rand(batch, 3 * g * g + 8)
        logits, value = session.run(None, {"obs": obs.numpy()})
        with torch.no_grad():
            ref_logits, ref_value = policy(obs)
        assert logits.shape == (batch, 3)
        assert value.shape == (batch, 1)
        assert float((torch.from_numpy(logits) - ref_logits).abs().max()) <= 1e-5
        assert float((torch.from_numpy(value) - ref_value).abs().max()) <= 1e-5

    m = json.loads((tmp_path / "manifest.json").read_text())
    data = out.read_bytes()
    assert m["sha256"] == hashlib.sha256(data).hexdigest()
    assert m["bytes"] == len(data)
    assert m["opset"] >= 17
    assert m["inputs"] == [{"name": "obs", "shape": ["batch", 3 * g * g + 8], "dtype": "float32"}]
    assert [o["name"] for o in m["outputs"]] == ["logits", "value"]
    assert m["outputs"][0]["shape"] == ["batch", 3]
    assert m["outputs"][1]["shape"] == ["batch", 1]
    assert (m["env"], m["grid_size"], m["action_mode"], m["policy"]) == ("snake", g, "relative", kind)
    assert (m["obs_dim"], m["n_actions"], m["steps"], m["final_return"]) == (3 * g * g + 8, 3, 1234, 2.5)
    assert "commit" in m
    assert m["exporter"] == "torchscript"  # the fast one (~0.1 s), where it works


def test_cartpole_export_commit_from_env_and_eval_of_the_onnx_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THRUST_COMMIT", "abc123")
    torch.manual_seed(1)
    policy = MLPPolicy(4, 2)
    out = export_onnx(policy, tmp_path / "model.onnx", env_name="cartpole", policy_kind="mlp")
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["commit"] == "abc123"
    assert m["grid_size"] is None
    assert check_parity(out, policy, 4)["logits"] <= 1e-5
    # The ONNX model and the torch policy act the same on the same episodes.
    a = evaluate(onnx_actor(out), "cartpole", episodes=10, seed=3)
    b = evaluate(torch_actor(policy), "cartpole", episodes=10, seed=3)
    assert a["mean"] == b["mean"]


def test_an_evaluation_says_how_far_its_mean_may_move() -> None:
    # Random CartPole episodes differ in length: the mean comes with its standard error, std / sqrt(N).
    scored = evaluate(random_actor(2, seed=0), "cartpole", episodes=64, seed=0)
    assert scored["std"] > 0
    assert scored["sem"] == pytest.approx(scored["std"] / 8)
    assert evaluate(random_actor(2, seed=0), "cartpole", episodes=1, seed=0)["sem"] == 0.0  # nothing to measure


@pytest.mark.e2e  # the dynamo exporter traces the policy (~5 s): the slow path, kept out of the 2-minute loop
def test_an_exporter_that_fails_or_mismatches_falls_back_to_dynamo_and_the_model_still_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The TorchScript exporter gone (a later torch) or writing a model that onnxruntime disagrees with:
    the dynamo exporter writes it, and the model kept has passed the same checks. Both failing is an
    ExportError naming each, and no model is left."""
    import trainer.export as export

    real = export._torch_export
    policy = MLPPolicy(4, 2)

    def without_torchscript(model, example, path, *, dynamo):  # noqa: ANN001, ANN202
        if not dynamo:
            raise RuntimeError("the TorchScript exporter was removed")
        real(model, example, path, dynamo=dynamo)

    monkeypatch.setattr(export, "_torch_export", without_torchscript)
    out = export_onnx(policy, tmp_path / "a" / "model.onnx", env_name="cartpole")
    assert json.loads((out.parent / "manifest.json").read_text())["exporter"] == "dynamo"
    assert check_parity(out, policy, 4)["logits"] <= 1e-5

    def garbled(model, example, path, *, dynamo):  # noqa: ANN001, ANN202 - a model of other weights
        real(MLPPolicy(4, 2), example, path, dynamo=dynamo)

    monkeypatch.setattr(export, "_torch_export", garbled)
    with pytest.raises(export.ExportError, match="torchscript: onnxruntime differs.*dynamo: onnxruntime differs"):
        export_onnx(policy, tmp_path / "b" / "model.onnx", env_name="cartpole")
    assert not list((tmp_path / "b").iterdir())


def test_eval_of_a_model_of_another_observation_says_so(tmp_path: Path) -> None:
    model = tmp_path / "other.onnx"
    tiny_policy(model, seed=0, grid_size=6, obs_dim=3 * 36 + 11)  # a space model's width, a plain manifest
    run = subprocess.run([sys.executable, "-m", "trainer.eval", str(model), "--episodes", "2"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "takes 119 inputs, but snake's observation here has 116" in run.stderr
    assert "Traceback" not in run.stderr
