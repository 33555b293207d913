"""run.json's record (agent/protocol.py RunRecord): made by one builder, read by one capped reader
(agent/runjson.py), so a misspelt field is an error where it is written, not a field nobody reads."""

from __future__ import annotations

import json
import os

import pytest

from thrust_remote.agent import runjson
from thrust_remote.agent.protocol import RUN_JSON, RUN_JSON_MAX, RUN_RECORD_FIELDS, RunRecord, run_record


def test_the_builder_merges_in_order_and_refuses_a_field_run_json_does_not_have():
    laptop = {"job": "cartpole", "argv": ["python", "a.py"], "facts": {"python": "3.11"}}
    record = run_record(laptop, {"argv": ["python", "b.py"]}, run_id="r1", pid=7)
    assert record == {"job": "cartpole", "argv": ["python", "b.py"], "facts": {"python": "3.11"}, "run_id": "r1",
                      "pid": 7}
    assert laptop == {"job": "cartpole", "argv": ["python", "a.py"], "facts": {"python": "3.11"}}  # not changed
    with pytest.raises(TypeError, match="not a run.json field: pdi"):
        run_record(laptop, pdi=7)


def test_every_field_is_declared_and_commented_or_grouped():
    """The fields the agent and the laptop use by name are RunRecord's (a field added without its
    declaration is one the builder refuses)."""
    assert {"run_id", "pid", "pid_start", "supervisor_pid", "supervisor_start", "marker", "cwd", "argv",
            "started_at", "started_ts", "queue", "scheduler", "continued_by", "continue_error", "gpus",
            "gpus_used", "tree", "node", "nodes", "watch_peers", "peer_timeout", "idle_stop", "self_retry",
            "resumed_from", "job", "host", "commit", "env", "trial", "slot"} <= RUN_RECORD_FIELDS
    assert set(RunRecord.__annotations__) == RUN_RECORD_FIELDS


def test_the_record_is_written_whole_and_read_back_capped(tmp_path):
    run_dir = str(tmp_path / "run")
    os.makedirs(run_dir)
    runjson.write_record(run_dir, run_record({"job": "j"}, run_id="run", started_ts=1.5))
    assert json.loads((tmp_path / "run" / RUN_JSON).read_text()) == {"job": "j", "run_id": "run", "started_ts": 1.5}
    assert oct(os.stat(tmp_path / "run" / RUN_JSON).st_mode & 0o777) == "0o600"  # it names the env's keys
    assert runjson.read_record(run_dir) == {"job": "j", "run_id": "run", "started_ts": 1.5}
    (tmp_path / "run" / RUN_JSON).write_bytes(b" " * (RUN_JSON_MAX + 1) + b"{}")
    assert runjson.read_record(run_dir) == {}  # past the cap: nothing, never read whole
    with pytest.raises(OSError, match="larger than"):
        runjson.record_for_update(run_dir)  # and never written over as if it were empty
    assert runjson.read_record(str(tmp_path / "absent")) == {}
