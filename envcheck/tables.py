"""Version tables and comparisons: tch-rs -> PyTorch pins, CUDA -> minimum NVIDIA driver.

Standard library only (this package runs on the host before anything is installed).
"""

from __future__ import annotations

import re

# tch-rs minor release -> the PyTorch (libtorch) minor it is generated against. torch-sys refuses
# any other version at build time unless LIBTORCH_BYPASS_VERSION_CHECK=1. From tch-rs' CHANGELOG.
TCH_TORCH = {
    (0, 8): (1, 12),
    (0, 9): (1, 13),
    (0, 10): (1, 13),
    (0, 11): (2, 0),
    (0, 12): (2, 0),
    (0, 13): (2, 0),
    (0, 14): (2, 1),
    (0, 15): (2, 2),
    (0, 16): (2, 3),
    (0, 17): (2, 4),
    (0, 18): (2, 5),
    (0, 19): (2, 6),
    (0, 20): (2, 7),
    (0, 21): (2, 8),
    (0, 22): (2, 9),
    (0, 23): (2, 10),
    (0, 24): (2, 11),
    (0, 25): (2, 12),
    (0, 26): (2, 13),
}

# CUDA toolkit (major, minor) -> minimum Linux driver that ships with it (NVIDIA's release notes,
# table 3). Below that, CUDA's "minor version compatibility" may still run most kernels as long as
# the driver meets the major's floor (CUDA_MAJOR_FLOOR); PTX JIT and newer APIs then fail.
CUDA_DRIVER = {
    (11, 0): "450.36.06",
    (11, 1): "455.23.05",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
CUDA_MAJOR_FLOOR = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

_VERSION_RE = re.compile(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """'2.9.0+cu128' -> (2, 9, 0); '0.22' -> (0, 22); local suffixes (+cu128, a0, .dev) ignored."""
    if not text:
        return None
    m = _VERSION_RE.match(text.strip().lstrip("v"))
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def torch_for_tch(tch_version: str | None) -> tuple[int, int] | None:
    """The PyTorch (major, minor) that a tch-rs version needs, or None if the table lacks it."""
    v = parse_version(tch_version)
    if not v or len(v) < 2:
        return None
    return TCH_TORCH.get((v[0], v[1]))


def torch_matches_tch(torch_version: str | None, tch_version: str | None) -> bool | None:
    """True/False when both are known; None when either is unknown. Patch and +cuXXX are ignored."""
    want = torch_for_tch(tch_version)
    have = parse_version(torch_version)
    if want is None or not have or len(have) < 2:
        return None
    return (have[0], have[1]) == want


def fmt(version: tuple[int, ...] | None) -> str:
    return ".".join(str(p) for p in version) if version else "?"


def driver_requirement(cuda_version: str | None) -> tuple[str | None, str | None]:
    """(driver that ships with this CUDA, the major's minor-compatibility floor), None if unknown."""
    v = parse_version(cuda_version)
    if not v:
        return None, None
    key = (v[0], v[1] if len(v) > 1 else 0)
    exact = CUDA_DRIVER.get(key)
    if exact is None:
        # an unlisted minor (e.g. 12.7): the newest listed one below it is the conservative answer
        lower = [k for k in CUDA_DRIVER if k[0] == key[0] and k[1] <= key[1]]
        exact = CUDA_DRIVER[max(lower)] if lower else None
    return exact, CUDA_MAJOR_FLOOR.get(key[0])


def version_at_least(have: str | None, need: str | None) -> bool | None:
    a, b = parse_version(have), parse_version(need)
    if not a or not b:
        return None
    width = max(len(a), len(b))
    return a + (0,) * (width - len(a)) >= b + (0,) * (width - len(b))
