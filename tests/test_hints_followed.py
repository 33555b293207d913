"""Hints after a failed command (issue 53, items 9-11), over the suite's sshd: a hint that names the flag
style comes only when the job refused how its flags were spelled; a setup's word the host does not know
stays as written. The hints after a job that died at import and after a failed setup are followed as
printed, with the rest, in tests/test_hint_table.py."""

from __future__ import annotations

import shlex
import textwrap

import pytest
from helpers import new_project, remote_tempdir

from thrust_remote.core.config import parse_config_text
from thrust_remote.run import flags

WIDE = {"COLUMNS": "1000"}  # one hint on one line, as a terminal this wide shows it

# nanoGPT's configurator as it is: --key=value only, and the value's type must match the default's
NANO_PY = '''\
import sys
from ast import literal_eval

max_iters = 4
for arg in sys.argv[1:]:
    if "=" not in arg:
        assert not arg.startswith("--")
    else:
        assert arg.startswith("--")
        key, val = arg.split("=")
        key = key[2:]
        try:
            attempt = literal_eval(val)
        except (SyntaxError, ValueError):
            attempt = val
        assert type(attempt) == type(globals()[key])
        globals()[key] = attempt
print(f"iter {max_iters}: loss 1.0", flush=True)
'''

PREPARE_PY = '''\
import sys
# the setup's own failure (3) when it runs as the setup ran it, in the job's venv; 5 outside it
sys.exit(3 if sys.prefix != sys.base_prefix else 5)
'''

JOBS = """\
jobs:
  nano:
    script: nano.py
    flags: {style: "--key=value"}
  broken:
    script: broken.py
    checkpoints: out/ckpt-*.pt
    resume: ["--resume_from={checkpoint}"]
  prepared:
    script: nano.py
    setup: [python, prepare.py]
"""

FILES = {"nano.py": NANO_PY, "prepare.py": PREPARE_PY,
         "broken.py": "import argparse\nimport no_such_module_here  # noqa\n"}


@pytest.fixture
def project(sshd, tmp_path):
    return new_project(tmp_path / "project", sshd, remote_tempdir(sshd) / "w", files=FILES, jobs=JOBS)


def _command_after(text: str, marker: str) -> list[str]:
    """The command a hint prints after `marker`, as a shell splits it when pasted."""
    assert marker in text, text
    return shlex.split(text.split(marker, 1)[1].splitlines()[0])


def test_a_values_type_error_under_the_right_style_gets_no_flag_style_hint(cli, project):
    """`--set max_iters=abc` reaches nanoGPT's configurator as `--max_iters=abc`, the spelling it takes:
    its assertion is on the value's type, so no hint says to write the flags otherwise."""
    died = cli("train", "nano", "--set", "max_iters=abc", "--no-fetch", cwd=project, env=WIDE)
    assert died.returncode == 1 and "AssertionError" in died.stdout + died.stderr, died.stderr
    assert "flags: {style" not in died.stderr and "died of its arguments" not in died.stderr, died.stderr
    fixed = cli("train", "nano", "--set", "max_iters=3", "--no-fetch", cwd=project, env=WIDE)
    assert fixed.returncode == 0, fixed.stderr


@pytest.mark.parametrize(("style", "tail", "hinted"), [
    ("--key value", "usage: t.py [-h] [--lr LR]\nt.py: error: argument --lr: invalid float value: 'x'\n", False),
    ("--key value", "usage: t.py [-h]\nt.py: error: unrecognized arguments: --learning_rate 3\n", True),
    ("--key value", "usage: t.py [-h] [--lr LR]\nt.py: error: argument --lr: expected one argument\n", True),
    ("key=value", "hydra.errors.OverrideParseException: Error parsing override '--lr=0.1'\n", True),
    ("key=value", "Error merging override lr=x\nValue 'x' could not be converted to Float\n", False),
    # a configurator run by exec() (the traceback shows no source line): the spelling it takes was used
    ("--key=value", 'Traceback (most recent call last):\n  File "<string>", line 47, in <module>\nAssertionError\n',
     False),
    ("--key value", 'Traceback (most recent call last):\n  File "<string>", line 35, in <module>\nAssertionError\n',
     True),
    ("--key=value", '  File "c.py", line 9\n    assert type(attempt) == type(globals()[key])\n'
                    '           ^^^^^^^^^^^^^\nAssertionError\n', False),
    ("--key=value", "  File \"c.py\", line 9\n    assert arg.startswith('--')\nAssertionError\n", True),
])
def test_the_flag_style_hint_comes_only_when_the_spelling_was_refused(tmp_path, style, tail, hinted):
    config = parse_config_text(f"jobs:\n  j:\n    script: t.py\n    flags: {{style: {style!r}}}\n",
                               tmp_path / "thrust.yaml")
    assert (flags.refused_hint(config.job("j"), tail, gave_flags=True) is not None) is hinted


def test_a_word_with_a_slash_or_unknown_to_the_host_stays_as_the_setup_wrote_it(cli, sshd, tmp_path):
    jobs = textwrap.dedent("""\
        jobs:
          odd:
            script: nano.py
            setup: [no-such-program-here, x]
        """)
    proj = new_project(tmp_path / "p", sshd, remote_tempdir(sshd) / "w", files=FILES, jobs=jobs)
    failed = cli("train", "odd", cwd=proj, env=WIDE)
    assert failed.returncode != 0, failed.stderr
    hint = _command_after(failed.stderr, "try it there with: ")
    assert hint[hint.index("--") + 1:] == ["no-such-program-here", "x"], hint
