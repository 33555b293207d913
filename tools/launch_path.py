"""How far a `train` request travels: the files it enters and how often it bounces back to one it left.

    .venv/bin/python tools/launch_path.py [--show]

A real `train` of a tiny job on the host `local` (a new git project in a temporary directory, the
fake trainer of tests/), run in this process under a profiler that looks only at calls which are
handed the request: a frame of thrust_remote/ whose arguments include the `TrainRequest` or what it
becomes on a host (stages' Checked and Prepared, the Launched run), and, counted apart, its job's
`JobConfig` too (the request's job passed on to the stages' helpers). The files of those frames, in
the order the request's innermost holder changes (on each call and each return), are the request's
path. Printed for each: the files entered (distinct), the returns to a file it had left (a change
back to a file seen before on the path), and with --show the path itself.

The returns count both ways back: a call into a file the path had left (a bounce: the request sent
back to a module it was in before) and the unwinding to a caller (every call a holder makes into
another file comes back to it once it returns, however straight the sequence). So the second figure,
the re-entries, counts the calls alone: a change to a file seen before made by a call, not by a
return. It is printed beside the first, never instead of it: the first is issue 52's measure.

What the request is resolved into once, for the helpers that need a piece of it (arguments.Arguments:
the job's words; data.JobData: its files:, setup:, shared:; jobs.JobFiles: the files it names;
fetching.Outputs: what it leaves to fetch), is not a carrier: a helper handed one of those is handed that
piece, not the request, as one handed the argv list is. Each is made from the job in one call, and that
call is counted (it is handed the job).

Why a tool and not a test: the figures are a design measure (docs/architecture.md, "The flow of one
train"), read when the launch path is reshaped; a test pinning them would fail on any honest change.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = str(ROOT / "thrust_remote") + os.sep

THRUST_YAML = """\
jobs:
  fake:
    script: tests/fake_train.py
    export: web/public/fake.onnx
    objective: {metric: return_mean, mode: max}
"""


class RequestPath:
    """The request's holders as calls enter and leave them: a stack per thread, one path for all."""

    def __init__(self, carriers: tuple[type, ...]) -> None:  # the request and what it becomes per host
        self.carriers = carriers
        self.stacks: dict[int, list[int]] = {}  # thread -> ids of the frames holding the request
        self.path: list[str] = []  # the innermost holder's file, each time it changes
        self.called: list[bool] = []  # whether that change came by a call (else by a return)
        self.lock = threading.Lock()

    def _holds(self, frame: FrameType) -> bool:
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE):
            return False
        count = code.co_argcount + code.co_kwonlyargcount
        names = code.co_varnames[:count]
        return any(isinstance(frame.f_locals.get(n), self.carriers) for n in names)

    def _note(self, frame: FrameType | None, *, called: bool) -> None:
        if frame is None:
            return
        name = os.path.relpath(frame.f_code.co_filename, ROOT)
        if not self.path or self.path[-1] != name:
            self.path.append(name)
            self.called.append(called)

    def profile(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return"):
            return
        stack = self.stacks.setdefault(threading.get_ident(), [])
        with self.lock:
            if event == "call" and self._holds(frame):
                stack.append(id(frame))
                self._note(frame, called=True)
            elif event == "return" and stack and stack[-1] == id(frame):
                stack.pop()
                if stack:  # back in the caller that holds the request: its file, as the path sees it
                    caller = frame.f_back
                    while caller is not None and not self._holds(caller):
                        caller = caller.f_back
                    self._note(caller, called=False)

    def figures(self) -> tuple[int, int, int]:
        """(files entered, returns to a file it had left, of those the ones made by a call)."""
        seen: set[str] = set()
        returns = reentries = 0
        for name, called in zip(self.path, self.called, strict=True):
            if name in seen:
                returns += 1
                reentries += called
            seen.add(name)
        return len(seen), returns, reentries


def _project(where: Path) -> Path:
    proj = where / "project"
    (proj / "tests").mkdir(parents=True)
    for name in ("fake_train.py", "tiny_onnx.py"):
        shutil.copyfile(ROOT / "tests" / name, proj / "tests" / name)
    (proj / "thrust.yaml").write_text(THRUST_YAML)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for argv in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "a project"]):
        subprocess.run(argv, cwd=proj, check=True, env=env)
    return proj


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the path, one file per change")
    opts = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from thrust_remote.cli.main import run
    from thrust_remote.core.config import JobConfig
    from thrust_remote.run.stages import Checked, Prepared
    from thrust_remote.run.vocab import Launched, TrainRequest

    request = (TrainRequest, Checked, Prepared, Launched)
    tracers = {"the request": RequestPath(request), "the request or its job": RequestPath((*request, JobConfig))}

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        for tracer in tracers.values():
            tracer.profile(frame, event, arg)

    with tempfile.TemporaryDirectory(prefix="thrust-launch-path-") as tmp:
        proj = _project(Path(tmp))
        cwd = os.getcwd()
        os.chdir(proj)
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            run(["train", "fake", "--host", "local", "--set", "seconds=0.3"])
        except SystemExit as exc:
            code = exc.code
        else:
            code = 0
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
            os.chdir(cwd)
    print(f"train exit {code}")
    for what, tracer in tracers.items():
        if opts.show:
            print(f"{what}:", *tracer.path, sep="\n  ")
        files, returns, reentries = tracer.figures()
        print(f"{what}: {files} files entered, {returns} returns to a file it had left "
              f"({reentries} of them calls into it again)")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
