"""Stage the browser page into the package, so a wheel carries it (`make wheel` runs this first).

    python tools/stage_web.py [--web web] [--dest thrust_remote/web-page]

Copies web/index.html, web/src/ and only the onnxruntime-web files the page loads (thrust_remote.play.serve's
ORT_FILES, about 14 MB of web/node_modules' 148) into thrust_remote/web-page/, which is gitignored and
listed in pyproject's package-data. An installed `thrust-remote play` serves it (serve.default_web_dir).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from thrust_remote.core.errors import ThrustError  # noqa: E402
from thrust_remote.play.page import stage_page  # noqa: E402  (stdlib only: any python3 runs this)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--web", type=Path, default=REPO / "web")
    parser.add_argument("--dest", type=Path, default=REPO / "thrust_remote" / "web-page")
    args = parser.parse_args()
    try:
        written = stage_page(args.web, args.dest)
    except ThrustError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in written)
    print(f"staged {len(written)} files ({size / 1e6:.1f} MB) into {args.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
