"""The host's GPU inventory, as envcheck's nvidia-smi facts list it, written once for `train --gpus`
(select_gpus) and `optimize` (host_gpus, the slots of thrust_remote/optimize/slots.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from thrust_remote.core.config import HostConfig, JobConfig
from thrust_remote.core.errors import UsageError


def host_gpus(facts: Mapping[str, Any], host: HostConfig) -> list[int]:
    """The GPU indices nvidia-smi lists, narrowed to `hosts.H.gpus` when thrust.yaml sets it."""
    smi = facts.get("nvidia_smi") or {}
    have = [int(g.get("index", i)) for i, g in enumerate(smi.get("gpus") or [])]
    if host.gpus:
        have = [g for g in have if g in host.gpus]
    return have


def _load(gpu: Mapping[str, Any]) -> float:
    return float(gpu.get("utilization_pct") or 0) + float(gpu.get("memory_used_mib") or 0) / 1024


def cpu_hint(job: JobConfig | None) -> str:
    """What runs `job` on a host without GPUs: --nproc means what the job's kind makes of it."""
    if job is not None and job.workers is not None:
        return f"leave --gpus out to run on the CPU: --nproc N passes N by the job's {job.workers.count}"
    if job is not None and job.kind == "command":
        return "leave --gpus out to run on the CPU (a command job starts its own processes)"
    if job is not None and job.kind == "python":
        return ("leave --gpus out to run on the CPU, with --nproc N for N processes under torchrun (a script "
                f"that starts its own workers: add `workers: {{count: FLAG}}` to jobs.{job.name}, its flag for N)")
    return "leave --gpus out to train on the CPU, or use --nproc N for several CPU processes"


def select_gpus(spec: str | None, facts: Mapping[str, Any], host: HostConfig,
                job: JobConfig | None = None) -> list[int]:
    """`--gpus 2` → the first two free; `--gpus 0,2` → those (checked against the host's list); `job`
    names what runs on the CPU instead when the host has no GPU."""
    if not spec:
        return []
    have = host_gpus(facts, host)
    if not have:
        raise UsageError(f"--gpus {spec}: {host.name} has no GPUs that nvidia-smi lists", cpu_hint(job))
    if spec.isdigit():
        want = int(spec)
        if want < 1 or want > len(have):
            raise UsageError(f"--gpus {spec}: {host.name} has {len(have)} GPU(s): {have}")
        gpus = (facts.get("nvidia_smi") or {}).get("gpus") or []
        by_load = sorted((g for g in gpus if int(g.get("index", -1)) in have), key=_load)
        return sorted(int(g["index"]) for g in by_load[:want])
    try:
        chosen = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {spec!r}: expected a count like 2 or a list like 0,2") from None
    bad = [g for g in chosen if g not in have]
    if bad or len(set(chosen)) != len(chosen):
        raise UsageError(f"--gpus {spec}: {host.name} has GPUs {have}; {bad or 'duplicates'} not among them")
    return chosen
