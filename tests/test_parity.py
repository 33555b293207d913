"""The JS Snake engine agrees with trainer/envs/snake.py: the fixture is current, and Node replays it."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "data" / "snake_parity.json"


def test_fixture_matches_the_current_python_env(tmp_path: Path) -> None:
    """Regenerating the fixture from trainer/envs/snake.py gives the committed file: if this fails, the
    env changed; run tools/make_parity_fixture.py and make web/src/snake.js agree again."""
    out = tmp_path / "fresh.json"
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "make_parity_fixture.py"), "--out", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert json.loads(out.read_text()) == json.loads(FIXTURE.read_text())


def test_fixture_covers_the_rules() -> None:
    fixture = json.loads(FIXTURE.read_text())
    steps = [s for sc in fixture["scenarios"] for s in sc["steps"]]
    assert any(s["reward"] == 1 and not s["terminated"] for s in steps), "eating"
    assert any(s["reward"] == -1 and s["terminated"] for s in steps), "death"
    assert any(s["truncated"] for s in steps), "truncation"
    assert any(s["reward"] == 1 and s["terminated"] for s in steps), "win"
    assert {sc["action_mode"] for sc in fixture["scenarios"]} == {"relative", "absolute"}
    assert {sc["grid_size"] for sc in fixture["scenarios"]} >= {4, 8, 10}
    assert {sc["space"] for sc in fixture["scenarios"]} == {False, True}, "with and without the space features"


def test_js_engine_replays_the_fixture_in_node() -> None:
    """`node --test tests/js/`: web/src/snake.js against the fixture and the rules."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (Node 20+ runs tests/js/)")
    result = subprocess.run(
        [node, "--test", "tests/js/"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_python_env_module_is_importable() -> None:
    assert importlib.util.find_spec("trainer.envs.snake") is not None
