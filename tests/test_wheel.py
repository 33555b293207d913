"""The wheel: built from this tree, installed into a fresh venv outside the repo with no torch,
gymnasium or onnxscript (a laptop's plain install: those are the `local` extra), it runs `doctor` and
trains the built-in `cartpole` over a real sshd from a project that has only a thrust.yaml, `play` serves
the page and the onnxruntime-web files it carries (thrust_remote/web-page/, staged as `make wheel`
does), and `--host local` names the one pip command that adds the trainer's packages.

Built offline (`pip wheel --no-build-isolation`, this venv's setuptools) from a copy of the tree, so the
checkout is not touched; `make wheel` runs the same staging, then `python -m build`. The new venv gets
the other dependencies from this venv's site-packages through a .pth naming a directory of links to
them, minus every trace of this repo's editable install (what imports as thrust_remote there is the
wheel's) and minus the `local` extra's packages. The sshd host's python is this venv's, with torch.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from email.message import Message
from pathlib import Path

import pytest
from helpers import CHROMIUM, REPO, TINY_TRAIN, export_policy, new_project

from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.core.hints import LOCAL_EXTRA_INSTALL
from thrust_remote.play import serve
from thrust_remote.play.serve import HEADLESS_CHROMIUM_ARGS, ORT_DIST, ORT_FILES, PlayServer, Site, stage_page

OURS = ("thrust_remote", "trainer", "envcheck", "__editable__", "thrust-remote")  # this repo's install
# pyproject's `local` extra (and torch's own companions): not on a laptop that only drives remote hosts
LOCAL_EXTRA = ("torch", "functorch", "torchgen", "gymnasium", "onnxscript")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "THRUST_CONFIG", "VIRTUAL_ENV")}
    return {**env, "COLUMNS": "200", "NO_COLOR": "1"}


def build_wheel(tmp: Path) -> Path:
    """The tree's files (tracked and untracked, not ignored) copied to tmp/src, the page staged into
    the copy's package, and a wheel built from it into tmp/wheels."""
    src = tmp / "src"
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        path = REPO / rel
        if rel.startswith("web/node_modules") or not path.is_file() or path.is_symlink():
            continue
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, src / rel)
    stage_page(REPO / "web", src / "thrust_remote" / "web-page")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "wheels"), str(src)], check=True, env=_clean_env(), capture_output=True)
    return next((tmp / "wheels").glob("thrust_remote-*.whl"))


def fresh_venv(path: Path, without: tuple[str, ...] = ()) -> Path:
    """A venv whose own site-packages is empty (no pip or setuptools of its own to shadow newer ones) and
    which sees this venv's third-party packages (not this repo, nor those named in `without`, modules and
    their dist-info alike) through a .pth; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and Path(p, "torch").is_dir())
    links = path.parent / "inherited-site-packages"
    links.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(OURS + without) and entry.suffix != ".pth":
            (links / entry.name).symlink_to(entry)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (path / "lib" / version / "site-packages" / "inherited.pth").write_text(f"{links}\n")
    return path / "bin" / "python"


def _get(url: str) -> tuple[int, Message, bytes]:
    """Status, headers (looked up case-insensitively) and body of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, b""


def _serve_and_check(exe: Path, project: Path, model: str, page: Path) -> str:
    """Start `thrust-remote play --model`, fetch the page and the ort files, stop it; returns its output."""
    proc = subprocess.Popen([str(exe), "play", "--model", model, "--no-open", "--port", "0"], cwd=project,
                            env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # play prints the URL once it listens; it exits (ending this) on error
            lines.append(line)
            if line.startswith("open http://"):
                break
        url = lines[-1].split()[1].split("?", 1)[0] if lines and lines[-1].startswith("open ") else None
        assert url, "".join(lines)
        status, headers, body = _get(url)
        assert status == 200 and body == (REPO / "web" / "index.html").read_bytes()
        assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
        assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert _get(url + "src/model.js")[2] == (REPO / "web" / "src" / "model.js").read_bytes()
        for name in ORT_FILES:
            status, headers, body = _get(f"{url}{ORT_DIST}/{name}")
            assert status == 200 and body == (page / ORT_DIST / name).read_bytes() and len(body) > 0
            assert headers["Content-Type"] == ("application/wasm" if name.endswith(".wasm") else "text/javascript")
            assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"
        assert _get(f"{url}{ORT_DIST}/ort.webgpu.min.mjs")[0] == 404  # only what the page loads is carried
        status, _headers, body = _get(url + "api/models")
        assert status == 200 and b'"name": "cartpole"' in body
        assert _get(url + "models/cartpole.onnx")[2] == (project / model).read_bytes()
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    return "".join(lines) + out


def _have_ort() -> bool:
    return all((REPO / "web" / ORT_DIST / name).is_file() for name in ORT_FILES)


def test_staging_without_onnxruntime_web_says_to_run_make_web_deps(tmp_path: Path) -> None:
    web = tmp_path / "web"
    (web / "src").mkdir(parents=True)
    (web / "index.html").write_text("<!doctype html>")
    with pytest.raises(ThrustError, match="ort-wasm-simd-threaded.wasm") as info:
        stage_page(web, tmp_path / "web-page")
    assert "make web-deps" in (info.value.hint or "")
    assert not (tmp_path / "web-page").exists()


@pytest.mark.parametrize("staged", [False, True])
def test_an_install_without_the_staged_page_says_to_build_with_make_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staged: bool
) -> None:
    """A wheel built without `make wheel`'s staging (`pip install .`): no page, or the page without
    onnxruntime-web, is a clear error naming `make wheel`, not a page that fails in the browser."""
    page = tmp_path / "site-packages" / "thrust_remote" / "web-page"
    page.mkdir(parents=True)
    if staged:
        (page / "index.html").write_text("<!doctype html>")
    monkeypatch.setattr(serve, "PACKAGED_WEB", page)  # where an installed package would look
    with pytest.raises(ThrustError, match="lacks the page or its onnxruntime-web files") as info:
        Site(web_dir=page, public_dir=tmp_path).check()
    assert "make wheel" in (info.value.hint or "") and "`pip install .` from a checkout" in (info.value.hint or "")
    assert info.value.exit_code == 69  # a part the install lacks: unavailable, not a failed job's 1


@pytest.mark.e2e  # the wheel built and run
@pytest.mark.browser
def test_the_staged_page_plays_in_chromium_with_only_the_ort_files_it_carries(tmp_path: Path) -> None:
    """What the wheel carries is enough: the staged copy (no node_modules beyond ORT_FILES) runs a model
    in real Chromium, cross-origin isolated (threads), and no request of the page fails."""
    if not CHROMIUM.exists() or not _have_ort():
        pytest.skip("needs /usr/bin/chromium and web/node_modules (make system-deps web-deps)")
    staged = tmp_path / "web-page"
    written = stage_page(REPO / "web", staged)
    assert sorted(p.name for p in written if ORT_DIST in p.as_posix()) == sorted(ORT_FILES)
    public = tmp_path / "public"
    public.mkdir()
    export_policy(public / "tiny.onnx")
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    failed: list[str] = []
    with PlayServer(Site(web_dir=staged, public_dir=public), port=0) as server, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=str(CHROMIUM),
                                                        headless=True, args=HEADLESS_CHROMIUM_ARGS)
        try:
            page = context.new_page()
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            page.goto(server.url + "?model=tiny&speed=max&seed=3")
            page.wait_for_function("window.thrust !== undefined")
            page.evaluate("window.thrust.ready")
            page.wait_for_function("window.thrust.state.moves >= 50", timeout=30_000)
            assert page.locator("#error").is_hidden(), page.locator("#error").text_content()
            assert page.evaluate("crossOriginIsolated") is True
        finally:
            context.close()
    assert errors == []
    assert failed == []


def _laptop_without_the_local_extra(python: Path, project: Path) -> None:
    """The plain install imports and helps without torch & co., and `--host local` says the one pip
    command that adds them: exit 69 (the host lacks torch), no traceback, nothing set up."""
    exe = python.parent / "thrust-remote"
    probe = subprocess.run([str(python), "-c", "import importlib.util, sys; import thrust_remote.cli.main; "
                            "print([m for m in ('torch', 'gymnasium', 'onnxscript') if importlib.util.find_spec(m)]); "
                            "print(sorted(m for m in sys.modules if m in ('torch', 'gymnasium', 'onnxscript')))"],
                           capture_output=True, text=True, env=_clean_env(), cwd=project, check=False)
    assert probe.returncode == 0 and probe.stdout.split() == ["[]", "[]"], probe.stdout + probe.stderr
    helped = subprocess.run([str(exe), "--help"], capture_output=True, text=True, env=_clean_env(), check=False)
    assert helped.returncode == 0 and "train" in helped.stdout, helped.stderr
    local = subprocess.run([str(exe), "train", "cartpole", "--host", "local", *TINY_TRAIN], cwd=project,
                           env=_clean_env(), capture_output=True, text=True, timeout=120, check=False)
    said = local.stdout + local.stderr
    assert local.returncode == ExitCode.UNAVAILABLE, said
    assert f"{python} has no torch, onnxscript, gymnasium" in said
    assert f"hint: {python} -m {LOCAL_EXTRA_INSTALL}   (on Linux without a GPU, first" in said
    assert "Traceback" not in said
    assert not (project / ".thrust" / "venvs").exists()  # stopped before any setup
    doctor = subprocess.run([str(exe), "doctor", "--host", "local", "--json"], cwd=project, env=_clean_env(),
                            capture_output=True, text=True, timeout=120, check=False)
    assert doctor.returncode == ExitCode.FAILED, doctor.stdout + doctor.stderr
    torch_row = next(c for c in json.loads(doctor.stdout)["checks"] if c["id"] == "torch-import")
    assert torch_row["status"] == "fail" and torch_row["fix"].endswith(f", then {python} -m {LOCAL_EXTRA_INSTALL}")


@pytest.mark.e2e  # the wheel built and run
@pytest.mark.slow
def test_wheel_without_torch_runs_doctor_trains_cartpole_on_a_host_and_plays(tmp_path, sshd, remote_dir):
    """A laptop's plain install: torch, gymnasium and onnxscript are the `local` extra, left out here, and
    the wheel installs (--no-index: its dependencies are all there without them) and drives the host."""
    if not _have_ort():
        pytest.skip("web/node_modules is missing (make web-deps)")
    wheel = build_wheel(tmp_path / "build")
    python = fresh_venv(tmp_path / "elsewhere" / "venv", without=LOCAL_EXTRA)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                              "--disable-pip-version-check", str(wheel)],
                             capture_output=True, text=True, env=_clean_env(), check=False)
    assert install.returncode == 0, install.stdout + install.stderr
    where = subprocess.run([str(python), "-c", "import thrust_remote, trainer; print(thrust_remote.__file__); "
                            "print(trainer.__file__)"], capture_output=True, text=True, env=_clean_env(),
                           cwd=tmp_path, check=True).stdout.split()
    venv = python.parent.parent
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the wheel's code, not this repo's
    page = Path(where[0]).parent / "web-page"
    assert (page / "index.html").is_file()

    project = new_project(tmp_path / "project", sshd, remote_dir / "thrust")
    assert sorted(p.name for p in project.iterdir()) == [".git", "thrust.yaml"]
    _laptop_without_the_local_extra(python, project)
    exe = venv / "bin" / "thrust-remote"
    doctor = subprocess.run([str(exe), "doctor"], cwd=project, env=_clean_env(), capture_output=True, text=True,
                            timeout=120, check=False)
    assert doctor.returncode == 0 and "torch-import" in doctor.stdout, doctor.stdout + doctor.stderr
    train = subprocess.run([str(exe), "train", "cartpole", *TINY_TRAIN], cwd=project, env=_clean_env(),
                           capture_output=True, text=True, timeout=300, check=False)
    assert train.returncode == 0, train.stderr
    run_id = train.stdout.split(":", 1)[0]
    status = subprocess.run([str(exe), "status", run_id, "--json"], cwd=project, env=_clean_env(),
                            capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(status.stdout)["state"] == "FINISHED"
    assert (project / "web" / "public" / "cartpole.onnx").stat().st_size > 0

    out = _serve_and_check(exe, project, "web/public/cartpole.onnx", page)
    assert f"serving {page}" in out
    assert "stopped" in out
