"""The programs thrust-remote runs on a host, shipped as zipapps uploaded by content hash.

Three payloads: envcheck (doctor's checklist), the host agent (thrust_remote/agent: runs, checkout,
probes, poll, lease, venv...) and the built-in trainer (trainer/, run by `kind: trainer` jobs with the
job's venv python). All are built here the same way, deterministically (sorted files, fixed
timestamps and modes, so the same code gives the same bytes and the same hash), and live on the host
as `~/.cache/thrust-remote/<name>-<sha16>.pyz`: outside any workdir (the agent runs before the first
sync, which clones into an empty workdir), and versions never mix.

`run_pyz` runs `[python, pyz, *args]` as an argv. It never checks first whether the file is there:
the common case is one remote command. When python answers that it cannot open the file (exit 2),
the payload is uploaded and the command run again; when python itself is missing (127) the error is
the clear one doctor has always given (exit 69). See docs/architecture.md, "The host agent".
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from envcheck.checks import choose_python
from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ExitCode, ThrustError, UnreachableError
from thrust_remote.core.hints import command_hint, config_file
from thrust_remote.host.runner import BytesCallback, Runner, RunResult, expand_home

CACHE_DIR = "~/.cache/thrust-remote"
NO_PYTHON_EXIT = 127
CANNOT_OPEN_EXIT = 2  # python's exit status for "can't open file"
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Payload:
    name: str
    data: bytes
    sha256: str

    @property
    def remote(self) -> str:
        """Where it lives on a host (`~` is the host's home)."""
        return f"{CACHE_DIR}/{self.name}-{self.sha256[:16]}.pyz"


def build_zipapp(name: str, package_dir: Path, package: str, entry_module: str, *, as_main: bool = False) -> Payload:
    """`package_dir`'s .py files (subpackages too) as package `package` in a zipapp whose __main__ runs
    `package.entry_module.main`, or with `as_main` runs that module as `python -m` would (its own
    `if __name__ == "__main__"` block included)."""
    buf = io.BytesIO()
    if as_main:
        module = f"{package}.{entry_module}"
        main = f"import runpy\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    else:
        main = f"import sys\nfrom {package}.{entry_module} import main\nsys.exit(main())\n"
    files = [("__main__.py", (_start_source() + "\n\nstart()\n" + main).encode())]
    sources = sorted(p.relative_to(package_dir) for p in package_dir.rglob("*.py") if "__pycache__" not in p.parts)
    files += [(f"{package}/{rel.as_posix()}", (package_dir / rel).read_bytes()) for rel in sources]
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files:
            info = zipfile.ZipInfo(arcname, date_time=_ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, data)
    data = buf.getvalue()
    return Payload(name, data, hashlib.sha256(data).hexdigest())


@lru_cache(maxsize=1)
def _start_source() -> str:
    """payload_start.py's text: the first lines of every payload's __main__.py (it unpacks the zipapp
    once beside itself, compiled, and runs from there)."""
    return (Path(__file__).with_name("payload_start.py")).read_text()


@lru_cache(maxsize=1)
def envcheck() -> Payload:
    import envcheck as package

    # __path__, not __file__: an editable install made before envcheck/__init__.py existed maps it
    # as a namespace package, whose __file__ is None
    return build_zipapp("envcheck", Path(next(iter(package.__path__))), "envcheck", "cli")


@lru_cache(maxsize=1)
def agent() -> Payload:
    from thrust_remote import agent as package

    # under its own name in the zip: on the host it is a top-level package, not part of thrust_remote
    return build_zipapp("agent", Path(next(iter(package.__path__))), "thrust_agent", "__main__")


@lru_cache(maxsize=1)
def trainer() -> Payload:
    """The built-in trainer (`kind: trainer`), so it runs from any project, not only from a checkout
    of this repository: `python trainer-<sha>.pyz FLAGS` is `python -m trainer.train FLAGS`, with the
    zipapp first on sys.path (a project's own `trainer/` directory cannot shadow it)."""
    # found, not imported: the laptop never imports the trainer's torch side (tests/test_layering.py)
    spec = importlib.util.find_spec("trainer")
    if spec is None or not spec.submodule_search_locations:
        raise ThrustError("the built-in trainer package is not installed next to thrust-remote",
                          "reinstall thrust-remote (its wheel carries trainer/)", ExitCode.CONFIG)
    return build_zipapp("trainer", Path(next(iter(spec.submodule_search_locations))), "trainer", "train",
                        as_main=True)


def upload(runner: Runner, payload: Payload) -> str:
    remote = expand_home(payload.remote, runner.home())
    with tempfile.TemporaryDirectory(prefix=f"thrust-{payload.name}-") as tmp:
        local = os.path.join(tmp, f"{payload.name}.pyz")
        with open(local, "wb") as fh:
            fh.write(payload.data)
        got = runner.put(local, remote)
    if got != payload.sha256:  # put verifies its own copy; this catches a stale file at the same path
        raise ThrustError(f"{payload.name} upload to {runner.name} has sha256 {got}, expected {payload.sha256}",
                          exit_code=ExitCode.TRANSFER)
    return remote


def python_of(runner: Runner, host: HostConfig) -> str:
    """The host's python as an argv[0]: `~/x` made absolute (an argument is quoted, so no shell expands it)."""
    return expand_home(host.python, runner.home()) if host.python.startswith("~") else host.python


class _ErrTail:
    """Keeps the start of stderr while bytes stream to the caller: enough to recognise python's
    "can't open file" in a command whose output is not kept."""

    def __init__(self, forward: BytesCallback) -> None:
        self.forward = forward
        self.err = b""

    def __call__(self, name: str, chunk: bytes) -> None:
        if name == "err" and len(self.err) < 4096:
            self.err += chunk
        self.forward(name, chunk)


def _cannot_open(result: RunResult, stderr: str, remote: str) -> bool:
    return result.exit_code == CANNOT_OPEN_EXIT and "can't open file" in stderr and remote in stderr


def run_pyz(runner: Runner, host: HostConfig, payload: Payload, args: Sequence[str], *,
            timeout: float | None = None, stdin: bytes | None = None,
            on_bytes: BytesCallback | None = None, flags: Sequence[str] = ()) -> tuple[RunResult, bool]:
    """Run the payload with the host's python (and interpreter `flags`, such as -S); (result, whether
    it was uploaded on the way)."""
    remote = expand_home(payload.remote, runner.home())
    argv = [python_of(runner, host), *flags, remote, *args]

    def once() -> tuple[RunResult, str]:
        tail = _ErrTail(on_bytes) if on_bytes is not None else None
        result = runner.run(argv, timeout=timeout, stdin=stdin, on_bytes=tail)
        return result, tail.err.decode("utf-8", "replace") if tail is not None else result.stderr

    result, stderr = once()
    uploaded = False
    if _cannot_open(result, stderr, remote):
        upload(runner, payload)
        uploaded = True
        result, stderr = once()
    if result.exit_code == NO_PYTHON_EXIT:
        raise missing_python(runner, host)
    return result, uploaded


def missing_python(runner: Runner, host: HostConfig) -> UnreachableError:
    path = runner.run(["printenv", "PATH"], timeout=30)
    return UnreachableError(f"{runner.name}: python '{python_of(runner, host)}' not found (PATH={path.stdout.strip()})",
                            python_hint(runner, host))


# what runs envcheck when `python:` cannot: the host's own python3, as a plain ssh session finds it
FALLBACK_PYTHONS = ("python3", "/usr/bin/python3")


def python_hint(runner: Runner, host: HostConfig) -> str:
    """The hint for a `python:` that cannot run thrust-remote there: the interpreter doctor finds with
    torch (offered_python) and a command that shows it works, else how to list the host's pythons. Never
    "check with doctor": doctor itself stops at the same `python:`."""
    where = f"under hosts.{host.name} in {config_file(host)}"
    offer = offered_python(runner, host)
    if offer:
        check = command_hint("exec", "--", offer, "-c", "import torch; print(torch.__version__)", host=host)
        return f"set `python: {offer}` {where} (it has torch there: {check} prints its version)"
    script = "which -a python3 python; ls -d ~/*/bin/python ~/.*/bin/python 2>/dev/null; true"
    listing = command_hint("exec", "--", "sh", "-c", script, host=host)
    return (f"set `python:` {where} to a Python 3.10+ with torch there (e.g. python: ~/venv/bin/python); "
            f"none with torch was found; the host's pythons: {listing}")


def offered_python(runner: Runner, host: HostConfig) -> str | None:
    """What doctor finds on the host: envcheck run by the first of FALLBACK_PYTHONS there; that python
    when it has torch, else the first other interpreter with torch it probed (the workdir's .venv, the
    venvs and conda envs under home...: envcheck.probe.python_candidates), as an absolute path."""
    for fallback in FALLBACK_PYTHONS:
        if fallback == python_of(runner, host) or not runner.run([fallback, "--version"], timeout=30).ok:
            continue
        try:
            result, _ = run_pyz(runner, replace(host, python=fallback), envcheck(),
                                ["--json", "--workdir", expand_home(host.workdir, runner.home()), "--host", host.name],
                                timeout=120)
            facts = json.loads(result.stdout.strip().splitlines()[-1])["facts"] if result.ok else None
        except (ThrustError, ValueError, IndexError, KeyError, TypeError):
            facts = None
        if not isinstance(facts, dict):
            continue
        if facts.get("torch"):
            return str(facts.get("python_path"))
        return choose_python(facts.get("other_pythons") or [], None)
    return None
