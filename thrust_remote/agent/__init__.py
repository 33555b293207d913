"""The host agent: every program thrust-remote runs on a host, as one stdlib-only package.

It travels as a zipapp (`agent-<sha>.pyz`, built deterministically by thrust_remote.host.payload and
uploaded by content hash) and runs with the host's configured python before anything is installed
there, so it imports nothing outside the standard library and nothing from thrust_remote.

    python agent-<sha>.pyz SUBCOMMAND [ARGS...]

The subcommands, their arguments and JSON answers are the contract in docs/architecture.md
("The host agent"); __main__.py maps each one to its module.
"""
