"""Screenshot of the page playing a model, in headless Chromium (for docs/screenshot.png).

    .venv/bin/python web/tools/screenshot.py [--public web/public] [--model snake] [--out docs/screenshot.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from thrust_remote.serve import HEADLESS_CHROMIUM_ARGS as CHROMIUM_ARGS  # noqa: E402
from thrust_remote.serve import PlayServer, Site, default_web_dir  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--public", type=Path, default=default_web_dir() / "public")
    parser.add_argument("--model", default=None, help="model name (default: the first listed)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    parser.add_argument("--speed", default="15", help="moves per second, or max")
    parser.add_argument("--seconds", type=float, default=6.0, help="play this long before the shot")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    query = f"?speed={args.speed}&seed={args.seed}" + (f"&model={args.model}" if args.model else "")
    with (
        tempfile.TemporaryDirectory() as profile,
        PlayServer(Site(web_dir=default_web_dir(), public_dir=args.public), port=0) as server,
        sync_playwright() as pw,
    ):
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=args.chromium,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 980, "height": 800},
        )
        page = context.new_page()
        page.goto(server.url + query)
        page.wait_for_function("window.thrust !== undefined")
        page.evaluate("window.thrust.ready")
        time.sleep(args.seconds)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out))
        stats = page.evaluate(
            "[window.thrust.state.moves, window.thrust.state.best, window.thrust.state.episode, "
            "window.thrust.state.error]"
        )
        context.close()
    print(f"wrote {args.out}: moves {stats[0]}, best score {stats[1]}, episode {stats[2]}, error {stats[3]}")


if __name__ == "__main__":
    main()
