"""What a laptop downloads and unpacks: the plain install vs `thrust-remote[local]`, side by side.

    .venv/bin/python bench/bench_install.py [--wheel dist/thrust_remote-0.1.0-py3-none-any.whl]
        [--torch torch==2.13.0] [--repeat 1]

Each round makes two fresh venvs (`python3 -m venv`, outside the checkout) and installs with real pip,
no cache (`--no-cache-dir`), from PyPI only: this machine's pip config and PIP_* variables are left
out (PIP_CONFIG_FILE=/dev/null), so nothing comes from a local mirror.

- plain: `pip install WHEEL` (what drives remote hosts: no torch, onnxscript, gymnasium);
- local: first `pip install TORCH` with this machine's own pip config (here torch==2.13.0 is the CPU
  wheel on disk: PyPI's plain `torch` on Linux is the multi-GB CUDA build), then `pip install
  'WHEEL[local]'` from PyPI, torch already satisfied.

Printed per round: seconds of each step and the venv's size on disk (`du -sm`). Without --wheel, the
wheel is built from this checkout (`pip wheel --no-deps`: the page is not staged, ~4 MB less than
`make wheel`'s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NO_CONFIG = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def pip_env(own_config: bool) -> dict[str, str]:
    """This machine's pip settings (own_config), else none of them: PyPI alone."""
    if own_config:
        return dict(os.environ)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, **NO_CONFIG}


def timed_pip(venv: Path, args: list[str], own_config: bool = False) -> float:
    started = time.monotonic()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-cache-dir", *args],
                   env=pip_env(own_config), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.monotonic() - started


def size_mb(path: Path) -> int:
    return int(subprocess.run(["du", "-sm", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def build_wheel(out: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
                   check=True, capture_output=True)
    return next(out.glob("thrust_remote-*.whl"))


def one_round(tmp: Path, wheel: Path, torch: str) -> dict[str, float]:
    for name in ("plain", "local"):
        subprocess.run(["python3", "-m", "venv", str(tmp / name)], check=True)
    plain_s = timed_pip(tmp / "plain", [str(wheel)])
    torch_s = timed_pip(tmp / "local", [torch], own_config=True)
    rest_s = timed_pip(tmp / "local", [f"{wheel}[local]"])
    return {"plain_s": plain_s, "plain_mb": size_mb(tmp / "plain"), "torch_s": torch_s, "rest_s": rest_s,
            "local_s": torch_s + rest_s, "local_mb": size_mb(tmp / "local")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheel", type=Path, help="a built wheel (default: built from this checkout)")
    parser.add_argument("--torch", default="torch==2.13.0", help="the [local] venv's torch, installed first")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
        wheel = args.wheel.resolve() if args.wheel else build_wheel(Path(tmp) / "wheel")
        print(f"wheel {wheel.name}; [local]'s torch: {args.torch} (this machine's pip config), the rest from PyPI")
        print("round  plain: s    MB | [local]: torch s  rest s  total s    MB")
        for i in range(args.repeat):
            r = one_round(Path(tmp) / f"round-{i}", wheel, args.torch)
            print(f"{i + 1:>5}  {r['plain_s']:8.1f} {r['plain_mb']:5d} | {r['torch_s']:15.1f} {r['rest_s']:7.1f} "
                  f"{r['local_s']:8.1f} {r['local_mb']:5d}")


if __name__ == "__main__":
    main()
