"""A command on a pty (the host's TensorBoard behind `tensorboard --remote`, host/ssh/forward.py) runs in
the host's login environment when the host asks for it (`login_shell: true`, issue 53 item 7), as every
other command of its runner does: on a cluster whose modules put python on PATH only there, it is found.
Over a real sshd, as an account whose ~/.profile alone sets what the command reads."""

from __future__ import annotations

import re
import shutil
import time

from helpers import throwaway_account

from thrust_remote.host.ssh import SSHRunner
from thrust_remote.host.ssh.forward import ChannelReader, hang_up, open_pty_command

SHOWS = ["sh", "-c", 'echo "seen=[${THRUST_FROM_PROFILE:-none}]"']


def _said(runner: SSHRunner, login: bool) -> str:
    chan = open_pty_command(runner.transport(), SHOWS, login=login)
    output, said, deadline = ChannelReader(chan), b"", time.monotonic() + 30
    try:
        while (chunk := output.read(1.0)) is not None and time.monotonic() < deadline:
            said += chunk
    finally:
        hang_up(chan)
    found = re.search(r"seen=\[(\w+)\]", said.decode(errors="replace"))
    assert found, said
    return found.group(1)


def test_a_pty_command_reads_the_login_environment_when_the_host_asks(sshd):
    with throwaway_account(sshd) as (account, home):
        profile = home / ".profile"
        profile.write_text("THRUST_FROM_PROFILE=login\nexport THRUST_FROM_PROFILE\n")
        shutil.chown(profile, account, account)
        address = re.sub(r"^[^@]*@", f"{account}@", sshd.address)
        runner = SSHRunner.from_host(sshd.host_config(address=address))
        try:
            assert _said(runner, login=True) == "login"
            assert _said(runner, login=False) == "none"  # sshd's plain `sh -c` reads no profile
        finally:
            runner.close()
