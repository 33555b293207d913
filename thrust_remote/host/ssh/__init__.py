"""The Runner over SSH (docs/architecture.md, "Runners and the SSH layer").

- connect.py: open one connection with our host-key policy; the one map from paramiko/socket errors
  to ThrustError.
- command.py: the remote command line (argv + shlex.join) and the channel's hooks for runner.drive.
- pipe.py: an exec channel as a byte pipe (host/pipe.py), which the agent link (host/agentlink.py) and
  the streamed transfers (host/streams.py) run over.
- transfer.py: the SFTP fallback, for a host that cannot run the streaming helper.
- runner.py: SSHRunner, which composes them.
"""

from thrust_remote.host.ssh.command import build_remote_command
from thrust_remote.host.ssh.connect import GCM_FIRST, fingerprint, known_hosts_name
from thrust_remote.host.ssh.runner import SSHRunner

__all__ = ["GCM_FIRST", "SSHRunner", "build_remote_command", "fingerprint", "known_hosts_name"]
