"""Scripts that start their own workers (torch.multiprocessing.spawn): such a job says so with
`workers: {count: FLAG, port: FLAG}` (core/config/model.Workers) and runs once, told its count by its
flag (jobs.own_workers_argv). One that does not say so would be started by torchrun once per process,
each spawning its own workers on one port, and hang: check_request reads the script on the laptop and
refuses that before anything connects (64), naming the `workers:` line to add."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from thrust_remote.core.config import CONFIG_NAME, JobConfig
from thrust_remote.core.config.discovery import work_tree
from thrust_remote.core.config.jobs import WORKERS_EXAMPLE
from thrust_remote.core.errors import UsageError
from thrust_remote.run.jobs import module_paths

# torch's launchers of N worker processes, as scripts call them (mp / multiprocessing / torch.multiprocessing)
_SPAWN = re.compile(r"(?:\bmp|\bmultiprocessing)\.(?:spawn|start_processes)\s*\(")
# a script that reads torchrun's environment was written to run under it too (`if "LOCAL_RANK" in os.environ`)
_TORCHRUN_AWARE = re.compile(r"LOCAL_RANK|\bTORCHELASTIC_")
_FLAG = re.compile(r"""add_argument\(\s*["'](--[\w-]+)["']""")
_COUNT_WORDS = ("gpu", "proc", "world", "worker", "device")


@dataclass(frozen=True)
class Spawner:
    """Where a script starts its own workers, and the flags it seems to take them by."""

    where: str  # SCRIPT:LINE
    call: str  # the call, as written up to its parenthesis (mp.spawn(...))
    count: str | None  # its argparse flag for the count, if one reads like it (--num-gpus)
    port: str | None  # and for a port (--master-port)

    def workers_line(self) -> str:
        if self.count:
            port = f", port: {self.port}" if self.port else ""
            return f"workers: {{count: {self.count}{port}}}"
        return WORKERS_EXAMPLE + "  (the flags it takes them by)"


def planned_count(job: JobConfig, nproc: int | None, gpus: str | None) -> int:
    """The processes a run would start, before any host is asked: --nproc, the job's `nproc:`, one per
    GPU of --gpus (a count, or a list), else one (jobs.process_count, on the request)."""
    if nproc is not None:
        return nproc
    if job.nproc:
        return job.nproc
    spec = (gpus or "").strip()
    if spec.isdigit():
        return int(spec)
    return max(1, len([g for g in spec.split(",") if g.strip()]))


def find_spawner(job: JobConfig, root: Path) -> Spawner | None:
    """The first line of the job's script (or module) under the project `root` that spawns workers,
    unless the script also reads torchrun's environment; None when it does not, or is not here."""
    if job.kind != "python" or job.workers is not None:
        return None
    paths = [job.script] if job.script else module_paths(job.module) if job.module else []
    for rel in paths:
        try:
            text = (root / rel).read_text(errors="replace")
        except OSError:
            continue
        if _TORCHRUN_AWARE.search(text):
            return None
        for n, line in enumerate(text.splitlines(), 1):
            code = line.split("#", 1)[0]
            found = _SPAWN.search(code)
            if found:
                flags = _FLAG.findall(text)
                count = next((f for f in flags if any(w in f.lower() for w in _COUNT_WORDS)), None)
                port = next((f for f in flags if "port" in f.lower()), None)
                return Spawner(f"{rel}:{n}", re.sub(r"\s+", "", found.group(0)) + "...)", count, port)
    return None


def project_root(config_root: Path) -> Path:
    """Where the job's paths are relative to: the repository's top, else the config's directory."""
    return work_tree(config_root) or config_root


def check_request(job: JobConfig, nproc: int | None, gpus: str | None, config_root: Path,
                  config_file: str = CONFIG_NAME) -> None:
    """Several processes of a job whose script starts its own workers and does not say so: refused
    (64), before anything connects. Refused, not warned: under torchrun every rank would spawn its own
    workers on one port, and the run would hang without an error for as long as it is left."""
    count = planned_count(job, nproc, gpus)
    if count < 2:
        return
    spawner = find_spawner(job, project_root(config_root))
    if spawner is None:
        return
    asked = f"--nproc {nproc}" if nproc is not None else f"--gpus {gpus}" if gpus else f"nproc: {count}"
    raise UsageError(
        f"{spawner.where}: job {job.name!r} starts its own workers ({spawner.call}); with {asked} it would run "
        f"under torchrun, {count} copies each spawning its own workers on one port, and hang",
        f"say how it takes its count in {config_file}, under jobs.{job.name}: `{spawner.workers_line()}`; then "
        f"{asked} runs it once and passes {count} by that flag (or give --nproc 1 to run it as it is)")
