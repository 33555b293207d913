"""The launch path resolves a train request once (issue 52, "the launch path bounces"): its arguments
(run/arguments.py `resolve`), and the preflight reads exactly the words the job is given, no other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from thrust_remote.core.config import parse_config_text
from thrust_remote.run import arguments, lifecycle, stages
from thrust_remote.run.preflight import asks_for_cuda
from thrust_remote.run.vocab import NullReporter, TrainRequest

CONFIG = """jobs:
  t:
    kind: trainer
    args: {device: cuda}
"""


class _Stop(Exception):
    pass


def test_a_set_that_overrides_the_jobs_device_is_what_the_preflight_reads(tmp_path: Path, monkeypatch) -> None:
    """`--set device=cpu` over a job's `args: {device: cuda}`: the job is given `--device cpu`, and the
    preflight reads those words only (it read the job's own `--device cuda` too, and refused the run on a
    host without CUDA although the run would not have used it)."""
    config = parse_config_text(CONFIG, tmp_path / "thrust.yaml")
    request = TrainRequest(job=config.job("t"), host=config.host("local"), sets=["device=cpu"])
    assert arguments.resolve(request).words == ("--device", "cpu")
    seen: dict[str, Any] = {}

    def check(*_a: object, **kw: Any) -> None:
        seen.update(kw)
        raise _Stop

    monkeypatch.setattr(stages, "check", check)  # the first stage that would reach the host
    session = type("S", (), {"name": "local", "host": config.host("local")})()
    with pytest.raises(_Stop):
        lifecycle.start(config, request, [session], NullReporter())  # type: ignore[list-item]
    assert list(seen["args"]) == ["--device", "cpu"]
    assert not asks_for_cuda("trainer", seen["args"])
