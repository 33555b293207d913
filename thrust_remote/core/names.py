"""Validation of the names that end up on a command line: hosts, users, env keys, run and job ids.

A name that starts with `-` becomes an option to ssh/git/env; a name with shell metacharacters is an
injection waiting for one unquoted use. Both are refused before anything connects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.%-]*[A-Za-z0-9_])?\Z")
_IPV6_RE = re.compile(r"^[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\Z")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?\Z")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")


def bad_name_reason(value: str, what: str) -> str | None:
    """Why `value` cannot be used as a `what`, or None when it is fine."""
    if not value:
        return f"{what} is empty"
    if value.startswith("-"):
        return f"{what} {value!r} starts with '-' (it would be read as an option)"
    if any(c.isspace() for c in value):
        return f"{what} {value!r} contains whitespace"
    bad = sorted({c for c in value if c in "`$;&|<>(){}[]'\"\\*?!#~^,="})
    if bad:
        return f"{what} {value!r} contains shell metacharacters: {' '.join(bad)}"
    return None


def valid_host(host: str) -> bool:
    return bool(_HOST_RE.match(host)) and ".." not in host


def valid_user(user: str) -> bool:
    return bool(_USER_RE.match(user))


def valid_env_key(key: str) -> bool:
    return bool(_ENV_KEY_RE.match(key))


def valid_id(value: str) -> bool:
    """Run ids, job names, study names: safe as a path component and as an argv element."""
    return bool(_ID_RE.match(value)) and value not in {".", ".."}


@dataclass(frozen=True)
class Address:
    """A parsed `[user@]host[:port]` (or an ~/.ssh/config alias, which is just a host here)."""

    host: str
    user: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        out = f"{self.user}@{host}" if self.user else host
        return f"{out}:{self.port}" if self.port else out


def parse_address(text: str) -> Address:
    """Parse `alias`, `host`, `user@host`, `user@host:port`, `user@[v6addr]:port`.

    Raises ValueError with a sentence saying what is wrong.
    """
    if not text or text != text.strip():
        raise ValueError(f"address {text!r} is empty or has surrounding whitespace")
    if text.startswith("-"):
        raise ValueError(f"address {text!r} starts with '-' (it would be read as an option)")
    user: str | None = None
    rest = text
    if "@" in text:
        user, _, rest = text.rpartition("@")
        if not valid_user(user):
            raise ValueError(
                f"user {user!r} in address {text!r} is not a valid user name (letters, digits, _ . -)"
            )
    port: int | None = None
    if rest.startswith("["):
        host, sep, tail = rest[1:].partition("]")
        if not sep or not _IPV6_RE.match(host):
            raise ValueError(f"address {text!r}: bracketed host must be an IPv6 address")
        if tail:
            if not tail.startswith(":"):
                raise ValueError(f"address {text!r}: expected ':PORT' after ']'")
            port = _parse_port(tail[1:], text)
    else:
        host, sep, port_text = rest.partition(":")
        if sep:
            port = _parse_port(port_text, text)
        if not valid_host(host):
            raise ValueError(
                f"host {host!r} in address {text!r} is not a valid host name or alias "
                "(letters, digits, '.', '-', '_'; no leading '-' and no shell metacharacters)"
            )
    return Address(host=host, user=user, port=port)


def _parse_port(text: str, whole: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"address {whole!r}: port {text!r} is not a number from 1 to 65535")
    return int(text)
