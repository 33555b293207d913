"""`play`: serve web/ on 127.0.0.1 so the browser plays the trained model."""

from __future__ import annotations

import webbrowser
from pathlib import Path

import typer

from thrust_remote.cli.common import get_config
from thrust_remote.core.console import console
from thrust_remote.core.errors import ThrustError
from thrust_remote.play import PLAYABLE_ENVS


def register(app: typer.Typer) -> None:
    app.command("play", help="Serve the browser demo (web/) on 127.0.0.1 and print its URL; unless --no-open, "
                "also open it in a browser when this machine has one.")(play)


def play(
    ctx: typer.Context,
    port: int = typer.Option(8765, "--port", "-p", min=0, max=65535,
                             help="Port on 127.0.0.1 (0: any free port)."),
    model: Path | None = typer.Option(
        None, "--model", help="A model to play: <x>.onnx with <x>.json beside it, or a run's model.onnx."
    ),
    public: Path | None = typer.Option(
        None,
        "--public",
        help="Directory of models to list (default: where thrust.yaml's jobs export, else web/public).",
        show_default=False,
    ),
    no_open: bool = typer.Option(False, "--no-open",
                                 help="Only print the URL; do not open a browser (default: open it)."),
) -> None:
    from thrust_remote.play.serve import ModelFiles, PlayServer, Site, default_web_dir  # its HTTP server: here only

    extra = ModelFiles.from_model_path(model) if model is not None else None
    site = Site(web_dir=default_web_dir(), public_dir=public or project_models_dir(ctx), extra=extra,
                project_root=project_root(ctx))
    site.check()
    server = PlayServer(site, port=port)
    url = server.url
    if extra is not None:
        url += f"?model={extra.name}"
    models = site.models()
    names = ", ".join(m["name"] for m in models if m["group"] != "kept") or "none placed"
    kept = sum(m["group"] == "kept" for m in models)
    console.print(f"serving {site.web_dir} (models: {names}; {kept} kept in {site.kept_dir})", soft_wrap=True)
    unplayable = [m["name"] for m in models if not m["playable"]]
    if unplayable:
        console.print(f"listed but not playable in the page (it plays {', '.join(PLAYABLE_ENVS)} only): "
                      f"{', '.join(unplayable)}", soft_wrap=True)
    console.print(f"open [bold]{url}[/]  (Ctrl-C stops)", soft_wrap=True)
    if not no_open:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped")
    finally:
        server.httpd.server_close()


def project_root(ctx: typer.Context) -> Path:
    """The project whose kept models (.thrust/fetched/) the page lists: thrust.yaml's, else here."""
    try:
        return get_config(ctx).root
    except ThrustError:
        return Path.cwd()  # a broken thrust.yaml should not stop the demo; `train` reports it


def project_models_dir(ctx: typer.Context) -> Path | None:
    """The directory the project's jobs export to (`export:` in thrust.yaml, else web/public/<job>.onnx
    under the project root), when it holds a model; None means web/ beside this package."""
    try:
        config = get_config(ctx)
    except ThrustError:
        return None  # a broken thrust.yaml should not stop the demo; `train` reports it
    if config.path is None:
        return None
    from thrust_remote.play.serve import find_models

    dirs = [(config.root / (job.export or f"web/public/{name}.onnx")).parent for name, job in config.jobs.items()]
    return next((d for d in dict.fromkeys(dirs) if find_models(d)), None)
