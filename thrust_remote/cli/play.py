"""`play`: serve web/ on 127.0.0.1 so the browser plays the trained model."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer

from ..console import console
from ..serve import ModelFiles, PlayServer, Site, default_web_dir


def register(app: typer.Typer) -> None:
    app.command("play", help="Serve the browser demo (web/) on 127.0.0.1 and open it.")(play)


def play(
    port: int = typer.Option(8765, "--port", "-p", help="Port on 127.0.0.1 (0: any free port)."),
    model: Path | None = typer.Option(
        None, "--model", help="A model to play: <x>.onnx with <x>.json beside it, or a run's model.onnx."
    ),
    public: Path | None = typer.Option(
        None, "--public", help="Directory of models to list (default: web/public).", show_default=False
    ),
    no_open: bool = typer.Option(False, "--no-open", help="Print the URL; do not open a browser."),
) -> None:
    extra = ModelFiles.from_model_path(model) if model is not None else None
    site = Site(web_dir=default_web_dir(), public_dir=public, extra=extra)
    site.check()
    server = PlayServer(site, port=port)
    url = server.url
    if extra is not None:
        url += f"?model={extra.name}"
    names = ", ".join(m["name"] for m in site.models())
    console.print(f"serving {site.web_dir} (models: {names})")
    console.print(f"open [bold]{url}[/]  (Ctrl-C stops)", soft_wrap=True)
    if not no_open:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.httpd.server_close()
