"""The page in real Chromium: a model plays, inference matches onnxruntime, parity with the Python
env, and the errors a user can cause (corrupt manifest, wrong input shape, no model) are visible."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import CHROMIUM, REPO, export_policy

from thrust_remote.play.serve import HEADLESS_CHROMIUM_ARGS as CHROMIUM_ARGS
from thrust_remote.play.serve import PlayServer, Site, default_web_dir

FIXTURE = REPO / "tests" / "data" / "snake_parity.json"
ARTIFACTS = REPO / "test-artifacts"


# ---- models ----------------------------------------------------------------------------------------


def edit_manifest(manifest: Path, **changes: Any) -> None:
    data = json.loads(manifest.read_text())
    data.update(changes)
    manifest.write_text(json.dumps(data, indent=2))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """web/public stand-in: a good model, a corrupt manifest, a wrong input shape."""
    public = tmp_path_factory.mktemp("public")
    export_policy(public / "tiny.onnx")
    export_policy(public / "tinycnn.onnx", kind="cnn")
    export_policy(public / "tinyspace.onnx", space=True)  # reads the space features
    export_policy(public / "tinymask.onnx", mask=True)  # masks deadly moves (--mask 1), in the graph
    lines = [json.dumps({"step": s * 1000, "return_mean": -1 + s * 0.1}) for s in range(30)]
    (public / "tiny.metrics.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copy(public / "tiny.onnx", public / "corrupt.onnx")
    shutil.copy(public / "tiny.json", public / "corrupt.json")
    edit_manifest(public / "corrupt.json", sha256="0" * 64)
    manifest = export_policy(public / "wrongshape.onnx", grid_size=8)  # an 8x8 model ...
    edit_manifest(manifest, grid_size=10, obs_dim=308, inputs=[{"name": "obs", "shape": ["batch", 308]}])
    return public


@pytest.fixture(scope="module")
def server(models: Path) -> Iterator[PlayServer]:
    web = default_web_dir()
    if not (web / "node_modules" / "onnxruntime-web" / "dist").is_dir():
        pytest.fail("web/node_modules is missing: run `make web-deps` (cd web && npm ci)")
    with PlayServer(Site(web_dir=web, public_dir=models), port=0) as srv:
        yield srv


# ---- the browser -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.skip("chromium is not installed (/usr/bin/chromium): `apt-get install -y chromium`, or `make test`")
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 960, "height": 760},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    try:
        yield page
    finally:
        page.close()


def open_page(page: Any, server: PlayServer, query: str) -> None:
    page.goto(server.url + query)
    page.wait_for_function("window.thrust !== undefined")
    page.evaluate("window.thrust.ready")


# one worker runs this module's tests, in order: one Chromium for the module's tests
pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.xdist_group("test_web_browser")]  # headless Chromium


def test_page_plays_200_moves_with_the_model(page: Any, server: PlayServer) -> None:
    open_page(page, server, "?model=tiny&speed=max&seed=3")
    assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
    assert page.evaluate("crossOriginIsolated") is True
    page.wait_for_function("window.thrust.state.moves >= 200", timeout=30_000)
    page.wait_for_function("Number(document.querySelector('#moves').textContent) >= 200")
    score = page.locator("#score").text_content()
    assert score is not None
    assert score.isdigit()
    assert page.locator("#infer-ms").text_content().endswith(" ms")
    assert page.locator("#length").text_content().isdigit()
    assert page.locator("#model-select option").all_text_contents()[0].startswith("corrupt")
    assert page.evaluate("window.thrust.state.game.obsDim") == 308
    page.wait_for_function("document.querySelector('#fps').textContent !== '–'")  # a 1 s window passed
    assert float(page.locator("#fps").text_content()) > 0
    assert float(page.locator("#mps").text_content()) > 0
    curve_pixels = page.evaluate(
        """() => {
            const c = document.querySelector('#curve');
            const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
            let n = 0;
            for (let i = 0; i < d.length; i += 4) if (d[i + 1] > 120 && d[i] < 100 && d[i + 2] < 120) n++;
            return n;
        }"""
    )
    assert curve_pixels > 100, "the learning curve from tiny.metrics.jsonl was not drawn"
    assert page.js_errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_play.png"))


def test_a_model_of_the_space_features_plays_and_the_page_computes_them(page: Any, server: PlayServer) -> None:
    open_page(page, server, "?model=tinyspace&speed=max&seed=3")
    assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
    page.wait_for_function("window.thrust.state.moves >= 50", timeout=30_000)
    assert page.evaluate("window.thrust.state.game.obsDim") == 311
    tail = page.evaluate("Array.from(window.thrust.state.game.observation().slice(308))")
    assert len(tail) == 3 and all(0 <= v <= 1 for v in tail) and max(tail) > 0
    assert page.js_errors == []


@pytest.mark.parametrize("name", ["tiny", "tinycnn"])
def test_inference_matches_python_onnxruntime(page: Any, server: PlayServer, models: Path, name: str) -> None:
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    obs = rng.random((5, 308), dtype=np.float32)
    obs[0] = 0.0
    fixture = json.loads(FIXTURE.read_text())
    for k, step in enumerate(fixture["scenarios"][0]["steps"][:4]):  # real observations too
        obs[k + 1] = 0.0
        for i, v in step["obs"]:
            obs[k + 1, int(i)] = v
    session = ort.InferenceSession(str(models / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    want_logits, want_value = session.run(["logits", "value"], {"obs": obs})

    open_page(page, server, f"?model={name}&speed=1")
    assert page.evaluate("window.thrust.state.policy.manifest.policy") == ("cnn" if name == "tinycnn" else "mlp")
    got = page.evaluate(
        """async (flat) => {
            const out = await window.thrust.state.policy.run(Float32Array.from(flat), 5);
            return {logits: Array.from(out.logits), value: Array.from(out.value)};
        }""",
        obs.reshape(-1).tolist(),
    )
    np.testing.assert_allclose(np.array(got["logits"]).reshape(5, 3), want_logits, rtol=0, atol=1e-5)
    np.testing.assert_allclose(np.array(got["value"]).reshape(5, 1), want_value, rtol=0, atol=1e-5)
    # The move the page makes is the argmax of those logits.
    for row in range(5):
        action = page.evaluate(
            "async (flat) => window.thrust.state.policy.act(Float32Array.from(flat))", obs[row].tolist()
        )
        assert action == int(np.argmax(want_logits[row]))


def test_a_masked_model_plays_the_moves_torch_picks_and_none_deadly_while_one_is_open(
    page: Any, server: PlayServer, models: Path
) -> None:
    import torch

    from trainer.envs.snake import danger_at, obs_size
    from trainer.policy import build_policy

    open_page(page, server, "?model=tinymask&speed=1")
    assert page.evaluate("window.thrust.state.policy.manifest.mask") is True
    # The page's engine and model play 300 moves of their own games (seeded apples); every observation
    # and the move the page chose come back.
    played = page.evaluate(
        """async () => {
            const { SnakeGame, mulberry32, uniformApples } = await import("./src/snake.js");
            const policy = window.thrust.state.policy;
            const game = new SnakeGame({ gridSize: 10, appleSource: uniformApples(mulberry32(7)) });
            const out = [];
            for (let i = 0; i < 300; i++) {
                if (game.done) game.reset();
                const obs = game.observation();
                out.push({ obs: Array.from(obs), action: await policy.act(obs) });
                game.step(out[out.length - 1].action);
            }
            return out;
        }"""
    )
    obs = torch.tensor([p["obs"] for p in played], dtype=torch.float32)
    actions = torch.tensor([p["action"] for p in played])
    # trainer.eval's greedy move for the same weights: the torch policy, masked and not
    torch.manual_seed(0)
    at = danger_at(10)
    masked = build_policy("mlp", obs_size(10), 3, 32, grid_size=10, mask_at=at)
    with torch.no_grad():
        masked.actor[-1].bias.copy_(torch.tensor([5.0, 0.0, 0.0]))
    assert torch.equal(actions, masked.logits(obs).argmax(dim=1))
    danger = obs[:, at : at + 3]
    open_move = danger.sum(dim=1) < 3
    assert not bool((danger.gather(1, actions[:, None])[:, 0] > 0)[open_move].any())
    unmasked = build_policy("mlp", obs_size(10), 3, 32, grid_size=10)
    unmasked.load_state_dict(masked.state_dict())
    raw = unmasked.logits(obs).argmax(dim=1)
    assert bool((danger.gather(1, raw[:, None])[:, 0] > 0)[open_move].any())  # the mask had work to do


def test_parity_fixture_replays_identically_in_chromium(page: Any, server: PlayServer) -> None:
    fixture = json.loads(FIXTURE.read_text())
    open_page(page, server, "?model=tiny&speed=1")
    result = page.evaluate(
        """async (fixture) => {
            const parity = await import("./src/parity.js");
            return parity.replayFixture(fixture);
        }""",
        fixture,
    )
    assert result["problems"] == []
    assert result["steps"] == sum(len(s["steps"]) for s in fixture["scenarios"])


def test_corrupt_manifest_shows_an_error(page: Any, server: PlayServer) -> None:
    open_page(page, server, "?model=corrupt")
    error = page.locator("#error")
    assert error.is_visible()
    assert "sha256 mismatch" in error.text_content()
    assert page.locator("#status").text_content() == "error"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web_corrupt_manifest.png"))


def test_wrong_input_shape_shows_an_error(page: Any, server: PlayServer) -> None:
    open_page(page, server, "?model=wrongshape")
    error = page.locator("#error")
    assert error.is_visible()
    text = error.text_content()
    assert "[batch, 308]" in text
    assert "200" in text  # the model's 8x8 input size


def test_switching_models_in_the_picker_recovers_from_an_error(page: Any, server: PlayServer) -> None:
    open_page(page, server, "?model=corrupt&speed=max")
    assert page.locator("#error").is_visible()
    page.select_option("#model-select", "tiny")
    page.wait_for_function("window.thrust.state.policy !== null && window.thrust.state.moves >= 20")
    assert page.locator("#error").is_hidden()


def test_human_mode_follows_the_keyboard(page: Any, server: PlayServer) -> None:
    open_page(page, server, "?model=tiny&mode=human&speed=30")
    assert page.evaluate("window.thrust.state.human") is True
    page.keyboard.press("ArrowUp")
    page.wait_for_function("window.thrust.state.moves >= 1")
    assert page.evaluate("window.thrust.state.game.dir") == 0  # up


def test_page_opens_on_a_snake_model_and_marks_others(page: Any, tmp_path: Path, models: Path) -> None:
    for suffix in (".onnx", ".json"):
        shutil.copy(models / f"tiny{suffix}", tmp_path / f"snake{suffix}")
        shutil.copy(models / f"tiny{suffix}", tmp_path / f"cartpole{suffix}")
    edit_manifest(tmp_path / "cartpole.json", env="cartpole", grid_size=None)
    with PlayServer(Site(web_dir=default_web_dir(), public_dir=tmp_path), port=0) as srv:
        open_page(page, srv, "")
        assert page.locator("#model-select").input_value() == "snake"
        assert page.locator("#error").is_hidden()
        assert "not playable" in page.locator("#model-select option").first.text_content()
        page.select_option("#model-select", "cartpole")
        page.wait_for_selector("#error:not([hidden])")
        assert "plays snake only" in page.locator("#error").text_content()


def test_page_without_models_says_how_to_make_one(page: Any, tmp_path: Path) -> None:
    with PlayServer(Site(web_dir=default_web_dir(), public_dir=tmp_path), port=0) as srv:
        open_page(page, srv, "")
        assert "thrust-remote train snake" in page.locator("#error").text_content()


def keep(project: Path, models: Path, run_id: str, *, fetched_at: str, env: str = "snake", **info: Any) -> None:
    """A kept model (.thrust/fetched/<run-id>/) made of the tiny test model, with its fetch.json."""
    run = project / ".thrust" / "fetched" / run_id
    run.mkdir(parents=True)
    shutil.copy(models / "tiny.onnx", run / "model.onnx")
    shutil.copy(models / "tiny.json", run / "manifest.json")
    if env != "snake":
        edit_manifest(run / "manifest.json", env=env, grid_size=None)
    sha = json.loads((run / "manifest.json").read_text())["sha256"]
    (run / "fetch.json").write_text(json.dumps({"run_id": run_id, "host": "gpu", "job": env, "fetched_at": fetched_at,
                                                "sha256": sha, **info}))


def test_picker_lists_kept_models_newest_first_with_steps_and_score(page: Any, tmp_path: Path, models: Path) -> None:
    public = tmp_path / "web" / "public"
    public.mkdir(parents=True)
    export_policy(public / "snake.onnx", seed=5)  # the placed model: not one of the kept ones
    keep(tmp_path, models, "snake-old", fetched_at="2026-11-23T10:00:00.000+00:00", state="FINISHED",
         steps=8_000_000, score=61.2, score_kind="apples")
    keep(tmp_path, models, "snake-new", fetched_at="2026-11-23T12:00:00.000+00:00", state="STOPPED",
         steps=300_000, score=2, score_kind="apples")
    keep(tmp_path, models, "cartpole-x", fetched_at="2026-11-23T11:00:00.000+00:00", env="cartpole",
         state="FINISHED", steps=6000, score=500, score_kind="eval return")
    site = Site(web_dir=default_web_dir(), public_dir=public, project_root=tmp_path)
    with PlayServer(site, port=0) as srv:
        open_page(page, srv, "?speed=max")
        groups = page.locator("#model-select optgroup").evaluate_all(
            "gs => gs.map((g) => [g.label, Array.from(g.children, (o) => o.textContent)])")
        assert [label for label, _ in groups] == ["placed in web/public", "kept runs, newest first"]
        assert groups[1][1] == [
            "snake-new · STOPPED · 300,000 steps · 2.00 apples",
            "cartpole-x · FINISHED · 6,000 steps · 500.00 eval return (cartpole: not playable here)",
            "snake-old · FINISHED · 8,000,000 steps · 61.20 apples",
        ]
        assert page.locator("#model-select").input_value() == "snake"  # the placed model opens first
        note = page.locator("#models-note")
        assert note.is_visible() and "cartpole-x (cartpole)" in note.text_content()
        assert "plays snake only" in note.text_content()
        page.select_option("#model-select", "snake-old")
        page.wait_for_function("window.thrust.state.entry?.name === 'snake-old' && window.thrust.state.policy !== null "
                               "&& window.thrust.state.moves >= 20")
        assert page.locator("#error").is_hidden()
        panel = page.locator("#manifest").text_content()
        assert "snake-old" in panel and "61.20 apples" in panel and "FINISHED" in panel
        assert page.js_errors == []
