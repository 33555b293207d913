"""How each kind of host is reached: ONE table, looked up by the host's `kind` (HostConfig.kind, one of
core/config/model.py's HOST_KINDS) wherever a host is opened (host/fleet.py, host/session.py).

A transport says how to make the host's Runner (commands, files) and whether a session on it talks to
the host agent over one `agent serve` process (the agent link, host/agentlink.py) on a byte pipe that
runner opens (host/pipe.py's PipeHost). Nothing above this table asks how a host is reached: a new way
(a container, `kubectl exec`) is a new row, a Runner and a BytePipe, not a branch elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from thrust_remote.core.config import HostConfig
from thrust_remote.host.runner import LocalRunner, Runner


@dataclass(frozen=True)
class Transport:
    kind: str
    # the host's Runner, not yet connected; where `agent_link` is set it is a PipeHost too
    open_runner: Callable[[HostConfig], Runner]
    # sessions send the agent's JSON-answering subcommands to one `agent serve` over a pipe of the runner;
    # else each is a command of its own
    agent_link: bool


def _local_runner(host: HostConfig) -> Runner:
    return LocalRunner(name=host.name)


def _ssh_runner(host: HostConfig) -> Runner:
    from thrust_remote.host.ssh import SSHRunner  # paramiko: only for a command that goes over SSH

    return SSHRunner.from_host(host)


TRANSPORTS: dict[str, Transport] = {t.kind: t for t in (
    # local: each agent subcommand a command of its own, which reads the laptop's environment as it is at
    # that call (a `serve` started with the session would keep the one of its start); LocalRunner opens
    # the same pipes (ProcessPipe), so the link here is this one flag
    Transport("local", _local_runner, agent_link=False),
    # ssh: a login shell and a python per command cost 0.06-0.3 s there; a request over the link, a fork
    Transport("ssh", _ssh_runner, agent_link=True),
)}


def transport_of(host: HostConfig) -> Transport:
    """The host's transport, by its kind."""
    return TRANSPORTS[host.kind]


def open_runner(host: HostConfig) -> Runner:
    """A Runner for the host (LocalRunner for `local`, an SSHRunner that connects lazily for `ssh`)."""
    return transport_of(host).open_runner(host)
