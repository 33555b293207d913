"""The Runner over SSH (docs/architecture.md, "Runners and the SSH layer").

- connect.py: open one connection with our host-key policy; the one map from paramiko/socket errors
  to ThrustError.
- command.py: the remote command line (argv + shlex.join) and the channel's hooks for runner.drive.
- transfer.py: verified transfers, the streaming helper (agent/xfer.py) and the SFTP fallback.
- runner.py: SSHRunner, which composes them.
"""

from thrust_remote.host.ssh.command import build_remote_command
from thrust_remote.host.ssh.connect import GCM_FIRST, fingerprint, known_hosts_name
from thrust_remote.host.ssh.runner import SSHRunner

__all__ = ["GCM_FIRST", "SSHRunner", "build_remote_command", "fingerprint", "known_hosts_name"]
