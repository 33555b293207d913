"""A study's driver lease on the host, and its stop file (docs/optimize.md, docs/architecture.md).

    agent lease read PATH                   {"present": bool, "text": str, "lease": {...}}
    agent lease create PATH   < BODY        {"created": bool}   exit 3 when PATH already exists
    agent lease renew PATH --token T < BODY {"renewed": bool}   exit 3 when PATH does not hold T
    agent lease release PATH --token T      {"released": bool}  (never another driver's lease)
    agent lease stop PATH                   {"path": PATH}      the study's stop file, with the date

BODY is the lease's JSON text (hostname, pid, heartbeat, token) on stdin. `lease` is {} when the
file is absent or not JSON (an unreadable lease counts as a dead driver's). create is O_EXCL: of two
drivers creating at once, one wins. renew and release compare and swap under an flock on PATH.lock,
so a driver that lost the lease can neither overwrite nor drop the new holder's.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator

from .files import write_atomic
from .protocol import AgentExit


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _text(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except FileNotFoundError:
        return None


def read(path: str) -> dict:
    text = _text(path) or ""
    try:
        lease = json.loads(text) if text.strip() else {}
    except ValueError:
        lease = {}
    return {"present": bool(text.strip()), "text": text, "lease": lease if isinstance(lease, dict) else {}}


def create(path: str, body: str) -> bool:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with _locked(path):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
    return True


def renew(path: str, token: str, body: str) -> bool:
    with _locked(path):
        if token not in (_text(path) or ""):
            return False
        write_atomic(path, body.encode())
    return True


def release(path: str, token: str) -> bool:
    with _locked(path):
        if token not in (_text(path) or ""):
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return True


def write_stop(path: str) -> None:
    write_atomic(path, (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n").encode(), 0o644)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent lease")
    parser.add_argument("action", choices=("read", "create", "renew", "release", "stop"))
    parser.add_argument("path")
    parser.add_argument("--token", default="")
    args = parser.parse_args(argv)
    if args.action in ("renew", "release") and not args.token:
        parser.error(f"{args.action} needs --token")
    if args.action == "read":
        print(json.dumps(read(args.path)))
        return 0
    if args.action == "stop":
        write_stop(args.path)
        print(json.dumps({"path": args.path}))
        return 0
    if args.action == "release":
        print(json.dumps({"released": release(args.path, args.token)}))
        return 0
    body = sys.stdin.read()
    if args.action == "create":
        done = create(args.path, body)
        print(json.dumps({"created": done}))
    else:
        done = renew(args.path, args.token, body)
        print(json.dumps({"renewed": done}))
    return AgentExit.OK if done else AgentExit.REFUSED
