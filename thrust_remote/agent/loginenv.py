"""A host's login environment (a cluster host's `login_shell: true`): what `sh -l` reads, /etc/profile and
then ~/.profile, sourced in front of a command. Clusters put their scheduler's commands on PATH there
(/etc/profile.d, or a `module load` in ~/.profile), while sshd runs a command in a plain `sh -c` that
reads neither.

One spelling for both sides: the laptop puts LOGIN_ENV in front of every command it sends such a host
(host/ssh/command.py), and doctor's scheduler check runs the scheduler's command behind it to tell "not
installed" from "only in the login environment". What a profile prints goes to /dev/null (the agent
answers JSON on stdout); a profile that reads stdin gets nothing.
"""

from __future__ import annotations

LOGIN_ENV = ('{ if [ -r /etc/profile ]; then . /etc/profile; fi; '
             'if [ -r "$HOME/.profile" ]; then . "$HOME/.profile"; fi; } </dev/null >/dev/null 2>&1; ')
