"""The study's hosts (docs/optimize.md, "Several hosts"): one StudyHost per name, in the order of
`--host`; the ones lost on the way (and why); one poll of every host's running trials at once, a
thread per host, each waiting on its own host. A study over several hosts survives losing all but one:
a lost host's link error is handed back, not raised, and the scheduler drops the host."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from thrust_remote.core.config import HostConfig
from thrust_remote.core.errors import ConnectionLostError, ThrustError, UnreachableError
from thrust_remote.optimize.hostops import StudyHost
from thrust_remote.optimize.slots import Slot

# the host is gone (link lost, sshd down, refused): not a fault of the study or of its trials
LINK_ERRORS = (ConnectionLostError, UnreachableError)

T = TypeVar("T")


def in_parallel(items: Mapping[str, Callable[[], T]]) -> tuple[dict[str, T], dict[str, ThrustError]]:
    """Run each callable in its own thread: ({name: result}, {name: link error}). Any other error is
    raised once every thread has ended (the first in `items` order; a ThrustError says which host)."""
    if len(items) == 1:
        name, call = next(iter(items.items()))
        return {name: call()}, {}
    done: dict[str, T] = {}
    lost: dict[str, ThrustError] = {}
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="thrust-host") as pool:
        futures = {name: pool.submit(call) for name, call in items.items()}
        failure: BaseException | None = None
        for name, future in futures.items():
            try:
                done[name] = future.result()
            except LINK_ERRORS as exc:
                lost[name] = exc
            except BaseException as exc:  # noqa: BLE001 - raised below, after every thread ended
                if isinstance(exc, ThrustError) and not exc.message.startswith(f"{name}:"):
                    exc.message = f"{name}: {exc.message}"
                failure = failure or exc
    if failure is not None:
        raise failure
    return done, lost


class Fleet:
    def __init__(self, hosts: Sequence[StudyHost], lost: Mapping[str, str] | None = None) -> None:
        self.hosts: dict[str, StudyHost] = {h.host.name: h for h in hosts}
        self.configs: dict[str, HostConfig] = {h.host.name: h.host for h in hosts}
        self.lost: dict[str, str] = dict(lost or {})  # name -> why
        self.several = len(self.hosts) + len(self.lost) > 1

    @property
    def live(self) -> list[StudyHost]:
        return list(self.hosts.values())

    @property
    def names(self) -> list[str]:
        return list(self.hosts)

    def __getitem__(self, name: str) -> StudyHost:
        return self.hosts[name]

    def of(self, slot: Slot) -> StudyHost:
        return self.hosts[slot.host]

    def where(self, slot: Slot) -> str:
        """A slot as messages name it: `cpu0` on one host, `b/cpu0` over several."""
        return slot.label if self.several else slot.name

    def hint_host(self, name: str) -> HostConfig | str:
        return self.configs.get(name, name)

    def tolerates(self, name: str, exc: BaseException) -> bool:
        """Whether losing `name` to `exc` leaves the study going on the other hosts."""
        return self.several and isinstance(exc, LINK_ERRORS) and name in self.hosts and len(self.hosts) > 1

    def lose(self, name: str, why: str) -> None:
        self.hosts.pop(name, None)
        self.lost[name] = why

    def poll(self, requests: Mapping[str, Sequence[Sequence[Any]]], wait: float) -> dict[str, Any]:
        """Every host's part at once: {"runs": {run_dir: ...} (run ids are unique in a study, so the
        hosts' answers merge), "stop": any host's stop file, "lost": {host: link error}}. With one host
        a link error is raised, as it always was."""
        calls = {name: _poll_call(self.hosts[name], request, wait) for name, request in requests.items()}
        if not calls:
            return {"runs": {}, "stop": False, "lost": {}}
        answers, lost = in_parallel(calls) if self.several else ({n: c() for n, c in calls.items()}, {})
        runs: dict[str, Any] = {}
        for answer in answers.values():
            runs.update(answer.get("runs") or {})
        return {"runs": runs, "stop": any(a.get("stop") for a in answers.values()), "lost": lost}

    def clear_stop(self) -> dict[str, ThrustError]:
        return in_parallel({h.host.name: h.clear_stop for h in self.live})[1]


def _poll_call(host: StudyHost, request: Sequence[Sequence[Any]], wait: float) -> Callable[[], dict[str, Any]]:
    return lambda: host.poll(request, wait=wait)
