"""`agent serve` when its link closes (the laptop killed, its connection cut): a request that only served
the laptop ends at once instead of running out its timeout with nobody to answer; serve itself exits
once nothing is left. The server runs here as the real agent process it is on a host (its protocol on
stdin/stdout), so the test can hold its pipes and see its children."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
from helpers import ended, wait_until


def _serve() -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "thrust_remote.agent", "serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None and b"ready" in proc.stdout.readline()
    return proc


def test_a_request_that_only_served_the_laptop_ends_with_its_link_and_serve_exits(tmp_path):
    """Before, serve returned at the link's end and left such a request (a venv's pip, a poll) running
    for up to its hour-long timeout."""
    proc = _serve()
    assert proc.stdin is not None
    request = {"id": 1, "argv": ["poll", "--runs", "[]", "--stop-file", str(tmp_path / "never"), "--wait", "600"],
               "stdin": "", "timeout": 900}
    proc.stdin.write(json.dumps(request).encode() + b"\n")
    proc.stdin.flush()
    server = psutil.Process(proc.pid)
    wait_until(lambda: server.children(), 10, "the request's process to start")
    child = server.children()[0]
    proc.stdin.close()  # the link closes
    assert proc.wait(timeout=15) == 0
    wait_until(lambda: ended(child), 10, "the poll request to end with its link")
