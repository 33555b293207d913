"""Parse nvidia-smi's machine-readable output.

The query is fixed (QUERY_ARGV) so the column order is known. nvidia-smi writes `[N/A]` or
`[Not Supported]` for fields it cannot report (utilization of a MIG-enabled GPU, memory on some
boards); those become None rather than errors. "No devices were found" is an empty GPU list, not a
failure of the parser.
"""

from __future__ import annotations

import csv
import io
import re

QUERY_FIELDS = ("index", "name", "driver_version", "utilization.gpu", "memory.used", "memory.total")
QUERY_ARGV = [
    "nvidia-smi",
    "--query-gpu=" + ",".join(QUERY_FIELDS),
    "--format=csv,noheader,nounits",
]
LIST_ARGV = ["nvidia-smi", "-L"]

NO_DEVICES = "No devices were found"
# plain `nvidia-smi` prints the newest CUDA the driver supports in its header ("CUDA Version: 12.4")
_CUDA_VERSION_RE = re.compile(r"CUDA Version:\s*(\d+\.\d+)")

_LIST_GPU_RE = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[0-9A-Za-z-]+)\)\s*$")
_LIST_MIG_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9A-Za-z/-]+)\)\s*$")


def _number(text: str) -> int | None:
    text = text.strip()
    if not text or text.startswith("["):  # [N/A], [Not Supported], [Unknown Error]
        return None
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_query(text: str) -> list[dict]:
    """The CSV of QUERY_ARGV -> one dict per GPU. Lines that are not GPU rows are ignored."""
    gpus: list[dict] = []
    if NO_DEVICES in text:
        return gpus
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if len(row) < len(QUERY_FIELDS):
            continue
        if len(row) > len(QUERY_FIELDS):
            # a comma inside the product name: everything between index and the 4 numbers is the name
            row = [row[0], ", ".join(row[1:-4]), *row[-4:]]
        index = _number(row[0])
        if index is None:
            continue
        gpus.append(
            {
                "index": index,
                "name": row[1].strip(),
                "driver_version": row[2].strip() or None,
                "utilization_pct": _number(row[3]),
                "memory_used_mib": _number(row[4]),
                "memory_total_mib": _number(row[5]),
            }
        )
    return gpus


def parse_list(text: str) -> list[dict]:
    """`nvidia-smi -L` -> GPUs with their UUIDs and any MIG instances listed under each."""
    gpus: list[dict] = []
    for line in text.splitlines():
        m = _LIST_GPU_RE.match(line)
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3), "mig": []})
            continue
        m = _LIST_MIG_RE.match(line)
        if m and gpus:
            gpus[-1]["mig"].append({"profile": m.group(1), "device": int(m.group(2)), "uuid": m.group(3)})
    return gpus


def parse_cuda_version(text: str) -> str | None:
    """The driver's CUDA version from plain `nvidia-smi` output ("12.4"), or None when it is not there."""
    m = _CUDA_VERSION_RE.search(text or "")
    return m.group(1) if m else None


def summarize(query_out: str, query_rc: int, list_out: str = "") -> dict:
    """Everything doctor needs from the two nvidia-smi calls, as one JSON-able dict."""
    gpus = parse_query(query_out) if query_rc == 0 else []
    listed = parse_list(list_out)
    by_index = {g["index"]: g for g in listed}
    for gpu in gpus:
        extra = by_index.get(gpu["index"])
        gpu["uuid"] = extra["uuid"] if extra else None
        gpu["mig_devices"] = extra["mig"] if extra else []
    error = None
    text = query_out.strip()
    if NO_DEVICES in text:
        error = NO_DEVICES
    elif query_rc != 0:
        error = (text.splitlines() or [f"exit code {query_rc}"])[0]
    drivers = sorted({g["driver_version"] for g in gpus if g.get("driver_version")})
    return {
        "gpus": gpus,
        "gpu_count": len(gpus),
        "driver_version": drivers[0] if drivers else None,
        "mig": any(g["mig_devices"] for g in gpus),
        "error": error,
    }
