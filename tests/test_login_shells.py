"""A host account whose login shell is not sh (issue 51, item 5).

sshd hands a command string to the account's LOGIN shell: a string quoted for a POSIX shell only was
read otherwise by fish (`\\'` inside single quotes ended the quote: `exec -- echo "\\'\\'; touch pwned; #"`
created the file) and refused by tcsh (a newline inside quotes, `!` expanded even there). The string
(`ssh/command.py: build_remote_command`) must mean the same argv to sh, dash, bash, zsh, fish and
tcsh: checked word by word against the real shells here, then against real accounts whose login shell
is fish or tcsh through the real sshd (`exec`, a `setup:`, a whole `train`)."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import new_project, throwaway_account

from thrust_remote.host.ssh.command import build_remote_command, for_login_shell

pytestmark = pytest.mark.xdist_group("login-shells")

ISSUE_WORD = "\\'\\'; touch pwned; #"
HOSTILE = [
    ISSUE_WORD, "C:\\\\new\\\\table", "C:\\new\\table", "$(id)", "`id`", "a;b", "# not a comment", "*", "?",
    "a\nb", "tab\there", "", " ", "'", '"', "\\", "\\\\", "!", "!!", "a!b", "!$", "{a,b}", "~", "~root",
    "$HOME", "${HOME}", "%1", "=ls", "^x", "a|b", "a&b", "(x)", "[ab]", "x>y", "<z", "é ü 日本 🚀",
    "\x01\x1b[31m\x7f", "trailing\n\n", "\rcr", "-c", "--", "a\\'b\\\\'c", "'\\''", "\\n", "\\c", "%b",
]
# what each login shell is called with by sshd: `SHELL -c STRING`
SHELLS = ("sh", "dash", "bash", "zsh", "fish", "tcsh")
REQUIRED = ("sh", "bash", "fish", "tcsh")  # `make system-deps` installs fish and tcsh


def _shells() -> list[str]:
    missing = [name for name in REQUIRED if shutil.which(name) is None]
    assert not missing, f"{missing} not installed: run `make system-deps`"
    return [name for name in SHELLS if shutil.which(name)]


def _generated_words(count: int, seed: int = 51) -> list[str]:
    """Random words over the characters shells treat specially, control bytes and non-ASCII included."""
    alphabet = "'\"\\!$`;#*?~{}[]()|&<>%^= \t\na-Zé日\x01\x1b\x7f"
    rng = random.Random(seed)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(count)]


def _printf_argv(words: list[str]) -> tuple[list[str], bytes]:
    """An argv that prints each word bracketed, and what it must print."""
    return ["printf", "[%s]\\n", *words], b"".join(b"[" + w.encode() + b"]\n" for w in words)


@pytest.mark.parametrize("shell", SHELLS)
def test_every_word_reaches_sh_unchanged_whatever_the_login_shell(shell, tmp_path):
    if shell not in _shells():
        pytest.skip(f"{shell} is not installed (optional: sh, bash, fish and tcsh are checked everywhere)")
    words = HOSTILE + _generated_words(400)
    for chunk in (words[i:i + 50] for i in range(0, len(words), 50)):
        argv, expected = _printf_argv(chunk)
        for command in (build_remote_command(argv), build_remote_command(argv, cwd=str(tmp_path), timeout=30)):
            done = subprocess.run([shell, "-c", command], capture_output=True, cwd=tmp_path, timeout=60)
            assert done.returncode == 0, (shell, done.stderr.decode(errors="replace"), command[:300])
            assert done.stdout == expected, (shell, command[:300])
    assert list(tmp_path.iterdir()) == []  # nothing ran that the words spelled (`touch pwned`)


def test_a_script_with_control_characters_and_backslashes_is_decoded_byte_for_byte(tmp_path):
    script = "printf '%s|' 'a\\nb' 'x\ny' '\\0101' '\\c' 'tab\t' \"$0\"; printf '\\n\\n\\n'"
    for shell in _shells():
        done = subprocess.run([shell, "-c", for_login_shell(script)], capture_output=True, cwd=tmp_path)
        direct = subprocess.run(["sh", "-c", script], capture_output=True, cwd=tmp_path)
        assert done.stdout == direct.stdout and done.returncode == 0, (shell, done.stdout, done.stderr)


def _as(sshd, account: str, home: Path, tmp_path: Path, jobs: str = "") -> Path:
    """A project whose host `sandbox` is this sshd as `account` (workdir in its home, python the system's)."""
    proj = new_project(tmp_path / "project", sshd, tmp_path / "unused", jobs=jobs, python="/usr/bin/python3")
    cfg = proj / "thrust.yaml"
    text = re.sub(r"address: \w+@", f"address: {account}@", cfg.read_text())
    cfg.write_text(re.sub(r"workdir: .*", f"workdir: {home / 'thrust'}", text, count=1))
    return proj


def _with_login_shell(account: str, shell: str) -> None:
    path = shutil.which(shell)
    assert path, f"{shell} is not installed: run `make system-deps`"
    subprocess.run(["usermod", "-s", path, account], check=True, capture_output=True)


@pytest.mark.parametrize("shell", ["fish", "tcsh"])
def test_exec_on_an_account_whose_login_shell_is_not_sh_runs_the_argv_byte_for_byte(cli, sshd, tmp_path, shell):
    words = [w for w in HOSTILE if "\r" not in w]  # exec prints lines: a lone CR is the terminal's business
    with throwaway_account(sshd) as (account, home):
        _with_login_shell(account, shell)
        proj = _as(sshd, account, home, tmp_path)
        odd = home / "it's a \\ dir!"
        odd.mkdir()
        shutil.chown(odd, account, account)
        argv, expected = _printf_argv(words)
        for extra in ([], ["--cwd", str(odd), "--timeout", "60"], ["--env", "GREETING=$(id) 'hi'"]):
            done = cli("exec", *extra, "--", *argv, cwd=proj)
            assert done.returncode == 0, (extra, done.stderr)
            assert done.stdout.encode() == expected, extra
        seen = cli("exec", "--env", "GREETING=$(id) 'hi'", "--", "printenv", "GREETING", cwd=proj)
        assert seen.stdout == "$(id) 'hi'\n", seen.stderr
        assert not list(home.rglob("pwned")) and not list(proj.rglob("pwned"))


SETUP_JOBS = """\
jobs:
  words:
    kind: command
    command: [sh, -c, 'cat setup-seen > "$THRUST_RUN_DIR/seen"']
    setup: [sh, -c, 'printf "[%s]\\n" "$@" > setup-seen', sh, {words}]
"""


@pytest.mark.slow
@pytest.mark.parametrize("shell", ["fish", "tcsh"])
def test_a_train_with_a_hostile_setup_works_on_an_account_whose_login_shell_is_not_sh(cli, sshd, tmp_path, shell):
    words = [ISSUE_WORD, "C:\\new\\table", "$(id)", "a!b", "`id`", "line1\nline2", "é"]
    with throwaway_account(sshd) as (account, home):
        _with_login_shell(account, shell)
        proj = _as(sshd, account, home, tmp_path, jobs=SETUP_JOBS.format(words=json.dumps(words)[1:-1]))
        trained = cli("train", "words", "--json", cwd=proj)
        assert trained.returncode == 0, trained.stderr
        run_dir = Path(json.loads(trained.stdout)["run_dir"])
        assert (run_dir / "seen").read_bytes() == _printf_argv(words)[1]
        assert not list(home.rglob("pwned"))
