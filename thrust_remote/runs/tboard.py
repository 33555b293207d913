"""`thrust-remote tensorboard RUN_ID`: a TensorBoard on a run (docs/architecture.md, "TensorBoard").

Local (the default): this machine's TensorBoard (the optional `thrust-remote[tensorboard]`) on the
fetched artifacts, `.thrust/fetched/<run>/artifacts/<metrics.tensorboard>` (the whole artifacts dir
when the job names no TensorBoard dir). `--remote`: the job's own python on the host (run.json's
THRUST_PYTHON: its venv) runs `-m tensorboard.main` bound to 127.0.0.1 on a port it picks, on a pty
so it ends with the command; the user reaches it through a local forward over the same SSH
connection (ssh/forward.py). Nothing here prints: `on_ready` gets the URL.

Neither TensorBoard outlives the command: a SIGTERM or SIGHUP to the command alone (a process manager,
`kill PID`) is raised as `Ended` in the main thread, as Ctrl-C is, so the local child is ended and the
host's pty hung up on the way out (`ended_by_signals`, `serve_local`, `serve_remote`).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

from thrust_remote.core.config import Config, JobConfig
from thrust_remote.core.errors import ExitCode, ThrustError, UsageError
from thrust_remote.core.hints import command_hint
from thrust_remote.fetch import artifacts
from thrust_remote.host.session import HostSession
from thrust_remote.runs import control, index

INSTALL_HINT = "pip install 'thrust-remote[tensorboard]'"
DEFAULT_PORT = 6006
URL = re.compile(rb"http://127\.0\.0\.1:(\d+)/")
START_S = 120.0  # a TensorBoard on a loaded host takes seconds to import and scan its dir
STOP_S = 10.0  # a TensorBoard ends within a second of SIGTERM; one that does not is SIGKILLed after this
ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Ended(BaseException):  # noqa: N818 - named as KeyboardInterrupt is: a way to stop, not an error
    """A SIGTERM or SIGHUP to the command, raised in the main thread like Ctrl-C's KeyboardInterrupt, so
    every `finally` on the way out runs (the child ended, the pty hung up) before the command dies of
    `signum`. A BaseException: no `except Exception` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def ended_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Ended` inside the block (a SIGHUP ignored by whoever started us, as
    under nohup, stays ignored). Only the first raises: a second during the clean-up must not cut it
    short, so from then on they are ignored until the block has been left."""

    def ended(signum: int, _frame: FrameType | None) -> None:
        for sig in handled:
            signal.signal(sig, signal.SIG_IGN)
        raise Ended(signum)

    handled = [sig for sig in ENDING_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN]
    previous = {sig: signal.signal(sig, ended) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve_local(argv: list[str]) -> int:
    """Run this machine's TensorBoard until it ends: its exit code. Whatever stops us first (Ctrl-C,
    `Ended`) ends it before it propagates: a TensorBoard left behind, adopted by init, would keep
    serving the port."""
    child = subprocess.Popen(argv)  # noqa: S603 - argv, no shell
    try:
        return child.wait()
    finally:
        _stop(child)


def _stop(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM (TensorBoard's own handler ends it, its data server with it), SIGKILL if it lingers."""
    if child.poll() is None:
        child.terminate()
    try:
        child.wait(STOP_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def tensorboard_argv(python: str, logdir: str, port: int) -> list[str]:
    """TensorBoard bound to loopback only: reached through the forward, never from the network."""
    return [python, "-m", "tensorboard.main", "--logdir", logdir, "--host", "127.0.0.1", "--port", str(port)]


def require_tensorboard() -> None:
    """Exit 69 with the install command when this python has no tensorboard."""
    try:
        import tensorboard  # noqa: F401 - only whether it imports
    except ImportError:
        raise ThrustError("tensorboard is not installed here", f"install it with: {INSTALL_HINT}",
                          exit_code=ExitCode.UNAVAILABLE) from None


def job_of(config: Config, run_id: str, job_name: str | None = None) -> JobConfig | None:
    """The run's job: the name given (an unknown one is 64), else the one the local index recorded; None
    when unknown."""
    if job_name:
        return config.job(job_name)
    name = entry.job if (entry := index.lookup(config.root, run_id)) else None
    return config.jobs.get(name) if name else None


def local_logdir(config: Config, run_id: str, job: JobConfig | None, host: str | None = None) -> Path:
    """The fetched artifacts' TensorBoard dir (or all of them); a usage error when nothing was fetched,
    whose fetch names the host (`host`: the --host given) and the --config this command was given."""
    dest = artifacts.artifacts_dir(config.root, run_id)
    if not dest.is_dir():
        fetch = command_hint("fetch", run_id, host=host, config=config.given_path)
        raise UsageError(f"run {run_id} has no fetched artifacts in {dest}",
                         f"fetch them with: {fetch}, or see the host's with --remote")
    sub = job.metrics.tensorboard if job else None
    return dest / sub if sub and (dest / sub).is_dir() else dest


def remote_plan(session: HostSession, run_id: str, job: JobConfig | None) -> tuple[list[str], str]:
    """(argv, logdir) of the host's TensorBoard: the job's python, its TensorBoard dir under the run's
    cwd (the run dir when the job names none); port 0: TensorBoard picks a free one and says it."""
    run_dir = session.paths.run(run_id)
    meta = control.read_run_json(session, run_dir)
    if meta is None:
        raise UsageError(f"run {run_id} is not on {session.name} (no {run_dir}/run.json)",
                         f"list the runs there with: {command_hint('runs', host=session.host)}")
    cwd = str(meta.get("cwd") or session.paths.workdir)
    env = meta.get("env")
    python = str((env.get("THRUST_PYTHON") if isinstance(env, dict) else None) or session.host.python)
    sub = job.metrics.tensorboard if job else None
    logdir = f"{cwd}/{sub}" if sub else run_dir
    return tensorboard_argv(python, logdir, 0), logdir


def wait_for_url(read: Callable[[float], bytes | None], deadline_s: float = START_S) -> tuple[int | None, bytes]:
    """Read a starting TensorBoard's output until it names its port: (port, output); port None when it
    ended first (`read` returned None) or took longer than deadline_s."""
    said = b""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        chunk = read(min(1.0, max(0.0, deadline - time.monotonic())))
        if chunk is None:
            break
        said += chunk
        if match := URL.search(said):
            return int(match.group(1)), said
    return None, said


def start_failed(session: HostSession, said: bytes) -> ThrustError:
    text = said.decode("utf-8", "replace").replace("\r", "")
    tail = " / ".join(line for line in text.strip().splitlines()[-3:] if line.strip())
    # `python -m tensorboard.main` says it quoted (ModuleNotFoundError), `import` errors unquoted
    if re.search(r"No module named '?tensorboard\b", text):
        return ThrustError(f"tensorboard is not installed in the job's python on {session.name}",
                           "add tensorboard to the job's `requirements:` (what writes the events has it)",
                           exit_code=ExitCode.UNAVAILABLE)
    return ThrustError(f"TensorBoard did not start on {session.name}: {tail or 'no output'}",
                       exit_code=ExitCode.UNAVAILABLE)


def serve_remote(session: HostSession, argv: list[str], local_port: int, on_ready: Callable[[str], None]) -> None:
    """Start the host's TensorBoard, forward 127.0.0.1:local_port to it, call on_ready(url), and keep
    both until TensorBoard ends or Ctrl-C (KeyboardInterrupt, re-raised after the hang-up)."""
    from thrust_remote.host.ssh.forward import ChannelReader, LocalForward, hang_up, open_pty_command

    if session.host.is_local:
        raise UsageError("--remote is for an SSH host: a run on host `local` is on this machine already",
                         "run it without --remote after a fetch")
    transport = session.runner.transport  # type: ignore[attr-defined] - an SSHRunner (not local)
    chan = open_pty_command(transport(), argv, login=session.runner.login)  # type: ignore[attr-defined]
    output = ChannelReader(chan)
    try:
        port, said = wait_for_url(output.read)
        if port is None:
            raise start_failed(session, said)
        with LocalForward(transport, ("127.0.0.1", port), local_port) as forward:
            on_ready(f"http://127.0.0.1:{forward.port}/")
            while output.read(1.0) is not None:
                pass  # TensorBoard's own lines; it runs until it ends or the user stops us
    finally:
        hang_up(chan)
