"""Every command that takes `--set` says in its help that a bare word passes as it is (issue 56 item 5):
`resume` continues a run with train's own --set, so its help says what train's says."""

from __future__ import annotations

import pytest

BARE = "a word that starts with - (--set=-m, Hydra's multirun): passed as it is, first"


@pytest.mark.parametrize("command", ["train", "resume", "optimize"])
def test_set_help_names_bare_words(cli, command):
    shown = cli(command, "--help", env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.replace("│", " ").split())  # a help box's borders and wrapping
    assert BARE in text, text
