"""The suite's own layers (docs/architecture.md, "Tests"): `-m core`, `-m ssh` and `-m e2e` select what
`make test-fast` and a layer's run promise. A marker added after `-m` has selected would select nothing
at all and the fast layer would pass with no test run; this collects two modules the way make does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def _collected(marker: str, *files: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "-m", marker, *(str(TESTS / f) for f in files)],
                          capture_output=True, text=True, cwd=TESTS.parent, timeout=120)
    assert done.returncode in (0, 5), done.stdout + done.stderr
    return {line.split("::", 1)[1] for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.parametrize(("marker", "has", "lacks"), [
    ("core", "test_xfer_hash_prints_sha256", "test_concurrent_transfers_each_take_their_own_helper"),
    ("ssh", "test_concurrent_transfers_each_take_their_own_helper", "test_xfer_hash_prints_sha256"),
    ("e2e", "test_wheel_without_torch_runs_doctor_trains_cartpole_on_a_host", "test_staging_without_onnxruntime"),
])
def test_each_layer_marker_selects_its_tests_and_only_them(marker: str, has: str, lacks: str) -> None:
    # two modules whose collection imports no torch (~0.7 s each, where test_snake_compile's took 6 s)
    got = _collected(marker, "test_ssh_transfer.py", "test_wheel.py")
    assert any(name.startswith(has) for name in got), got
    assert not any(name.startswith(lacks) for name in got), got
