"""A host's `kind` (issue 52, the transport seam): how it is reached, the key the transport table looks
up. `local` has no address; every other host is reached over SSH; `is_local` is `kind == "local"`."""

from __future__ import annotations

import dataclasses

import pytest

from thrust_remote.core.config import HostConfig, parse_config_text
from thrust_remote.core.config.model import HOST_KINDS, local_host


def test_the_kinds_are_local_and_ssh() -> None:
    assert HOST_KINDS == ("local", "ssh")


@pytest.mark.parametrize(("address", "kind"), [(None, "local"), ("user@gpu:2222", "ssh"), ("alias", "ssh")])
def test_kind_follows_the_address(address: str | None, kind: str) -> None:
    host = HostConfig(name="h", address=address)
    assert host.kind == kind
    assert host.is_local == (kind == "local")


def test_kind_is_read_only_and_not_a_field() -> None:
    host = local_host()
    assert host.kind == "local"
    assert "kind" not in {f.name for f in dataclasses.fields(HostConfig)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        host.kind = "ssh"  # type: ignore[misc]


def test_a_loaded_config_gives_each_host_its_kind() -> None:
    config = parse_config_text("hosts:\n  gpu:\n    address: me@gpu\n")
    assert config.host("gpu").kind == "ssh"
    assert config.host("local").kind == "local"
