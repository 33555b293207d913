"""The page a wheel carries (`make wheel`, tools/stage_web.py): which files of web/ it is and how they are
staged into the package. Standard library only (and core.errors), so the wheel's small build env stages
it without the package's dependencies.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from thrust_remote.core.errors import ThrustError

# The page's own files, relative to web/, and the onnxruntime-web files it loads: web/src/model.js imports
# ort.wasm.min.mjs (the wasm-only build), which loads ort-wasm-simd-threaded.mjs and its .wasm from
# `wasmPaths`. The other 140 MB of node_modules are never requested, so the wheel carries only these.
PAGE_FILES = ("index.html", "src/*.js", "src/*.css")
ORT_DIST = "node_modules/onnxruntime-web/dist"
ORT_FILES = ("ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs", "ort-wasm-simd-threaded.wasm")
PACKAGED_WEB = Path(__file__).resolve().parent.parent / "web-page"
CHECKOUT_WEB = Path(__file__).resolve().parent.parent.parent / "web"


def stage_page(web_dir: Path, dest: Path) -> list[Path]:
    """Copy the page (PAGE_FILES) and the onnxruntime-web files it loads (ORT_FILES) from web_dir into
    dest, replacing what was there; returns the files written. Raises ThrustError if one is missing."""
    sources = [p for pattern in PAGE_FILES for p in sorted(web_dir.glob(pattern))]
    sources += [web_dir / ORT_DIST / name for name in ORT_FILES]
    missing = [str(p) for p in sources if not p.is_file()]
    if missing or not (web_dir / "index.html").is_file():
        raise ThrustError(f"cannot stage the page: missing {', '.join(missing) or web_dir / 'index.html'}",
                          hint="run `make web-deps` first (it installs onnxruntime-web into web/node_modules)")
    if dest.exists():
        shutil.rmtree(dest)
    written = []
    for src in sources:
        target = dest / src.relative_to(web_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        written.append(target)
    return written
