"""How a run is launched, queued, watched, stopped and continued on a host: one `Backend` per way, chosen
once from the host's config by `backend_for` (docs/architecture.md, "Backends"). `direct.py`: a detached
process on an SSH box or `local`, the host's queue, N SSH hosts under torchrun c10d; a cluster's backend
(one module, named for its scheduler): a job in its scheduler, over N of its nodes, that continues itself
at its time limit. train, resume, retry, optimize, doctor and the CLI's rendering ask the backend; none
of them asks which it is. base.py holds the protocol, what a run asks of a backend (`RunAsk`) and the one
model of a run's nodes (`RunNodes`), whether several hosts or several nodes a host's scheduler gave it.
"""

from __future__ import annotations

from thrust_remote.backends import direct, slurm
from thrust_remote.backends.base import Backend, Node, RunAsk, RunNodes
from thrust_remote.core.config import HostConfig

__all__ = ["Backend", "Node", "RunAsk", "RunNodes", "backend_for"]


def backend_for(host: HostConfig) -> Backend:
    """The one table: a host's backend from its config."""
    return direct.BACKEND if host.slurm is None else slurm.BACKEND
