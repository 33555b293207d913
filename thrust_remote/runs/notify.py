"""Telling the user a run ended: `notify:` in thrust.yaml (docs/architecture.md, "Notifications").

A command (argv, never a shell string) with the run in its environment, a webhook (one JSON POST with a
Slack-compatible `text`), a desktop notification where notify-send or osascript exists. Each run is told
once: a marker file made with O_EXCL in the local index, so two followers of one run (a `train` and a
`wait`) cannot both tell it. A notifier that fails is a warning, never a failed run, and the webhook's
URL (a secret: whoever has it can post) is never in a command line, a message or a log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from thrust_remote.core.config import NotifyConfig
from thrust_remote.core.names import valid_id
from thrust_remote.runs.index import index_dir

Warn = Callable[[str], None]
TIMEOUT_S = 15.0  # a notifier that hangs must not hold the command that ended


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


def first_time(root: Path, run_id: str) -> bool:
    """True for the one caller that claims telling `run_id`'s end (an exclusive create), else False."""
    if not valid_id(run_id):
        return False
    where = index_dir(root)
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd = os.open(where / f"{run_id}.notified", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True  # no index to record it in: telling twice beats never telling
    os.close(fd)
    return True


def tell(cfg: NotifyConfig, ended: Ended, warn: Warn, *, cwd: Path | None = None,
         environ: Mapping[str, str] | None = None) -> None:
    """Every notifier `cfg` names, each failure a warning. The command runs in `cwd` (thrust.yaml's
    directory: `./notify.sh` is the project's, wherever the command that saw the end was typed)."""
    env = dict(os.environ if environ is None else environ)
    if cfg.command:
        _command(cfg.command, ended, env, warn, cwd)
    if cfg.webhook:
        _webhook(cfg.webhook, ended, env, warn)
    if cfg.desktop:
        _desktop(ended, warn)


def _command(argv: tuple[str, ...], ended: Ended, env: dict[str, str], warn: Warn, cwd: Path | None) -> None:
    try:
        proc = subprocess.run(list(argv), env={**env, **ended.env()}, stdin=subprocess.DEVNULL, cwd=cwd,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        warn(f"the notify command {argv[0]!r} did not run: {exc}")
        return
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
        warn(f"the notify command {argv[0]!r} exited {proc.returncode}" + (f": {tail[0]}" if tail else ""))


def webhook_url(spec: str, env: Mapping[str, str]) -> str | None:
    """The URL itself: `spec`, or the value of the variable `$NAME`/`${NAME}` names (None: unset)."""
    if not spec.startswith("$"):
        return spec
    value = env.get(spec.lstrip("$").strip("{}"), "").strip()
    return value or None


def _webhook(spec: str, ended: Ended, env: dict[str, str], warn: Warn) -> None:
    url = webhook_url(spec, env)
    if url is None:
        warn(f"notify webhook: {spec} is not set in this environment; nothing was posted")
        return
    if not url.startswith(("https://", "http://")):
        warn(f"notify webhook: the value of {spec} is not an http(s):// URL; nothing was posted")
        return
    import urllib.error  # ~20 ms of every command's start, for a webhook that few runs post
    import urllib.request

    body = json.dumps({"text": ended.text, "run_id": ended.run_id, "state": ended.state, "reason": ended.reason,
                       "exit_code": ended.exit_code, "host": ended.host, "job": ended.job}).encode()
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "thrust-remote"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310 (http(s) only, above)
            answer.read(1024)
    except urllib.error.HTTPError as exc:
        warn(f"notify webhook: the server answered {exc.code} {exc.reason}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        warn(f"notify webhook: not delivered ({str(reason).replace(url, '<webhook>')})")


def _desktop(ended: Ended, warn: Warn) -> None:
    if shutil.which("notify-send"):
        argv = ["notify-send", "thrust-remote", ended.text]
    elif shutil.which("osascript"):
        # AppleScript's string literal takes JSON's quoting of quotes and backslashes
        argv = ["osascript", "-e", f"display notification {json.dumps(ended.text)} with title \"thrust-remote\""]
    else:
        warn("notify desktop: neither notify-send nor osascript is on PATH here")
        return
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        warn(f"notify desktop: {exc}")
