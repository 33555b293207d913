"""run.json on the laptop (issue 52, item 2): built with protocol.run_record, so a misspelt field fails
at once, and read through runs/control.py's read_run_json, the laptop's one reader, capped at
RUN_JSON_MAX as the agent's runjson.read_record is (tests/test_hostile_host.py reads one over a real sshd;
this is the local host's runner)."""

from __future__ import annotations

import json

import pytest

from thrust_remote.agent.protocol import RUN_JSON, RUN_JSON_MAX, run_record
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import TransferError
from thrust_remote.host.runner import LocalRunner
from thrust_remote.host.session import HostSession
from thrust_remote.run.sync import SyncResult
from thrust_remote.runs import control


def test_the_local_hosts_run_json_is_read_as_a_record_and_capped(tmp_path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with HostSession.open(LocalRunner(), HostConfig(name="local", workdir=str(tmp_path))) as session:
        assert control.read_run_json(session, str(run_dir)) is None  # absent
        (run_dir / RUN_JSON).write_text("[1, 2]")
        assert control.read_run_json(session, str(run_dir)) is None  # not an object
        (run_dir / RUN_JSON).write_text(json.dumps({"job": "j", "cwd": "/w", "env": {"THRUST_PYTHON": "/p"}}))
        record = control.read_run_json(session, str(run_dir))
        assert record == {"job": "j", "cwd": "/w", "env": {"THRUST_PYTHON": "/p"}}
        (run_dir / RUN_JSON).write_bytes(b" " * RUN_JSON_MAX + b"{}")  # one byte past the cap, valid JSON
        with pytest.raises(TransferError) as info:
            control.read_run_json(session, str(run_dir))
    assert info.value.message == f"{run_dir}/{RUN_JSON} on local is larger than {RUN_JSON_MAX:,} bytes: not read"


def test_the_laptops_parts_of_a_record_are_its_fields_by_name() -> None:
    """What sync records of the code is a record's fields (a submodule's nested the same way), and a
    field RunRecord lacks is refused where it is written, never sent for nobody to read."""
    sub = SyncResult("b" * 40, "fetch", False, None, ())
    synced = SyncResult("a" * 40, "tree", True, "f" * 64, ("new.py",), checkout="c" * 40, shallow=True,
                        lfs=("data.bin",), submodules={"lib": sub}, not_sent=("gone",), tree="/w/trees/r")
    assert synced.as_meta() == {
        "commit": "a" * 40, "sync": "tree", "dirty": True, "patch_sha256": "f" * 64, "untracked": ["new.py"],
        "checkout": "c" * 40, "shallow": True, "lfs": ["data.bin"],
        "submodules": {"lib": {"commit": "b" * 40, "sync": "fetch", "dirty": False, "patch_sha256": None,
                               "untracked": []}},
        "submodules_not_sent": ["gone"], "tree": "/w/trees/r"}
    assert list(synced.as_meta()) == ["commit", "sync", "dirty", "patch_sha256", "untracked", "checkout", "shallow",
                                      "lfs", "submodules", "submodules_not_sent", "tree"]  # run.json's order, as before
    with pytest.raises(TypeError, match="not a run.json field: comit"):
        run_record(comit="a" * 40)
