"""`thrust-remote play` and its server: headers, MIME types, the model listing, and the no-model error."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import pytest

from thrust_remote.core.errors import ThrustError
from thrust_remote.play.serve import ModelFiles, PlayServer, Site, default_web_dir, find_models

WEB = default_web_dir()
ORT_DIST = WEB / "node_modules" / "onnxruntime-web" / "dist"
CLI = [sys.executable, "-c", "from thrust_remote.cli.main import run; run()"]


def fake_model(public: Path, name: str, **manifest: object) -> Path:
    """Files in the web/public layout; the server does not parse ONNX, so bytes are enough here."""
    public.mkdir(parents=True, exist_ok=True)
    model = public / f"{name}.onnx"
    model.write_bytes(b"not really onnx")
    model.with_suffix(".json").write_text(json.dumps({"env": "snake", "grid_size": 10, "steps": 5, **manifest}))
    return model


def get(url: str) -> tuple[int, Message, bytes]:
    """Status, headers (case-insensitive) and body."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PlayServer]:
    fake_model(tmp_path, "snake", final_return=1.5)
    (tmp_path / "snake.metrics.jsonl").write_text('{"step": 1, "return_mean": 0.5}\n')
    fake_model(tmp_path, "cartpole")
    (tmp_path / "orphan.onnx").write_bytes(b"no manifest beside it")
    with PlayServer(Site(web_dir=WEB, public_dir=tmp_path), port=0) as srv:
        yield srv


def test_every_response_has_the_cross_origin_isolation_headers(server: PlayServer) -> None:
    for path in ("", "index.html", "src/app.js", "api/models", "public/snake.json", "no-such-file"):
        _, headers, _ = get(server.url + path)
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin", path
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp", path


def test_mime_types(server: PlayServer) -> None:
    status, headers, body = get(server.url)
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert b"thrust-remote" in body
    assert get(server.url + "src/snake.js")[1]["Content-Type"].startswith("text/javascript")
    assert get(server.url + "public/snake.onnx")[1]["Content-Type"] == "application/octet-stream"
    assert get(server.url + "public/snake.metrics.jsonl")[1]["Content-Type"] == "application/x-ndjson"
    if not ORT_DIST.is_dir():
        pytest.skip("web/node_modules is missing (make web-deps)")
    wasm = next(ORT_DIST.glob("*.wasm")).name
    assert get(f"{server.url}node_modules/onnxruntime-web/dist/{wasm}")[1]["Content-Type"] == "application/wasm"
    mjs = next(ORT_DIST.glob("*.mjs")).name
    assert get(f"{server.url}node_modules/onnxruntime-web/dist/{mjs}")[1]["Content-Type"] == "text/javascript"


def test_api_models_lists_models_with_their_manifest(server: PlayServer) -> None:
    status, headers, body = get(server.url + "api/models")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    rows = json.loads(body)["models"]
    assert [r["name"] for r in rows] == ["cartpole", "snake"]  # orphan.onnx has no manifest
    snake = rows[1]
    assert snake["model"] == "public/snake.onnx"
    assert snake["manifest"] == "public/snake.json"
    assert snake["metrics"] == "public/snake.metrics.jsonl"
    assert snake["final_return"] == 1.5
    assert rows[0]["metrics"] is None
    assert get(server.url + snake["model"])[2] == b"not really onnx"


def test_paths_outside_the_site_are_not_served(server: PlayServer) -> None:
    assert get(server.url + "../pyproject.toml")[0] == 404
    assert get(server.url + "public/..%2F..%2Fpyproject.toml")[0] == 404
    assert get(server.url + "%2e%2e/pyproject.toml")[0] == 404


def test_a_model_given_by_path_is_served_under_models(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "snake-1"
    run_dir.mkdir(parents=True)
    (run_dir / "model.onnx").write_bytes(b"onnx bytes")
    (run_dir / "manifest.json").write_text(json.dumps({"env": "snake", "grid_size": 10}))
    (run_dir / "metrics.jsonl").write_text("{}\n")
    extra = ModelFiles.from_model_path(run_dir / "model.onnx")
    assert extra.name == "snake-1"
    with PlayServer(Site(web_dir=WEB, public_dir=tmp_path / "empty", extra=extra), port=0) as srv:
        rows = json.loads(get(srv.url + "api/models")[2])["models"]
        assert rows[0]["model"] == "models/snake-1.onnx"
        assert get(srv.url + rows[0]["model"])[2] == b"onnx bytes"
        assert get(srv.url + rows[0]["metrics"])[0] == 200
        assert get(srv.url + "models/other.onnx")[0] == 404


def test_no_model_is_an_error_naming_the_train_command(tmp_path: Path) -> None:
    assert find_models(tmp_path) == []
    site = Site(web_dir=WEB, public_dir=tmp_path)
    if not ORT_DIST.is_dir():
        pytest.skip("web/node_modules is missing (make web-deps)")
    with pytest.raises(ThrustError, match="no model to play") as info:
        site.check()
    assert "thrust-remote train snake" in (info.value.hint or "")


def test_busy_port_is_an_error_with_a_hint() -> None:
    with PlayServer(Site(web_dir=WEB), port=0) as srv, pytest.raises(ThrustError, match="cannot listen") as info:
        PlayServer(Site(web_dir=WEB), port=srv.port)
    assert "--port 0" in (info.value.hint or "")


def cli_env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}


def test_cli_without_a_model_exits_1_and_says_how_to_make_one(tmp_path: Path) -> None:
    if not ORT_DIST.is_dir():
        pytest.skip("web/node_modules is missing (make web-deps)")
    result = subprocess.run(
        [*CLI, "play", "--public", str(tmp_path), "--no-open", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "no model to play" in result.stderr
    assert "thrust-remote train snake" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_with_a_missing_model_path_exits_1(tmp_path: Path) -> None:
    result = subprocess.run(
        [*CLI, "play", "--model", str(tmp_path / "nope.onnx"), "--no-open"],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=False,
    )
    assert result.returncode == 1
    assert "model file not found" in result.stderr


def test_cli_serves_and_prints_the_url(tmp_path: Path) -> None:
    if not ORT_DIST.is_dir():
        pytest.skip("web/node_modules is missing (make web-deps)")
    fake_model(tmp_path, "snake")
    proc = subprocess.Popen(
        [*CLI, "play", "--public", str(tmp_path), "--no-open", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        deadline = time.monotonic() + 30
        url = None
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            match = re.search(r"http://127\.0\.0\.1:\d+/", line)
            url = match.group(0) if match else None
        assert url, f"no URL printed; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        status, headers, _ = get(url)
        assert status == 200
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert json.loads(get(url + "api/models")[2])["models"][0]["name"] == "snake"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_manifest_json_naming_the_model_pairs_with_it(tmp_path: Path) -> None:
    """`python -m trainer.train --export web/public/snake.onnx` writes manifest.json beside the model."""
    (tmp_path / "snake.onnx").write_bytes(b"x")
    (tmp_path / "other.onnx").write_bytes(b"y")
    (tmp_path / "manifest.json").write_text(json.dumps({"file": "snake.onnx", "env": "snake"}))
    found = find_models(tmp_path)
    assert [(m.name, m.manifest.name) for m in found] == [("snake", "manifest.json")]


def test_cli_lists_the_models_of_the_project_in_thrust_yaml(tmp_path: Path) -> None:
    """A project elsewhere: `thrust-remote play` there serves what its jobs exported."""
    if not ORT_DIST.is_dir():
        pytest.skip("web/node_modules is missing (make web-deps)")
    (tmp_path / "thrust.yaml").write_text("jobs:\n  snake:\n    export: models/snake.onnx\n")
    fake_model(tmp_path / "models", "snake")
    proc = subprocess.Popen(
        [*CLI, "play", "--no-open", "--port", "0"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "models: snake" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_a_usage_error_not_an_internal_one(port: str) -> None:
    result = subprocess.run([*CLI, "play", "--no-open", "--port", port], capture_output=True, text=True,
                            timeout=60, env=cli_env(), check=False)
    assert result.returncode == 64, result.stderr
    assert "--port" in result.stderr and "internal error" not in result.stderr


def test_version_prints_the_installed_version() -> None:
    from importlib.metadata import version

    result = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60, env=cli_env(),
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"thrust-remote {version('thrust-remote')}"


def kept_model(project: Path, run_id: str, fetched_at: str, **info: object) -> Path:
    """A kept model as `fetch` leaves it: .thrust/fetched/<run-id>/ with fetch.json."""
    run = project / ".thrust" / "fetched" / run_id
    fake_model(run, "model", env=info.pop("env", "snake"), sha256=f"sha-{run_id}")
    (run / "model.json").rename(run / "manifest.json")
    (run / "metrics.jsonl").write_text('{"step": 1, "score_mean": 3.5}\n')
    (run / "fetch.json").write_text(json.dumps({"run_id": run_id, "host": "sandbox", "job": "snake",
                                                "state": "FINISHED", "steps": 5, "score": 3.5, "score_kind": "apples",
                                                "fetched_at": fetched_at, "sha256": f"sha-{run_id}", **info}))
    return run


def test_api_models_lists_the_kept_models_newest_first_and_serves_them(tmp_path: Path) -> None:
    public = tmp_path / "web" / "public"
    fake_model(public, "snake", sha256="sha-snake-b", final_return=1.0)
    kept_model(tmp_path, "snake-a", "2026-11-23T10:00:00.000+00:00", state="STOPPED")
    kept_model(tmp_path, "snake-b", "2026-11-23T12:00:00.000+00:00", steps=300_000)
    kept_model(tmp_path, "cartpole-c", "2026-11-23T11:00:00.000+00:00", env="cartpole", job="cartpole")
    (tmp_path / ".thrust" / "fetched" / ".incoming-snake-d-x").mkdir()  # a fetch in progress
    site = Site(web_dir=WEB, public_dir=public, project_root=tmp_path)
    with PlayServer(site, port=0) as srv:
        rows = json.loads(get(srv.url + "api/models")[2])["models"]
        assert [(r["name"], r["group"]) for r in rows] == [
            ("snake", "placed"), ("snake-b", "kept"), ("cartpole-c", "kept"), ("snake-a", "kept")]
        assert rows[0]["run_id"] == "snake-b"  # the placed model is that kept run's
        b = rows[1]
        assert (b["steps"], b["score"], b["score_kind"], b["state"], b["placed"]) == (300_000, 3.5, "apples",
                                                                                      "FINISHED", True)
        assert rows[3]["state"] == "STOPPED" and rows[3]["placed"] is False
        assert [r["playable"] for r in rows] == [True, True, False, True]
        assert get(srv.url + b["model"])[2] == b"not really onnx"
        assert get(srv.url + b["metrics"])[0] == 200
        assert get(srv.url + "kept/snake-b/fetch.json")[0] == 200
        for path in ("kept/snake-b/other.txt", "kept/.incoming-snake-d-x/model.onnx", "kept/snake-b/../../thrust.yaml",
                     "kept/..%2F..%2Fthrust.yaml/model.onnx"):
            assert get(srv.url + path)[0] == 404, path


def test_cli_says_which_models_the_page_cannot_play(tmp_path: Path) -> None:
    if not ORT_DIST.is_dir():
        pytest.skip("web/node_modules is missing (make web-deps)")
    fake_model(tmp_path / "web" / "public", "snake")
    kept_model(tmp_path, "cartpole-c", "2026-11-23T11:00:00.000+00:00", env="cartpole", job="cartpole")
    proc = subprocess.Popen([*CLI, "play", "--public", str(tmp_path / "web" / "public"), "--no-open", "--port", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert proc.stdout is not None
        first, second = proc.stdout.readline(), proc.stdout.readline()
        assert "models: snake; 1 kept" in first, first
        assert "not playable" in second and "cartpole-c" in second and "snake only" in second, second
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
