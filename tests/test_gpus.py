"""The one GPU inventory (thrust_remote/run/gpus.py): `train --gpus` selection and optimize's slots, both
on real nvidia-smi captures. select_gpus keeps the behaviour and messages of pipeline.select_gpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from envcheck.nvsmi import summarize
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import UsageError
from thrust_remote.optimize import Slot, SlotPool, plan_slots
from thrust_remote.run import gpus

DATA = Path(__file__).parent / "data" / "nvidia_smi"
HOST = HostConfig(name="gpu", address="gpu-box", python="python3")


def facts(name: str) -> dict:
    listing = DATA / f"{name}.list"
    smi = summarize((DATA / f"{name}.csv").read_text(), 0, listing.read_text() if listing.exists() else "")
    return {"nvidia_smi": smi}


def test_host_gpus_lists_the_indices_narrowed_to_the_configured_subset():
    assert gpus.host_gpus(facts("a100_four_gpus"), HOST) == [0, 1, 2, 3]
    assert gpus.host_gpus(facts("a100_four_gpus"), HostConfig(name="gpu", address="x", gpus=(1, 3))) == [1, 3]
    assert gpus.host_gpus({}, HOST) == []


def test_select_gpus_count_picks_the_least_busy():
    assert gpus.select_gpus("2", facts("a100_four_gpus"), HOST) == [0, 2]
    assert gpus.select_gpus("3", facts("a100_four_gpus"), HOST) == [0, 2, 3]


def test_select_gpus_list_is_checked_against_the_host():
    assert gpus.select_gpus("0,2", facts("a100_four_gpus"), HOST) == [0, 2]
    with pytest.raises(UsageError, match=r"has GPUs \[0, 1, 2, 3\]"):
        gpus.select_gpus("0,7", facts("a100_four_gpus"), HOST)
    with pytest.raises(UsageError, match="has 4 GPU"):
        gpus.select_gpus("5", facts("a100_four_gpus"), HOST)
    with pytest.raises(UsageError, match="duplicates"):
        gpus.select_gpus("1,1", facts("a100_four_gpus"), HOST)
    with pytest.raises(UsageError, match="expected a count"):
        gpus.select_gpus("a,b", facts("a100_four_gpus"), HOST)


def test_select_gpus_respects_the_configured_subset():
    host = HostConfig(name="gpu", address="gpu-box", gpus=(2, 3))
    assert gpus.select_gpus("1", facts("a100_four_gpus"), host) == [2]
    with pytest.raises(UsageError):
        gpus.select_gpus("0", facts("a100_four_gpus"), host)


def test_select_gpus_on_a_cpu_host_is_refused():
    with pytest.raises(UsageError, match="no GPUs"):
        gpus.select_gpus("1", {"nvidia_smi": {"gpus": []}}, HOST)
    assert gpus.select_gpus(None, {}, HOST) == []


def test_slots_one_per_gpu_shared_or_cpu():
    four = facts("a100_four_gpus")
    assert [s.name for s in plan_slots(four, HOST, None, None)] == ["gpu0", "gpu1", "gpu2", "gpu3"]
    assert [s.cuda_visible_devices for s in plan_slots(four, HOST, "1,3", None)] == ["1", "3"]
    shared = plan_slots(four, HOST, "0,1", None, slots_per_gpu=2)
    assert [s.name for s in shared] == ["gpu0.0", "gpu1.0", "gpu0.1", "gpu1.1"]
    assert [s.name for s in plan_slots(four, HOST, None, 2)] == ["gpu0", "gpu1"]
    assert plan_slots({}, HOST, None, 3) == [Slot("cpu0"), Slot("cpu1"), Slot("cpu2")]
    assert plan_slots({}, HOST, None, None)[0].cuda_visible_devices == ""


def test_slots_refused_up_front():
    four = facts("a100_four_gpus")
    with pytest.raises(UsageError, match=r"has GPUs \[0, 1, 2, 3\]; \[7\]"):
        plan_slots(four, HOST, "1,7", None)
    with pytest.raises(UsageError, match=r"has GPUs \[none\]"):
        plan_slots({}, HOST, "5", None)
    with pytest.raises(UsageError, match="only 4 GPU slot"):
        plan_slots(four, HOST, None, 5)
    with pytest.raises(UsageError, match="--slots-per-gpu"):
        plan_slots(four, HOST, None, None, slots_per_gpu=0)


def test_slot_pool_hands_out_the_lowest_free_slot():
    pool = SlotPool([Slot("cpu0"), Slot("cpu1"), Slot("cpu2")])
    a, b = pool.take(), pool.take()
    assert (a.name, b.name) == ("cpu0", "cpu1")
    pool.give_back(b)
    pool.give_back(a)
    pool.give_back(Slot("?"))  # not one of ours: ignored
    assert [s.name for s in pool.free] == ["cpu0", "cpu1", "cpu2"]
    assert pool.take(pool.find_free("cpu2")).name == "cpu2"
    assert pool.find_free("cpu2") is None
