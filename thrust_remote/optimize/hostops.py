"""Every remote action of `optimize`, and every call it makes into runs.* and pipeline.*, in one
module (docs/architecture.md, "optimize"): the rest of the package reaches the host only through here.

This is deliberately the ONLY module of thrust_remote/optimize/ allowed to hold a host-side program or a
shell one-liner. Today they are the poll (POLL_SCRIPT, run with `python -c`) and the lease's
create-if-absent / compare-and-swap / release one-liners; they are to become the host agent's `poll`
and `lease` subcommands, and swapping them is a change to this file alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import pipeline, runs
from ..config import Config, HostConfig, JobConfig
from ..errors import ThrustError
from ..runner import Runner

# the pipeline's reporting protocol, named here so the package imports pipeline in one place
Reporter = pipeline.Reporter
NullReporter = pipeline.NullReporter
HostPaths = runs.HostPaths
Prepared = pipeline.Prepared

# One command per poll for every running trial. It waits on the host up to argv[4] seconds, and
# returns early when a run ends (its exit_code appears), writes its first metrics, or a stop is asked:
# a freed slot is seen in ~50 ms instead of half a poll period, without polling more often. Then the
# state (the supervisor's own rules, from the uploaded supervise.py) first and the new whole lines of
# metrics.jsonl second, so a run seen ended has had all its lines read; and the run's slot from
# run.json (for adoption).
POLL_SCRIPT = r"""
import importlib.util, json, os, sys, time
req = json.loads(sys.argv[2]); deadline = time.monotonic() + float(sys.argv[4])
def first_metrics(d):
    try:
        return os.path.getsize(os.path.join(d, "metrics.jsonl")) > 0
    except OSError:
        return False
def ended():
    if os.path.exists(sys.argv[3]):
        return True
    return any(not os.path.isdir(d) or os.path.exists(os.path.join(d, "exit_code")) or (o == 0 and first_metrics(d))
               for d, o in req)
while time.monotonic() < deadline and not ended():
    time.sleep(0.05)
spec = importlib.util.spec_from_file_location("thrust_supervise", sys.argv[1])
sup = importlib.util.module_from_spec(spec); spec.loader.exec_module(sup)
out = {"runs": {}, "stop": os.path.exists(sys.argv[3])}
for run_dir, offset in req:
    if not os.path.isdir(run_dir):
        out["runs"][run_dir] = {"state": "MISSING", "data": "", "offset": offset, "more": False}
        continue
    st = sup.run_state(run_dir)
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as fh:
            fh.seek(offset); data = fh.read(1 << 20)
    except FileNotFoundError:
        data = b""
    cut = data.rfind(b"\n") + 1
    meta = sup._read_json(os.path.join(run_dir, "run.json")) or {}
    tail = ""
    if st["state"] == "FAILED":  # the reason a trial failed, for the table and the study
        try:
            with open(os.path.join(run_dir, "log"), "rb") as fh:
                fh.seek(max(0, os.path.getsize(fh.name) - 2000)); tail = fh.read().decode("utf-8", "replace")
        except OSError:
            pass
    out["runs"][run_dir] = {"state": st["state"], "exit_code": st["exit_code"],
                            "data": data[:cut].decode("utf-8", "replace"), "offset": offset + cut,
                            "more": len(data) == 1 << 20, "slot": meta.get("slot"), "log_tail": tail}
print(json.dumps(out))
"""


# ------------------------------------------------------------------------------------------ poll

def poll(runner: Runner, host: HostConfig, sup_argv: Sequence[str], request: Sequence[tuple[str, int]],
         stop_path: str, wait: float = 0.0) -> dict[str, Any]:
    """One command for every (run_dir, byte offset) in `request`: {"runs": {run_dir: {state, exit_code,
    data, offset, more, slot, log_tail}}, "stop": bool}. Waits on the host up to `wait` seconds."""
    result = runner.run([host.python, "-c", POLL_SCRIPT, sup_argv[1], json.dumps(request), stop_path,
                         f"{wait:.3f}"], timeout=60 + wait)
    if not result.ok:
        raise ThrustError(f"polling the trials on {host.name} failed: {result.stderr.strip()[-300:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------- lease

def lease_read(runner: Runner, path: str) -> str | None:
    """The lease file's text; None when there is none (or it is empty)."""
    text = runner.read_text(path)
    return text if text and text.strip() else None


def lease_create(runner: Runner, path: str, body: str) -> bool:
    """Create the lease only if it still does not exist (sh's noclobber is O_EXCL); False if it does."""
    return runner.run(["sh", "-c", 'set -C; printf "%s" "$1" > "$2"', "sh", body, path]).ok


def lease_take_over(runner: Runner, path: str, body: str) -> None:
    """Overwrite a dead driver's lease (atomic); the caller reads it back, as two takers may race."""
    runner.write_text(path, body)


def lease_owned(runner: Runner, path: str, token: str) -> bool:
    return runner.run(["grep", "-qF", "--", token, path]).ok


def lease_swap(runner: Runner, path: str, body: str, token: str) -> bool:
    """Compare-and-swap: write `body` only while the lease holds `token`; False when it no longer does."""
    renewed = runner.run([
        "sh", "-c", 'grep -qF -- "$3" "$2" 2>/dev/null || exit 3; '
        'printf "%s" "$1" > "$2.tmp.$$" && mv -f "$2.tmp.$$" "$2"', "sh", body, path, token,
    ])
    if renewed.exit_code == 3:
        return False
    renewed.check("write the study lease")
    return True


def lease_release(runner: Runner, path: str, token: str) -> None:
    """Remove the lease if it still holds `token` (never another driver's)."""
    runner.run(["sh", "-c", 'grep -qF -- "$2" "$1" 2>/dev/null && rm -f -- "$1"; exit 0', "sh", path, token])


# ------------------------------------------------------------------------------------- stop file

def write_stop(runner: Runner, path: str) -> None:
    """Ask a study's driver to stop: it sees the file in its next poll."""
    runner.write_text(path, time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))


def clear_stop(runner: Runner, path: str) -> None:
    runner.run(["rm", "-f", "--", path])


# ------------------------------------------------------------------------ runs and pipeline calls

def host_paths(runner: Runner, host: HostConfig, config: Config) -> HostPaths:
    return runs.host_paths(runner, host, config)


def parse_sets(sets: Sequence[str]) -> dict[str, str]:
    return pipeline.parse_sets(sets)


def trial_args(job: JobConfig, sets: Mapping[str, Any], params: Mapping[str, Any]) -> list[str]:
    return pipeline.job_arguments(job, sets, params)


def prepare(config: Config, job: JobConfig, host: HostConfig, runner: Runner, reporter: Reporter,
            args_for_preflight: Sequence[str]) -> Prepared:
    return pipeline.prepare(config, job, host, runner, reporter, args_for_preflight=args_for_preflight)


def running_run_ids(runner: Runner, host: HostConfig, paths: HostPaths) -> list[str]:
    return [r["run_id"] for r in runs.list_runs(runner, host, paths) if r["state"] == "RUNNING"]


def stop_run(runner: Runner, host: HostConfig, paths: HostPaths, run_id: str, grace: float = 10.0) -> None:
    runs.stop(runner, host, paths, run_id, grace=grace)


@dataclass(frozen=True)
class StudyHost:
    """One study's host, prepared: what the scheduler and the monitor need to launch, poll and stop."""

    runner: Runner
    prepared: Prepared
    sup: list[str]  # argv of the uploaded supervisor
    stop_path: str

    @classmethod
    def open(cls, runner: Runner, prepared: Prepared, study: str) -> StudyHost:
        sup = runs.ensure_supervisor(runner, prepared.paths, prepared.host.python)
        runner.makedirs(studies_dir(prepared.paths))
        return cls(runner, prepared, sup, f"{studies_dir(prepared.paths)}/{study}.stop")

    @property
    def host(self) -> HostConfig:
        return self.prepared.host

    @property
    def paths(self) -> HostPaths:
        return self.prepared.paths

    def run_dir(self, run_id: str) -> str:
        return self.paths.run(run_id)

    def poll(self, request: Sequence[tuple[str, int]], wait: float = 0.0) -> dict[str, Any]:
        return poll(self.runner, self.host, self.sup, request, self.stop_path, wait)

    def clear_stop(self) -> None:
        clear_stop(self.runner, self.stop_path)

    def running_run_ids(self) -> list[str]:
        return running_run_ids(self.runner, self.host, self.paths)

    def stop_run(self, run_id: str, grace: float = 10.0) -> None:
        stop_run(self.runner, self.host, self.paths, run_id, grace)

    def launch(self, run_id: str, args: Sequence[str], gpus: Sequence[int], env: Mapping[str, str],
               lock_job: str, meta: Mapping[str, Any]) -> None:
        """One trial = one detached run, without `--export`: a trial's ONNX export would cost seconds
        each and nobody reads it (`train --params` makes the model of the best one)."""
        pipeline.launch_prepared(self.prepared, self.runner, args=args, run_id=run_id, gpus=gpus, nproc=1,
                                 extra_env=env, lock_job=lock_job, export=False, meta_extra=meta)


def studies_dir(paths: HostPaths) -> str:
    return f"{paths.thrust}/studies"
