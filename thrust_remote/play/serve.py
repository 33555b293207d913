"""The static server behind `thrust-remote play`: the page with COOP/COEP headers and a model listing.

Where the page comes from (`default_web_dir`): web/ of the repository in a checkout (development),
else the copy an installed wheel carries as `thrust_remote/web-page/` (the page plus only the
onnxruntime-web files it loads, `ORT_FILES`; `make wheel` stages them, `stage_page`).

Paths it serves (all on 127.0.0.1):
- `/` and everything under it: the files of web/ (the page, src/, node_modules/onnxruntime-web/dist).
- `/public/<name>`: the model directory (default web/public): `<job>.onnx`, `<job>.json` (manifest),
  `<job>.metrics.jsonl` (learning curve).
- `/kept/<run-id>/model.onnx|manifest.json|metrics.jsonl|fetch.json`: the models kept per run in
  `<project>/.thrust/fetched/` (docs/architecture.md, "Kept models").
- `/api/models`: JSON `{"models": [{name, group, model, manifest, metrics, env, steps, score, score_kind,
  playable, ...}]}`: the `--model` one if given, then one entry per `<job>.onnx` that has a `<job>.json`
  beside it (group "placed"), then every kept model, newest fetch first (group "kept", with run_id,
  host, job, state, fetched_at, placed). `playable` is false for envs the page cannot play (not snake).
- `/models/<name>.onnx|.json|.metrics.jsonl`: a model given by path (`--model PATH`).

Every response carries `Cross-Origin-Opener-Policy: same-origin` and `Cross-Origin-Embedder-Policy:
require-corp`, so the page is cross-origin isolated and onnxruntime-web may use threads.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import threading
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.fetch import models
from thrust_remote.play import PLAYABLE_ENVS
from thrust_remote.play.page import (  # the page's files: stdlib only, so `make wheel` stages them bare
    CHECKOUT_WEB,
    ORT_DIST,
    ORT_FILES,
    PACKAGED_WEB,
    PAGE_FILES,
    stage_page,
)

log = logging.getLogger(__name__)

KEPT_FILES = (models.MODEL, models.MANIFEST, models.METRICS, models.FETCH_INFO)
KEPT_INFO_KEYS = ("run_id", "host", "job", "state", "exit_code", "steps", "score", "score_kind", "fetched_at",
                  "sha256", "note")
MANIFEST_SUMMARY_KEYS = ("env", "grid_size", "action_mode", "policy", "steps", "final_return", "obs_dim")
MIME_TYPES = {
    ".wasm": "application/wasm",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".onnx": "application/octet-stream",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
    ".map": "application/json",
    ".css": "text/css",
    ".html": "text/html; charset=utf-8",
}
ISOLATION_HEADERS = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
    "Cross-Origin-Resource-Policy": "same-origin",
}
TRAIN_HINT = (
    "train one with `thrust-remote train snake` (it writes web/public/snake.onnx + snake.json), "
    "or pass --model PATH"
)

# Headless Chromium as the tests, bench/bench_web.py and web/tools/screenshot.py start it: no sandbox (root
# in a container), and none of the background traffic a closed network refuses.
HEADLESS_CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


__all__ = ["ORT_DIST", "ORT_FILES", "PAGE_FILES", "stage_page"]  # re-exported: tests and tools import them here


def in_checkout() -> bool:
    """True when this package runs from the repository (editable install or PYTHONPATH), not a wheel."""
    root = CHECKOUT_WEB.parent
    return (root / "pyproject.toml").is_file() and (CHECKOUT_WEB / "index.html").is_file()


def default_web_dir() -> Path:
    """web/ of the checkout when there is one (so edits show at once), else the page the wheel carries."""
    return CHECKOUT_WEB if in_checkout() else PACKAGED_WEB


@dataclass(frozen=True)
class ModelFiles:
    """One playable model: the .onnx, its manifest, and the optional metrics.jsonl."""

    name: str
    model: Path
    manifest: Path
    metrics: Path | None

    @classmethod
    def from_model_path(cls, path: Path) -> ModelFiles:
        """`<x>.onnx` with `<x>.json` beside it (web/public layout), or `model.onnx` + `manifest.json`
        (a run directory); metrics from `<x>.metrics.jsonl` or `metrics.jsonl`."""
        path = path.expanduser()
        if not path.is_file():
            raise ThrustError(f"model file not found: {path}", hint=TRAIN_HINT)
        candidates = [path.with_suffix(".json"), path.parent / models.MANIFEST]
        manifest = next((c for c in candidates if c.is_file()), None)
        if manifest is None:
            raise ThrustError(
                f"no manifest for {path}: expected {candidates[0]} or {candidates[1]}",
                hint="export writes the manifest beside the model; `thrust-remote fetch RUN_ID` gets both",
            )
        metrics_candidates = [path.with_suffix(".metrics.jsonl"), path.parent / models.METRICS]
        metrics = next((c for c in metrics_candidates if c.is_file()), None)
        name = path.parent.name if path.stem == "model" and path.parent.name else path.stem
        return cls(name=name, model=path, manifest=manifest, metrics=metrics)


def _manifest_names(manifest: Path, model: Path) -> bool:
    """True if the manifest's `file` field (trainer/export.py writes it) names this model."""
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("file") == model.name


def find_models(public_dir: Path) -> list[ModelFiles]:
    """Every `<job>.onnx` in public_dir with its manifest, sorted by name. The manifest is `<job>.json`,
    or else `manifest.json` when its `file` field names `<job>.onnx` (what `trainer.export` writes)."""
    if not public_dir.is_dir():
        return []
    found = []
    shared = public_dir / models.MANIFEST
    for model in sorted(public_dir.glob("*.onnx")):
        manifest = model.with_suffix(".json")
        if not manifest.is_file():
            if not (shared.is_file() and _manifest_names(shared, model)):
                continue
            manifest = shared
        metrics = model.with_suffix(".metrics.jsonl")
        found.append(ModelFiles(model.stem, model, manifest, metrics if metrics.is_file() else None))
    return found


def _summary(manifest: Path) -> dict[str, Any]:
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: data[k] for k in MANIFEST_SUMMARY_KEYS if k in data}


def _playable(row: dict[str, Any]) -> bool:
    return row.get("env", "snake") in PLAYABLE_ENVS


def _manifest_sha(manifest: Path) -> str | None:
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return data.get("sha256") if isinstance(data, dict) else None


@dataclass
class Site:
    """What the server shows: the web/ directory, the model directory, an extra model, and the
    models kept per run under `<project_root>/.thrust/fetched/`."""

    web_dir: Path = field(default_factory=default_web_dir)
    public_dir: Path | None = None
    extra: ModelFiles | None = None
    project_root: Path | None = None

    def __post_init__(self) -> None:
        self.web_dir = self.web_dir.resolve()
        # the wheel's page has no models beside it: then the default is web/public of where play runs
        default_public = Path("web/public") if self.web_dir == PACKAGED_WEB else self.web_dir / "public"
        self.public_dir = (self.public_dir or default_public).resolve()

    @property
    def kept_dir(self) -> Path | None:
        return models.kept_root(self.project_root).resolve() if self.project_root is not None else None

    def models(self) -> list[dict[str, Any]]:
        assert self.public_dir is not None
        rows: list[dict[str, Any]] = []
        if self.extra is not None:
            e = self.extra
            rows.append({"name": e.name, "group": "given", "model": f"models/{e.name}.onnx",
                         "manifest": f"models/{e.name}.json",
                         "metrics": f"models/{e.name}.metrics.jsonl" if e.metrics else None, **_summary(e.manifest)})
        kept = models.list_kept(self.project_root) if self.project_root is not None else []
        placed: set[str] = set()
        taken = {r["name"] for r in rows}
        for m in find_models(self.public_dir):
            if m.name in taken:
                continue
            q = urllib.parse.quote(m.name)
            sha = _manifest_sha(m.manifest)
            placed.add(sha or "")
            source = next((k for k in kept if sha and k.get("sha256") == sha), None)
            score, kind = models.score_of(_summary(m.manifest), m.metrics)
            rows.append({"name": m.name, "group": "placed", "model": f"public/{q}.onnx", "manifest": f"public/{q}.json",
                         "metrics": f"public/{q}.metrics.jsonl" if m.metrics else None, **_summary(m.manifest),
                         "score": score, "score_kind": kind, "run_id": source.get("run_id") if source else None})
        taken = {r["name"] for r in rows}
        for k in kept:
            name = k["dir"].name
            if name in taken:
                continue
            q = urllib.parse.quote(name)
            summary = _summary(k["dir"] / models.MANIFEST)
            has_metrics = (k["dir"] / models.METRICS).is_file()
            rows.append({"name": name, "group": "kept", "model": f"kept/{q}/{models.MODEL}",
                         "manifest": f"kept/{q}/{models.MANIFEST}",
                         "metrics": f"kept/{q}/{models.METRICS}" if has_metrics else None, **summary,
                         **{key: k.get(key) for key in KEPT_INFO_KEYS if key in k},
                         "placed": k.get("sha256") in placed})
        for row in rows:
            row["playable"] = _playable(row)
        return rows

    def check(self) -> None:
        """Raise ThrustError unless there is a page, onnxruntime-web and at least one model."""
        missing = [name for name in ORT_FILES if not (self.web_dir / ORT_DIST / name).is_file()]
        if self.web_dir == PACKAGED_WEB and (missing or not (self.web_dir / "index.html").is_file()):
            # a wheel built without staging (`pip install .` straight from a checkout)
            raise ThrustError(
                f"this installation of thrust-remote lacks the page or its onnxruntime-web files ({self.web_dir})",
                hint="install a wheel built with `make wheel`, which stages them into thrust_remote/web-page/ "
                     "(`pip install .` from a checkout has no page; `make demo` there plays from web/)",
                exit_code=ExitCode.UNAVAILABLE,  # the install lacks a part: nothing the user typed was wrong
            )
        if not (self.web_dir / "index.html").is_file():
            raise ThrustError(f"the web page is missing: {self.web_dir / 'index.html'}")
        if missing:
            raise ThrustError(
                f"onnxruntime-web is not installed in {self.web_dir / 'node_modules'}",
                hint=f"run `make web-deps` (or `cd {self.web_dir} && npm ci`)",
            )
        if not self.models():
            kept = f" and {self.kept_dir} holds no kept model" if self.kept_dir is not None else ""
            raise ThrustError(
                f"no model to play: {self.public_dir} has no <job>.onnx with its <job>.json{kept}", hint=TRAIN_HINT
            )

    def resolve(self, url_path: str) -> Path | None:
        """The file for a URL path, or None (outside the served directories, or absent)."""
        assert self.public_dir is not None
        path = posixpath.normpath(urllib.parse.unquote(url_path.split("?", 1)[0].split("#", 1)[0]))
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if any(p == ".." for p in parts):
            return None
        if parts[:1] == ["models"] and self.extra is not None and len(parts) == 2:
            e = self.extra
            files = {f"{e.name}.onnx": e.model, f"{e.name}.json": e.manifest}
            if e.metrics is not None:
                files[f"{e.name}.metrics.jsonl"] = e.metrics
            return files.get(parts[1])
        if parts[:1] == ["kept"]:
            return self._kept_file(parts[1:])
        if parts[:1] == ["public"]:
            base, rest = self.public_dir, parts[1:]
        else:
            base, rest = self.web_dir, parts
        target = base.joinpath(*rest) if rest else base
        if target.is_dir():
            target = target / "index.html"
        try:
            target.resolve().relative_to(base)
        except ValueError:
            # node_modules may be a symlink farm; allow what stays under web/ after resolving
            if not str(target.resolve()).startswith(str(self.web_dir)):
                return None
        return target if target.is_file() else None


    def _kept_file(self, parts: list[str]) -> Path | None:
        """kept/<run-id>/<one of KEPT_FILES>, nothing else under .thrust/ (not a fetch in progress)."""
        kept = self.kept_dir
        if kept is None or len(parts) != 2 or parts[0].startswith(".") or parts[1] not in KEPT_FILES:
            return None
        target = kept / parts[0] / parts[1]
        return target if target.is_file() else None


class _Handler(SimpleHTTPRequestHandler):
    site: Site  # set on the subclass made per server
    server_version = "thrust-remote-play"
    extensions_map = {**SimpleHTTPRequestHandler.extensions_map, **MIME_TYPES}

    def end_headers(self) -> None:
        for key, value in ISOLATION_HEADERS.items():
            self.send_header(key, value)
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def translate_path(self, path: str) -> str:
        target = self.site.resolve(path)
        # a path that cannot exist makes the base class answer 404
        return str(target) if target is not None else str(self.site.web_dir / ".thrust-no-such-file")

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] == "/api/models":
            self._send_json({"models": self.site.models()})
            return
        super().do_GET()

    def do_HEAD(self) -> None:
        if self.path.split("?", 1)[0] == "/api/models":
            self._send_json({"models": self.site.models()}, head=True)
            return
        super().do_HEAD()

    def _send_json(self, body: object, head: bool = False) -> None:
        data = json.dumps(body).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def guess_type(self, path: str | os.PathLike[str]) -> str:
        name = str(path)
        for ext in (".metrics.jsonl", ".jsonl"):
            if name.endswith(ext):
                return MIME_TYPES[".jsonl"]
        return super().guess_type(path)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)


class PlayServer:
    """A ThreadingHTTPServer for a Site on 127.0.0.1; `start()` runs it in a daemon thread."""

    def __init__(self, site: Site, port: int = 0, host: str = "127.0.0.1") -> None:
        handler = type("Handler", (_Handler,), {"site": site})
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise ThrustError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                hint="pick another port with --port, or --port 0 for any free one",
            ) from exc
        self.httpd.daemon_threads = True
        self.site = site
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def start(self) -> PlayServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="play-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> PlayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
