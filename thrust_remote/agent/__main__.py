"""`python agent.pyz SUBCOMMAND ...`: dispatch to the module that owns the subcommand.

Modules are imported only when their subcommand runs: every remote action pays one python start-up,
so a `status` must not import what `tree-add` needs (docs/architecture.md, "The host agent").
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module, whether the module's own parser sees the subcommand word itself)
COMMANDS: dict[str, tuple[str, bool]] = {
    "launch": ("launcher", True),
    "status": ("runs", True),
    "list": ("runs", True),
    "logs": ("logs", True),  # a run's log from an offset; --follow to its end
    "stop": ("runs", True),
    "launch-outcome": ("supervisor", True),  # a launch whose answer never came: launched, else withdrawn
    "supervise": ("batchstep", True),  # a cluster's job's one step: the supervisor on its allocation
    "write-file": ("files", False),
    "place-checkpoint": ("placing", False),  # a resumed run's checkpoint where its job reads it (resume: checkpoint_at)
    "git-state": ("checkout", True),
    "git-receive": ("checkout", True),
    "tree-add": ("trees", True),  # a run's own tree: a worktree + patch, LFS, submodules, files:, setup:, shared:
    "tree-remove": ("trees", True),
    "tree-size": ("trees", True),
    "tree-prune": ("trees", True),  # the trees beyond a host's `keep:`, a live run's never (thrust-remote prune)
    "store-missing": ("trees", True),  # which of the laptop's files: the host's content store lacks
    "setup-keep": ("trees", True),  # a setup:'s outputs into the store, for later trees of the same inputs
    "preflight": ("probe", True),
    "missing-modules": ("probe", True),
    "dist-versions": ("probe", True),  # torchvision/torchaudio as pip sees them (run/pins.py)
    "stage-artifact": ("artifact", False),
    "poll": ("poll", False),
    "lease": ("lease", False),
    "xfer": ("xfer", False),  # `xfer serve`, `xfer hash PATH`: the streamed transfers (host/streams.py)
    "venv": ("venv", False),  # `venv ensure`: the job's virtualenv (docs/architecture.md, "The host agent")
    "list-files": ("listing", False),  # a run's artifacts with size, mtime, sha256 (fetch/artifacts.py)
    "scalars": ("scalars", False),  # TensorBoard scalars, run by the job's venv python (not -S)
    "route-dev": ("netinfo", True),  # several hosts: the interface that reaches node 0
    "free-port": ("netinfo", True),  # several hosts: the rendezvous port, free on node 0
    "listen": ("netinfo", True),  # doctor over several hosts: node 0 accepts the others' connects
    "reach": ("netinfo", True),  # doctor over several hosts: a node connects to node 0
    "page": ("netinfo", True),  # doctor --job: an index's page of a torch companion, read by the host
    "slurm-check": ("slurmcheck", True),  # doctor of a Slurm login node: partition, sbatch --test-only, one srun
    "slurm-probe": ("slurmcheck", True),  # on a compute node (srun): the shared file, python, torch
    "serve": ("serve", False),  # one agent per connection: the other subcommands as requests (serve.py)
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        sys.stderr.write(f"usage: agent {{{','.join(COMMANDS)}}} ...\n")
        return 2
    name, keeps_word = COMMANDS[argv[0]]
    module = importlib.import_module(f".{name}", __package__)
    return int(module.main(argv if keeps_word else argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
