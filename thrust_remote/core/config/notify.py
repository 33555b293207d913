"""`notify:` (the top level's, or a job's own): what runs on the laptop when a followed run ends, and
the webhook check runs/notify.py repeats for a `$NAME`'s value when it sends."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import yaml

from thrust_remote.core.config.model import NotifyConfig
from thrust_remote.core.config.reader import Reader
from thrust_remote.core.config.values import argv

NOTIFY_KEYS = ("command", "webhook", "desktop")
_ENV_REF = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)\Z")


def parse_notify(reader: Reader, f: str, node: yaml.Node) -> NotifyConfig:
    values: dict[str, Any] = {}
    for key, key_node, value in reader.mapping(node, f):
        if key == "command":
            values[key] = argv(reader, f"{f}.command", value)
        elif key == "webhook":
            values[key] = _webhook(reader, f"{f}.webhook", value)
        elif key == "desktop":
            values[key] = reader.boolean(value, f"{f}.desktop")
        else:
            raise reader.unknown(key_node, f"{f}.{key}", NOTIFY_KEYS)
    return NotifyConfig(**values)


def _webhook(reader: Reader, f: str, value: yaml.Node) -> str:
    url = (reader.string(value, f) or "").strip()
    if not (_ENV_REF.match(url) or re.match(r"^https?://", url, re.IGNORECASE)):
        # the URL itself is a secret: never repeated in the message
        raise reader.fail(value, f, "expected an http(s):// URL, or $NAME to read it from the "
                                    "environment (keeps the secret out of this file)")
    problem = None if _ENV_REF.match(url) else webhook_problem(url)  # $NAME: checked when it is sent
    if problem:
        raise reader.fail(value, f, f"not a usable URL: {problem} (the URL is not repeated: it is a secret)")
    return url


def webhook_problem(url: str) -> str | None:
    """What makes `url` no webhook to POST to, said without repeating any of it (its path, query and
    user part are the secret); None when it is one. Checked when thrust.yaml is read (a literal URL) and
    when a `$NAME`'s value is sent (runs/notify.py), so a bad one is an error or a warning, never a crash."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        return "it contains a space or a control character"
    if not url.isascii():
        return "it contains characters that are not ASCII (percent-encode them; a host name in punycode)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # its text quotes the bad part: not repeated
        return "its [IPv6 address] is not valid" if "IPv6" in str(exc) else "its port is not a number from 1 to 65535"
    if parts.scheme.lower() not in ("http", "https"):
        return "expected an http(s):// URL"
    if not parts.hostname:
        return "it names no host"
    if port == 0:
        return "its port is not a number from 1 to 65535"
    return None
