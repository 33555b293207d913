"""A host that does not answer is named as thrust.yaml names it, with where that went (issue 53: "cannot
connect to 127.0.0.1:2299" left a new user to work out which of their hosts that was), on every command."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest


def _closed_port() -> int:
    """A loopback port nothing listens on: bound here, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("command", [["doctor"], ["runs"], ["exec", "--", "true"], ["status", "r-1"]])
def test_a_closed_port_is_named_by_the_hosts_name_and_its_address(cli, tmp_path: Path, command: list[str]) -> None:
    port = _closed_port()
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(f"hosts:\n  gpubox:\n    address: someone@127.0.0.1:{port}\n    connect_timeout: 3\n"
                   "default_host: gpubox\n")
    cut = command.index("--") if "--" in command else len(command)  # options before exec's `--`
    proc = cli("--config", str(cfg), *command[:cut], "--host", "gpubox", *command[cut:])
    assert proc.returncode == 69, proc.stderr
    assert f"error: cannot connect to gpubox (127.0.0.1:{port}): connection refused" in proc.stderr, proc.stderr
