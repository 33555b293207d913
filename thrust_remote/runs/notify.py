"""Telling the user a run ended: `notify:` in thrust.yaml (docs/architecture.md, "Notifications").

A command (argv, never a shell string) with the run in its environment, a webhook (one JSON POST with a
Slack-compatible `text`), a desktop notification where notify-send or osascript exists. The whole
notification of one ended run has one deadline (TIMEOUT_S): its notifiers run one after the other, each
with what is left of it, so a webhook that dribbles its answer cannot hold the command that saw the end.

Each run is told once: the follower that holds the run's claim (an flock on `.thrust/index/<run>.telling`)
tells it and, once its notifiers are done, marks it told (`<run>.notified`); two followers of one run (a
`train` and a `wait`) cannot both tell it, and a claim whose owner died (Ctrl-C mid-send, a crash) is the
next follower's: the kernel drops a dead process's lock. A notifier that fails is a warning, never a
failed run, and the webhook's URL (a secret: whoever has it can post) is never in a command line, a
message or a log.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from thrust_remote.agent.files import lock_within
from thrust_remote.core.config import NotifyConfig, webhook_problem
from thrust_remote.core.names import valid_id
from thrust_remote.runs.index import index_dir

Warn = Callable[[str], None]
TIMEOUT_S = 15.0  # the whole notification of one ended run: it must not hold the command that saw the end
CLAIM_POLL_S = 0.05
TAIL_BYTES = 4096  # of a notify command's output: its last line goes into the warning


@dataclass(frozen=True)
class Ended:
    """What ended: a run (or an optimize study, `run_id` its name)."""

    run_id: str
    state: str
    exit_code: int | None
    host: str
    job: str
    reason: str = ""  # a STOPPED run's reason other than a stop on request (`idle`)

    @property
    def text(self) -> str:
        code = "" if self.exit_code is None else f" (exit code {self.exit_code})"
        why = f" [{self.reason}]" if self.reason else ""
        return f"thrust-remote: {self.job} run {self.run_id} on {self.host} ended {self.state}{why}{code}"

    def env(self) -> dict[str, str]:
        return {"THRUST_RUN_ID": self.run_id, "THRUST_RUN_STATE": self.state,
                "THRUST_EXIT_CODE": "" if self.exit_code is None else str(self.exit_code),
                "THRUST_HOST": self.host, "THRUST_JOB": self.job, "THRUST_RUN_REASON": self.reason}


# ------------------------------------------------------------------------------------------ once per run

@contextlib.contextmanager
def claim(root: Path, run_id: str, *, wait_s: float = TIMEOUT_S + 5.0) -> Iterator[bool]:
    """True for the one follower that tells `run_id`'s end, else False (told already, or being told by
    another follower that stays alive). Told means marked once the block ends normally; an exception
    (Ctrl-C while a notifier runs) leaves it untold, and the claim goes with the process. A claim held by
    another follower is waited for (its telling is bounded: `wait_s`), so a follower that dies mid-send
    is taken over by one still here."""
    if not valid_id(run_id):
        yield False
        return
    where = index_dir(root)
    if _told(where, run_id):
        yield False
        return
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(where / f"{run_id}.telling", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield True  # no index to record it in: telling twice beats never telling
        return
    try:
        # never told twice: a holder that outlives its own deadline keeps it
        if not lock_within(fd, wait_s, CLAIM_POLL_S) or _told(where, run_id):
            yield False
            return
        yield True
        _mark_told(where, run_id)
    finally:
        os.close(fd)  # the lock goes with it


def _told(where: Path, run_id: str) -> bool:
    return (where / f"{run_id}.notified").exists()


def _mark_told(where: Path, run_id: str) -> None:
    with contextlib.suppress(OSError):  # a read-only index: a later follower tells it again
        os.close(os.open(where / f"{run_id}.notified", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        # once marked, the claim file is no longer needed: whoever opened it finds the mark under its lock
        (where / f"{run_id}.telling").unlink()


# ------------------------------------------------------------------------------------------ telling

def tell(cfg: NotifyConfig, ended: Ended, warn: Warn, *, cwd: Path | None = None,
         environ: Mapping[str, str] | None = None) -> None:
    """Every notifier `cfg` names, one after the other within TIMEOUT_S for them all, each failure a
    warning. The command runs in `cwd` (thrust.yaml's directory: `./notify.sh` is the project's,
    wherever the command that saw the end was typed)."""
    env = dict(os.environ if environ is None else environ)
    deadline = time.monotonic() + TIMEOUT_S
    notifiers: list[tuple[str, Callable[[], None]]] = []
    if cfg.command:
        command = cfg.command
        notifiers.append((f"the notify command {command[0]!r}",
                          lambda: _command(command, ended, env, warn, cwd, deadline)))
    if cfg.webhook:
        spec = cfg.webhook
        notifiers.append(("notify webhook", lambda: _webhook(spec, ended, env, warn, deadline)))
    if cfg.desktop:
        notifiers.append(("notify desktop", lambda: _desktop(ended, warn, deadline)))
    for what, notifier in notifiers:
        if time.monotonic() >= deadline:
            warn(f"{what}: not run, the notification's {TIMEOUT_S:g} s were spent by the ones before it")
            continue
        notifier()


def _run_bounded(argv: Sequence[str], env: Mapping[str, str] | None, cwd: Path | None,
                 deadline: float) -> tuple[int | None, str]:
    """`argv`'s exit status (None: still going at the deadline, then killed with its process group) and
    the last line it printed. Its output goes to a file, not a pipe: a background child that keeps the
    pipe open must not make a command that exited look hung (the command's own exit is what counts)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(list(argv), env=None if env is None else dict(env), cwd=cwd,  # noqa: S603 argv
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        except BaseException:  # Ctrl-C: the notifier goes with the command that started it
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
        return code, _last_line(out)


def _last_line(fh: IO[bytes]) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - TAIL_BYTES))
    lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


def _command(argv: tuple[str, ...], ended: Ended, env: dict[str, str], warn: Warn, cwd: Path | None,
             deadline: float) -> None:
    try:
        code, tail = _run_bounded(argv, {**env, **ended.env()}, cwd, deadline)
    except OSError as exc:
        warn(f"the notify command {argv[0]!r} did not run: {exc}")
        return
    if code is None:
        warn(f"the notify command {argv[0]!r} did not end within the notification's {TIMEOUT_S:g} s: stopped")
    elif code != 0:
        warn(f"the notify command {argv[0]!r} exited {code}" + (f": {tail}" if tail else ""))


def webhook_url(spec: str, env: Mapping[str, str]) -> str | None:
    """The URL itself: `spec`, or the value of the variable `$NAME`/`${NAME}` names (None: unset)."""
    if not spec.startswith("$"):
        return spec
    value = env.get(spec.lstrip("$").strip("{}"), "").strip()
    return value or None


def _webhook(spec: str, ended: Ended, env: dict[str, str], warn: Warn, deadline: float) -> None:
    url = webhook_url(spec, env)
    if url is None:
        warn(f"notify webhook: {spec} is not set in this environment; nothing was posted")
        return
    problem = webhook_problem(url)  # a literal URL was checked with the config; a variable's value is now
    if problem:
        warn(f"notify webhook: the value of {spec} is not a usable URL ({problem}); nothing was posted")
        return
    body = json.dumps({"text": ended.text, "run_id": ended.run_id, "state": ended.state, "reason": ended.reason,
                       "exit_code": ended.exit_code, "host": ended.host, "job": ended.job}).encode()
    said: list[str] = []
    # the POST in a thread of its own, waited for until the deadline: urllib's timeout is per socket
    # read, and a server that sends a byte every few seconds would never reach it
    sender = threading.Thread(target=_post, args=(url, body, deadline, said), name="notify-webhook", daemon=True)
    sender.start()
    sender.join(max(0.0, deadline - time.monotonic()))
    if sender.is_alive():
        warn(f"notify webhook: no answer within the notification's {TIMEOUT_S:g} s; left unanswered")
    elif said:
        warn(f"notify webhook: {said[0]}")


def _post(url: str, body: bytes, deadline: float, said: list[str]) -> None:
    """One POST of `body`; what went wrong (never the URL) into `said`. A redirect is not followed: urllib
    would send the POST on as a GET without its body, and the run's end would be lost without a word."""
    import http.client  # ~20 ms of every command's start, for a webhook that few runs post
    import urllib.error
    import urllib.request

    bare, auth = _without_userinfo(url)
    headers = {"Content-Type": "application/json", "User-Agent": "thrust-remote", **auth}
    request = urllib.request.Request(bare, data=body, method="POST", headers=headers)
    opener = urllib.request.build_opener(_no_redirect_handler())
    try:
        with opener.open(request, timeout=max(0.1, deadline - time.monotonic())) as answer:
            answer.read(1024)
    except urllib.error.HTTPError as exc:
        moved = " (a redirect: not followed, a POST is not sent on; give the URL it points to)" \
            if 300 <= exc.code < 400 else ""
        said.append(f"the server answered {exc.code} {exc.reason}{moved}; not delivered")
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        said.append(f"not delivered ({type(exc).__name__}: {str(reason).replace(bare, '<webhook>')})")


def _without_userinfo(url: str) -> tuple[str, dict[str, str]]:
    """A URL with `user:password@` sends them as HTTP basic auth (urllib would take them for the port)."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None:
        return url, {}
    host = parts.netloc.rpartition("@")[2]
    token = base64.b64encode(f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), {"Authorization": f"Basic {token}"}


def _no_redirect_handler() -> type:
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_args: object, **_kwargs: object) -> None:
            return None  # urllib then raises the 3xx as an HTTPError

    return NoRedirect


def _desktop(ended: Ended, warn: Warn, deadline: float) -> None:
    if shutil.which("notify-send"):
        argv = ["notify-send", "thrust-remote", ended.text]
    elif shutil.which("osascript"):
        # AppleScript's string literal takes JSON's quoting of quotes and backslashes
        argv = ["osascript", "-e", f"display notification {json.dumps(ended.text)} with title \"thrust-remote\""]
    else:
        warn("notify desktop: neither notify-send nor osascript is on PATH here")
        return
    try:
        code, _tail = _run_bounded(argv, None, None, deadline)
    except OSError as exc:
        warn(f"notify desktop: {exc}")
        return
    if code is None:
        warn(f"notify desktop: {argv[0]} did not end within the notification's {TIMEOUT_S:g} s: stopped")
