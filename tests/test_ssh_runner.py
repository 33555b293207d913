"""SSHRunner against a real OpenSSH server: host keys, auth, reachability, lost links, injection,
verified transfers. Each test asserts what a user would see (exit code, message, files)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import _start_sshd
from helpers import wait_until

from thrust_remote.core.errors import ConnectionLostError, ExitCode, TransferError
from thrust_remote.host.ssh import build_remote_command

NASTY = [
    "a'; touch {m} #",
    "$(touch {m})",
    "`touch {m}`",
    "x\ntouch {m}",
    "-oProxyCommand=touch {m}",
    "; touch {m}",
    "&& touch {m}",
    "| touch {m}",
    "\"$(touch {m})\"",
    "\\'; touch {m}",
    "*",
    "~root",
]


def _nasty(marker: Path) -> list[str]:
    return [s.format(m=marker) for s in NASTY]


def _config(tmp_path: Path, sshd, **kw) -> Path:
    return sshd.thrust_yaml(tmp_path / "thrust.yaml", **kw)


def _host_commands(sshd, match: Callable[[list[str]], bool]) -> list[psutil.Process]:
    """The processes running on the sshd's host (those in its pid namespace) whose argv `match` says."""
    found = []
    for proc in sshd.processes():
        try:
            if match(proc.cmdline()):
                found.append(proc)
        except psutil.NoSuchProcess:  # ended while we looked
            continue
    return found


def _cut_once_running(sshd, argv: list[str]) -> threading.Thread:
    """SIGKILL the sshd sessions once `argv` runs on the host: the link dies under a command in flight,
    however long connecting took (a fixed delay could fire before the command started)."""
    def cut() -> None:
        wait_until(lambda: _host_commands(sshd, lambda cmd: cmd == argv), 30, f"{argv} running on the host")
        sshd.kill_sessions()

    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    return thread


def test_command_reaches_host_and_returns_exit_code(cli, sshd, tmp_path):
    cfg = _config(tmp_path, sshd)
    result = cli("--config", str(cfg), "exec", "--host", "sandbox", "--", "sh", "-c", "echo hi; exit 7")
    assert result.returncode == 7
    assert result.stdout == "hi\n"


def test_unknown_host_key_refused_and_nothing_runs(cli, sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    marker = tmp_path / "ran"
    cfg = _config(tmp_path, sshd, known_hosts=empty)
    result = cli("--config", str(cfg), "exec", "--", "touch", str(marker))
    assert result.returncode == ExitCode.HOST_KEY
    assert "SHA256:" in result.stderr and "not in" in result.stderr
    assert "accept-new" in result.stderr  # the message says how to trust it
    assert not marker.exists()
    assert empty.read_text() == ""  # strict never writes known_hosts


def test_changed_host_key_refused_and_known_hosts_unchanged(cli, sshd, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, b64 = other.with_suffix(".pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n")
    before = known.read_bytes()
    marker = tmp_path / "ran"
    for policy in ("strict", "accept-new"):
        cfg = _config(tmp_path, sshd, known_hosts=known)
        text = cfg.read_text().replace("connect_timeout: 5\n", f"connect_timeout: 5\n    host_key_policy: {policy}\n")
        cfg.write_text(text)
        result = cli("--config", str(cfg), "exec", "--", "touch", str(marker))
        assert result.returncode == ExitCode.HOST_KEY, result.stderr
        assert "CHANGED" in result.stderr and "ssh-keygen -R" in result.stderr
        assert not marker.exists()
        assert known.read_bytes() == before


def test_accept_new_adds_once_then_refuses_a_change(cli, sshd, tmp_path):
    known = tmp_path / "kh" / "known_hosts"
    cfg = _config(tmp_path, sshd, known_hosts=known)
    text = cfg.read_text().replace("connect_timeout: 5\n", "connect_timeout: 5\n    host_key_policy: accept-new\n")
    cfg.write_text(text)
    for _ in range(2):
        result = cli("--config", str(cfg), "exec", "--", "true")
        assert result.returncode == 0, result.stderr
    lines = known.read_text().splitlines()
    assert len(lines) == 1
    assert lines[0] == sshd.known_hosts_line
    # the host "changes" its key: accept-new must refuse
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, b64 = other.with_suffix(".pub").read_text().split()[:2]
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n")
    result = cli("--config", str(cfg), "exec", "--", "true")
    assert result.returncode == ExitCode.HOST_KEY


def test_wrong_key_is_auth_failure_quickly(cli, sshd, tmp_path):
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)], check=True)
    cfg = _config(tmp_path, sshd)
    cfg.write_text(cfg.read_text().replace(str(sshd.client_key), str(wrong)))
    started = time.monotonic()
    result = cli("--config", str(cfg), "exec", "--", "true")
    elapsed = time.monotonic() - started
    assert result.returncode == ExitCode.AUTH, result.stderr
    assert "authentication failed" in result.stderr
    assert elapsed < 5


# sshd asks this command for a key's authorized lines when its file has none for the key offered:
# here it only holds the authentication open, so the test can end the host at that moment (sshd runs
# only a root-owned command on a root-owned path: hence sleep).
HOLD_AUTH = "AuthorizedKeysCommand /bin/sleep 30\nAuthorizedKeysCommandUser nobody\n"


def _offering_an_unlisted_key(box, tmp_path: Path) -> Path:
    """thrust.yaml for `box` with a key its authorized_keys does not list (so sshd runs the command)."""
    key = tmp_path / "unlisted_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    cfg = box.thrust_yaml(tmp_path / "thrust.yaml")
    cfg.write_text(cfg.read_text().replace(str(box.client_key), str(key)))
    return cfg


def _hold_in_auth(box) -> psutil.Process:
    def holding() -> psutil.Process | None:
        return next(iter(box.named("sleep")), None)

    return wait_until(holding, 10, "a connection held in authentication")


@pytest.mark.ssh
def test_a_host_that_goes_down_during_authentication_is_unreachable_not_a_key_to_fix(cli, tmp_path):
    """paramiko reports a connection that ends mid-authentication as a failed authentication. A host
    going down at that moment is not a key problem: the user reads "cannot connect" (69), not 77 with
    advice about authorized_keys."""
    box = _start_sshd(tmp_path / "box", extra_config=HOLD_AUTH)
    try:
        cfg = _offering_an_unlisted_key(box, tmp_path)
        told = subprocess.Popen([cli.exe, "--config", str(cfg), "exec", "--", "true"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cli._env(None))
        _hold_in_auth(box)
        box.stop()
        _, err = told.communicate(timeout=30)
    finally:
        box.stop()
    assert told.returncode == ExitCode.UNAVAILABLE, err
    assert "cannot connect" in err and "authorized_keys" not in err


@pytest.mark.ssh
def test_a_host_that_ends_every_authentication_stays_an_authentication_failure(cli, tmp_path):
    """The other reading of the same paramiko error: the host is up and ends each try (as sshd does past
    MaxAuthTries). Tried twice, it stays exit 77 with the key advice."""
    box = _start_sshd(tmp_path / "box", extra_config=HOLD_AUTH)
    try:
        cfg = _offering_an_unlisted_key(box, tmp_path)
        told = subprocess.Popen([cli.exe, "--config", str(cfg), "exec", "--", "true"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cli._env(None))
        for _ in range(2):  # end each held connection: its sshd session, which ends the sleep with it
            held = _hold_in_auth(box)
            session = held.parent()
            session.kill()
            held.kill()
            psutil.wait_procs([session, held], timeout=10)
        _, err = told.communicate(timeout=30)
        wait_until(lambda: not box.named("sleep"), 10, "no held connection")
    finally:
        box.stop()
    assert told.returncode == ExitCode.AUTH, err
    assert "authentication failed" in err and "authorized_keys" in err


def test_closed_port_is_unreachable_within_timeout(cli, tmp_path, sshd):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(
        "hosts:\n  gone:\n"
        f"    address: root@127.0.0.1:{port}\n"
        f"    identity: {sshd.client_key}\n"
        f"    known_hosts: {sshd.known_hosts}\n"
        "    connect_timeout: 3\n"
    )
    started = time.monotonic()
    result = cli("--config", str(cfg), "exec", "--host", "gone", "--", "true")
    assert result.returncode == ExitCode.UNAVAILABLE, result.stderr
    assert "cannot connect" in result.stderr
    assert time.monotonic() - started < 8


def test_unresolvable_host_is_unknown_host(cli, tmp_path, sshd):
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(
        "hosts:\n  nowhere:\n    address: root@no-such-host.invalid\n"
        f"    known_hosts: {sshd.known_hosts}\n    connect_timeout: 3\n"
    )
    result = cli("--config", str(cfg), "exec", "--host", "nowhere", "--", "true")
    assert result.returncode == ExitCode.UNKNOWN_HOST, result.stderr


def test_killed_session_is_connection_lost(cli, sshd, tmp_path):
    cfg = _config(tmp_path, sshd)
    proc = subprocess.Popen(
        [str(Path(os.sys.executable).parent / "thrust-remote"), "--config", str(cfg), "exec", "--",
         "sh", "-c", "echo started; sleep 30"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline() == "started\n"  # the command is running on the host
    assert sshd.kill_sessions() >= 1
    started = time.monotonic()
    _out, err = proc.communicate(timeout=20)
    assert proc.returncode == ExitCode.CONNECTION_LOST, err
    assert "lost" in err
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("runner_kind", ["ssh", "local"])
def test_injection_attempts_arrive_byte_exact_and_never_execute(runner_kind, sshd, tmp_path):
    from thrust_remote.host.runner import LocalRunner

    marker = tmp_path / "pwned"
    runner = sshd.runner() if runner_kind == "ssh" else LocalRunner()
    args = _nasty(marker)
    try:
        # argv: printf each argument NUL-terminated, compare bytes
        result = runner.run(["printf", "%s\\0", *args])
        assert result.ok, result.stderr
        assert result.stdout.split("\0")[:-1] == args
        # env values
        env = {f"V{i}": v for i, v in enumerate(args)}
        script = 'printf "%s\\0"' + "".join(f' "$V{i}"' for i in range(len(args)))
        result = runner.run(["sh", "-c", script], env=env)
        assert result.ok, result.stderr
        assert result.stdout.split("\0")[:-1] == args
        # paths: a directory whose name is an injection attempt, used as cwd
        weird = tmp_path / "dir $(touch x) ; `y` 'z'"
        weird.mkdir()
        result = runner.run(["pwd"], cwd=str(weird))
        assert result.stdout.strip() == str(weird)
        # a transfer to a path with the same characters
        src = tmp_path / "src.bin"
        src.write_bytes(b"payload")
        dest = str(weird / "f $(touch x)")
        runner.put(src, dest)
        assert Path(dest).read_bytes() == b"payload"
    finally:
        runner.close()
    assert not marker.exists()
    assert not (tmp_path / "x").exists()


def test_env_name_must_be_an_identifier(sshd):
    from thrust_remote.core.errors import UsageError

    runner = sshd.runner()
    with pytest.raises(UsageError):
        runner.run(["true"], env={"A;touch /tmp/x": "1"})
    runner.close()


def test_remote_command_is_quoted_argv():
    cmd = build_remote_command(["echo", "a b", "$HOME"], cwd="~/my dir")
    assert shlex.split(cmd) == ["sh", "-c", "cd -- \"$HOME\"/'my dir' && echo 'a b' '$HOME'; exit $?"]


@pytest.mark.parametrize("bad", ["-oProxyCommand=touch /tmp/x", "ho st", "a;b", "$(id)", "host`id`"])
def test_bad_host_address_refused_before_connecting(cli, tmp_path, bad):
    marker = Path("/tmp/x")
    existed = marker.exists()
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(f"hosts:\n  box:\n    address: '{bad}'\n")
    result = cli("--config", str(cfg), "exec", "--host", "box", "--", "true")
    assert result.returncode == ExitCode.CONFIG, result.stderr
    assert f"{cfg}:3" in result.stderr and "hosts.box.address" in result.stderr
    assert marker.exists() == existed


def test_host_flag_with_leading_dash_is_refused(cli, tmp_path):
    result = cli("exec", "--host=-oProxyCommand=x", "--", "true", cwd=tmp_path)
    assert result.returncode in (ExitCode.UNKNOWN_HOST, ExitCode.CONFIG, ExitCode.USAGE)
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("runner_kind", ["ssh", "local"])
def test_put_get_round_trip_verified(runner_kind, sshd, tmp_path, remote_dir):
    from thrust_remote.host.runner import LocalRunner

    runner = sshd.runner() if runner_kind == "ssh" else LocalRunner()
    data = os.urandom(5_000_000)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    try:
        assert runner.put(src, str(remote_dir / "sub" / "a.bin")) == expected
        assert runner.exists(str(remote_dir / "sub" / "a.bin"))
        assert sorted(p.name for p in (remote_dir / "sub").iterdir()) == ["a.bin"]  # no part left
        back = tmp_path / "back" / "b.bin"
        assert runner.get(str(remote_dir / "sub" / "a.bin"), back) == expected
        assert back.read_bytes() == data
        assert not list(back.parent.glob("*.part"))
        with pytest.raises(TransferError):
            runner.get(str(remote_dir / "missing"), tmp_path / "m")
    finally:
        runner.close()


def _cut_when_part_grows(sshd, part: Path, min_bytes: int) -> threading.Thread:
    """Cut the link once `part` (a glob pattern for a download's temporary name) holds min_bytes."""
    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for found in part.parent.glob(part.name):
                with contextlib.suppress(OSError):
                    if found.stat().st_size >= min_bytes:
                        sshd.kill_sessions()
                        return
            time.sleep(0.002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_cut_download_leaves_destination_untouched_and_retry_completes(sshd, tmp_path, remote_dir):
    data = os.urandom(150_000_000)
    remote_file = remote_dir / "big.bin"
    remote_file.write_bytes(data)
    dest = tmp_path / "big.bin"
    dest.write_bytes(b"previous version")
    runner = sshd.runner()
    watcher = _cut_when_part_grows(sshd, tmp_path / ".big.bin.*.part", 10_000_000)
    with pytest.raises(TransferError) as info:
        runner.get(str(remote_file), dest)
    watcher.join()
    assert info.value.exit_code == ExitCode.TRANSFER
    assert dest.read_bytes() == b"previous version"
    assert not list(tmp_path.glob("*.part"))  # the laptop's temporary file goes with the cut
    # retry on a new connection completes
    assert runner.get(str(remote_file), dest) == hashlib.sha256(data).hexdigest()
    assert dest.read_bytes() == data
    runner.close()


def test_cut_upload_leaves_destination_untouched_and_retry_completes(sshd, tmp_path, remote_dir):
    data = os.urandom(150_000_000)
    src = tmp_path / "up.bin"
    src.write_bytes(data)
    dest = remote_dir / "up.bin"
    dest.write_bytes(b"previous version")
    runner = sshd.runner()
    watcher = _cut_when_part_grows(sshd, remote_dir / ".up.bin.*.part", 10_000_000)
    with pytest.raises(TransferError):
        runner.put(src, str(dest))
    watcher.join()
    assert dest.read_bytes() == b"previous version"
    runner.put(src, str(dest))
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    runner.close()


def test_lost_link_raises_connection_lost_for_runner(sshd):
    runner = sshd.runner()
    runner.run(["true"])
    killer = _cut_once_running(sshd, ["sleep", "20"])
    with pytest.raises(ConnectionLostError) as info:
        runner.run(["sleep", "20"])
    killer.join()
    assert info.value.exit_code == ExitCode.CONNECTION_LOST
    # the runner reconnects on the next command
    assert runner.run(["echo", "back"]).stdout == "back\n"
    runner.close()


def test_signal_death_is_128_plus_n(sshd):
    from thrust_remote.host.runner import LocalRunner

    for runner in (sshd.runner(), LocalRunner()):
        assert runner.run(["sh", "-c", "kill -TERM $$"]).exit_code == 128 + 15
        runner.close()


def test_timeout_kills_remote_command(sshd, tmp_path):
    runner = sshd.runner()
    marker = tmp_path / "late"
    # `sleep 3` is the behaviour under test: a command that outlives its 0.5 s timeout
    result = runner.run(["sh", "-c", f"sleep 3; touch {marker}"], timeout=0.5)
    assert result.timed_out and result.exit_code == 124
    # wait for the command to be gone from the host: at once when it was killed; had it survived, only
    # after its touch at 3 s (so the assert below sees the marker)
    wait_until(lambda: not _host_commands(sshd, lambda argv: str(marker) in " ".join(argv)), 10,
               "the timed-out command to end on the host")
    assert not marker.exists()
    runner.close()


def test_output_streams_line_by_line(sshd):
    runner = sshd.runner()
    seen: list[tuple[str, str, float]] = []
    runner.run(
        ["sh", "-c", "echo one; sleep 0.5; echo two >&2; printf partial"],
        stream=lambda name, line: seen.append((name, line, time.monotonic())),
    )
    assert [(n, line) for n, line, _ in seen] == [("out", "one"), ("err", "two"), ("out", "partial")]
    assert seen[1][2] - seen[0][2] > 0.3  # the first line arrived before the command finished
    runner.close()


def test_ssh_config_alias_and_proxyjump(cli, sshd, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n"
        f"Host jumped\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  ProxyJump gpu-alias\n"
    )
    cfg = tmp_path / "thrust.yaml"
    cfg.write_text(
        "hosts:\n"
        f"  a:\n    address: gpu-alias\n    known_hosts: {sshd.known_hosts}\n"
        f"  j:\n    address: jumped\n    known_hosts: {sshd.known_hosts}\n"
    )
    env = {"HOME": str(home)}
    result = cli("--config", str(cfg), "exec", "--host", "a", "--", "echo", "via-alias", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "via-alias\n"
    result = cli("--config", str(cfg), "exec", "--host", "j", "--", "echo", "via-jump", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "via-jump\n"
    # the jump hop is checked against known_hosts too (Fabric would AutoAdd it)
    empty = tmp_path / "empty_known"
    empty.write_text("")
    cfg.write_text(cfg.read_text().replace(str(sshd.known_hosts), str(empty)))
    result = cli("--config", str(cfg), "exec", "--host", "j", "--", "true", env=env)
    assert result.returncode == ExitCode.HOST_KEY
    assert empty.read_text() == ""


def test_a_connection_hint_names_the_config_file_the_user_gave(cli, sshd, tmp_path):
    """Under `--config other.yaml`, what to set is said to be set in other.yaml, not in a thrust.yaml the
    user does not have: an unknown host key, a name that does not resolve, a key the server refuses."""
    empty = tmp_path / "empty_known"
    empty.write_text("")
    cfg = tmp_path / "other.yaml"
    cfg.write_text(f"hosts:\n  a:\n    address: {sshd.user}@127.0.0.1:{sshd.port}\n    known_hosts: {empty}\n"
                   f"    identity: {sshd.client_key}\n"
                   f"  b:\n    address: {sshd.user}@no-such-host.invalid\n"
                   f"  c:\n    address: {sshd.user}@127.0.0.1:{sshd.port}\n    known_hosts: {sshd.known_hosts}\n"
                   f"    identity: {tmp_path / 'not-the-key'}\n")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "not-the-key")], check=True)
    for host, code, says in (("a", ExitCode.HOST_KEY, "`host_key_policy: accept-new` for this host in"),
                             ("b", None, "check the address in"),
                             ("c", ExitCode.AUTH, "under hosts.c in")):
        result = cli("--config", str(cfg), "exec", "--host", host, "--", "true", env={"COLUMNS": "1000"})
        assert result.returncode != 0 and (code is None or result.returncode == code), result.stderr
        assert f"{says} {cfg.resolve()}" in result.stderr, result.stderr
        assert "thrust.yaml" not in result.stderr, result.stderr


def test_ssh_config_user_known_hosts_file_is_where_keys_are_checked(cli, sshd, tmp_path):
    """An alias whose ~/.ssh/config names a UserKnownHostsFile, and thrust.yaml no `known_hosts:`: the
    key is checked there, as ssh would (not in ~/.ssh/known_hosts, which this home does not have)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    empty = tmp_path / "empty_known"
    empty.write_text("")

    def alias(known: Path) -> None:
        (home / ".ssh" / "config").write_text(
            f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
            f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {empty} {known}\n")

    cfg = tmp_path / "thrust.yaml"
    cfg.write_text("hosts:\n  a:\n    address: gpu-alias\n")
    alias(sshd.known_hosts)  # the second file has the key
    result = cli("--config", str(cfg), "exec", "--host", "a", "--", "echo", "checked", env={"HOME": str(home)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "checked\n"
    alias(tmp_path / "nowhere")
    result = cli("--config", str(cfg), "exec", "--host", "a", "--", "true", env={"HOME": str(home)})
    assert result.returncode == ExitCode.HOST_KEY
    assert f"is not in {empty}" in result.stderr and f">> {empty}" in result.stderr  # where to add it
    assert not (home / ".ssh" / "known_hosts").exists()
    spaced = tmp_path / "my keys" / "known hosts"  # one quoted path with spaces is one file, not three
    spaced.parent.mkdir()
    spaced.write_text(sshd.known_hosts.read_text())
    also = tmp_path / "my keys" / "other hosts"  # two quoted paths: paramiko strips the outer quotes only
    also.write_text("")
    for line in (f'UserKnownHostsFile "{spaced}"', f'UserKnownHostsFile="{spaced}"',
                 f'UserKnownHostsFile {empty} "{spaced}"', f'UserKnownHostsFile "{also}" "{spaced}"'):
        (home / ".ssh" / "config").write_text(
            f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
            f"  IdentityFile {sshd.client_key}\n  {line}\n")
        result = cli("--config", str(cfg), "exec", "--host", "a", "--", "true", env={"HOME": str(home)})
        assert result.returncode == 0, (line, result.stderr)
    not_yet = tmp_path / "my keys" / "new hosts"  # a first connection: the file is not there yet
    (home / ".ssh" / "config").write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f'  IdentityFile {sshd.client_key}\n  UserKnownHostsFile "{not_yet}"\n')
    result = cli("--config", str(cfg), "exec", "--host", "a", "--", "true", env={"HOME": str(home)})
    assert result.returncode == ExitCode.HOST_KEY and f"is not in {not_yet}:" in result.stderr, result.stderr
    # `/dev/null` (and `none`): how a config turns checking off. Never for us: ~/.ssh/known_hosts it is
    (home / ".ssh" / "config").write_text(
        f"Host gpu-alias\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile /dev/null none\n  StrictHostKeyChecking no\n")
    result = cli("--config", str(cfg), "exec", "--host", "a", "--", "true", env={"HOME": str(home)})
    assert result.returncode == ExitCode.HOST_KEY
    assert f"is not in {home / '.ssh' / 'known_hosts'}" in result.stderr


def test_each_proxyjump_hop_is_checked_against_its_own_alias_known_hosts_file(cli, sshd, tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    hop_file = tmp_path / "hop_known"

    def write(hop_known: str) -> None:
        hop_file.write_text(hop_known)
        (home / ".ssh" / "config").write_text(
            f"Host gate\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
            f"  IdentityFile {sshd.client_key}\n  UserKnownHostsFile {hop_file}\n"
            f"Host inner\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
            f"  IdentityFile {sshd.client_key}\n  ProxyJump gate\n  UserKnownHostsFile {sshd.known_hosts}\n")

    cfg = tmp_path / "thrust.yaml"
    cfg.write_text("hosts:\n  j:\n    address: inner\n")
    write(sshd.known_hosts.read_text())
    result = cli("--config", str(cfg), "exec", "--host", "j", "--", "echo", "through", env={"HOME": str(home)})
    assert result.returncode == 0, result.stderr
    write("")  # the jump host's own file lacks its key; the target's file has it: still refused
    result = cli("--config", str(cfg), "exec", "--host", "j", "--", "true", env={"HOME": str(home)})
    assert result.returncode == ExitCode.HOST_KEY
    assert str(hop_file) in result.stderr


def test_missing_or_wrong_identity_is_a_config_error_naming_the_field(cli, sshd, tmp_path):
    cfg = _config(tmp_path, sshd)
    for bad in (tmp_path / "no-such-key", sshd.client_key.with_suffix(".pub")):
        cfg.write_text(cfg.read_text().replace(str(sshd.client_key), str(bad)))
        result = cli("--config", str(cfg), "exec", "--", "true")
        assert result.returncode == ExitCode.CONFIG, result.stderr
        assert "hosts.sandbox.identity" in result.stderr
        cfg = _config(tmp_path, sshd)


def test_relative_workdir_is_under_the_home_directory(sshd):
    from thrust_remote.runs.control import host_paths

    runner = sshd.runner()
    paths = host_paths(runner, sshd.host_config(workdir="projects/thrust"))
    assert paths.workdir == runner.home().rstrip("/") + "/projects/thrust"
    runner.close()


def test_missing_cwd_is_a_cd_failure_on_both_runners(sshd, tmp_path):
    from thrust_remote.host.runner import LocalRunner

    for runner in (sshd.runner(), LocalRunner()):
        result = runner.run(["true"], cwd=str(tmp_path / "missing"))
        assert result.exit_code != 0
        assert result.exit_code != 127
        assert "cd" in result.stderr
        runner.close()


def test_a_commands_whole_output_arrives_though_its_exit_status_comes_before_the_last_bytes(sshd):
    """OpenSSH sends a command's exit status as soon as it exits, while output beyond the channel's window
    still waits for the laptop to read: the end is the status *and* the end of the output (EOF). Taking
    the status alone cut a 2 MiB run.json's read short now and then, so a too-large file read as small."""
    from thrust_remote.host.ssh import SSHRunner

    size = 3 << 20  # past paramiko's channel window (2 MiB): the last bytes come after the status
    with contextlib.closing(SSHRunner.from_host(sshd.host_config())) as runner:
        for _ in range(30):  # under load one in a few dozen was cut before the fix
            result = runner.run(["head", "-c", str(size), "/dev/zero"])
            assert result.ok and len(result.stdout) == size, len(result.stdout)


def test_a_command_that_ends_before_reading_its_stdin_gives_its_exit_status_not_a_lost_link(sshd):
    """The host closes the channel of a command that ended (a missing `python:` is 127 at once) while the
    laptop still writes its stdin: that answer is the command's, never "connection lost" (75)."""
    runner = sshd.runner()
    try:
        for _ in range(5):  # the race: the end must come while the write is under way
            done = runner.run(["sh", "-c", "exit 7"], stdin=b"x" * (8 << 20))
            assert done.exit_code == 7
        assert runner.run(["echo", "still connected"]).stdout.strip() == "still connected"
    finally:
        runner.close()
