"""The configured hosts as one fleet: the one way to reach a host by name, and a call fanned out over
several of them at once (fabric's `Group`: one function over every host, one result per host).

    fleet = Fleet(config)
    with fleet.open("gpu") as session:
        ...
    with fleet.sessions(config.host_list(["a", "b"])) as sessions:
        each(lambda s: ..., sessions)

Threads: a fleet holds only the config, so any thread may open through it at once (`runs --all`, the
nodes of a run). Each `open` is a new `HostSession` with a runner of its own, its caller's to close;
a session is shared between threads only where its user says so (a followed run's watch and pulls
ask a node's session from their own threads: its agent link takes requests from any thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from thrust_remote.core.config import Config, HostConfig
from thrust_remote.host.runner import Runner
from thrust_remote.host.session import HostSession
from thrust_remote.host.transports import open_runner

T = TypeVar("T")
R = TypeVar("R")

RunnerFor = Callable[[HostConfig], Runner]  # a host's Runner, not yet connected (transports.open_runner: by its kind)

__all__ = ["Fleet", "RunnerFor", "each", "open_runner"]


class Fleet:
    """Every host of a config, by name. `config_path` is the --config the user gave, as the hints that
    name a host repeat it (None: none was given)."""

    def __init__(self, config: Config, *, config_path: Path | str | None = None,
                 runner_for: RunnerFor = open_runner) -> None:
        self.config = config
        self.config_path = config_path
        self._runner_for = runner_for

    def host(self, name: str | HostConfig | None = None) -> HostConfig:
        """The host's config; None: the default host (an unknown name is UnknownHostError, 68)."""
        return name if isinstance(name, HostConfig) else self.config.host(name)

    def runner(self, host: str | HostConfig | None = None) -> Runner:
        """A bare Runner (no session, no agent link): `ping`, `exec`, `doctor`, a study's hosts."""
        return self._runner_for(self.host(host))

    def open(self, host: str | HostConfig | None = None) -> HostSession:
        """A new session on the host (its agent link starts in the background); the runner is closed
        again when the session cannot open."""
        host_cfg = self.host(host)
        runner = self._runner_for(host_cfg)
        try:
            return HostSession.open(runner, host_cfg, self.config)
        except BaseException:
            runner.close()
            raise

    def open_all(self, hosts: Sequence[str | HostConfig]) -> list[HostSession]:
        """A session on every host at once, in the order given; all closed again on an error."""
        opened: list[HostSession | None] = [None] * len(hosts)

        def one(i: int) -> HostSession:
            opened[i] = self.open(hosts[i])
            return opened[i]  # type: ignore[return-value]

        try:
            return each(one, list(range(len(hosts))))
        except BaseException:
            for session in opened:
                if session is not None:
                    session.close()
            raise

    @contextmanager
    def sessions(self, hosts: Sequence[str | HostConfig]) -> Iterator[list[HostSession]]:
        """`open_all`, every session closed when the block ends."""
        sessions = self.open_all(hosts)
        try:
            yield sessions
        finally:
            for session in sessions:
                session.close()


def each(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """fn over every item at once; the first node's error (in node order) is raised after all end.
    One item runs in the caller's thread: a Ctrl-C then stops it where it is (a pool's worker would
    carry on to its end)."""
    if len(items) == 1:
        return [fn(items[0])]
    with ThreadPoolExecutor(max_workers=max(1, len(items))) as pool:
        futures = [pool.submit(fn, item) for item in items]
    for future in futures:
        future.result()  # raises the first error in node order
    return [f.result() for f in futures]
