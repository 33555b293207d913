"""Shared fixtures: a real OpenSSH server on 127.0.0.1 for the whole test session.

Fixtures
- `sshd` (session): an `SSHServer` — a private sshd with its own host key, client key,
  authorized_keys and a known_hosts file that trusts it. Useful members:
  `.port`, `.user`, `.client_key`, `.known_hosts`, `.address` ("user@127.0.0.1:PORT"),
  `.host_config(name="sandbox", **overrides) -> HostConfig`, `.runner(**overrides) -> SSHRunner`,
  `.thrust_yaml(path, hosts_extra="", workdir=...) -> Path` (a thrust.yaml with host `sandbox`),
  `.kill_sessions()` (SIGKILL the per-connection sshd processes: a lost link),
  `.sessions()` (their pids).
- `remote_dir` (function): a fresh directory for a test's "remote" side (reach it only over SSH).
- `cli` (function): run the installed `thrust-remote` console script as a user would; returns
  CompletedProcess (text). Pass `env=` to add variables, `cwd=` for the project dir.

Plain helpers (git projects, a project of a user's own, waiting on a condition) are in tests/helpers.py.

sshd runs under `unshare --pid --fork --kill-child --mount-proc`, started in its own session; the
teardown SIGKILLs that wrapper, which ends sshd, every session and every detached job started
through it (killing only sshd would leave `setsid` jobs alive).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from helpers import remote_tempdir

from thrust_remote.core.config import HostConfig

SSHD = "/usr/sbin/sshd"
REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# These machines set PYTHONDONTWRITEBYTECODE=1, so every python the tests start (a CLI, a local run, the
# trainer) would compile thrust_remote again (~0.3 s a start); an installed package has its .pyc files.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Tests press Ctrl-C on the CLIs they start (SIGINT). A suite started in the background by a
# non-interactive shell (`make test &`, `nohup`) inherits SIGINT ignored, and so would every CLI it
# starts: Python leaves an ignored SIGINT ignored, and the Ctrl-C tests would hang until their
# timeouts. A handled SIGINT here is reset to the default in every child at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ------------------------------------------------------------------------------------------ layers
# Every test is in one layer (docs/architecture.md, "Tests"), a marker `-m` selects:
# - core: in this process and host `local`, no sshd (config, protocol, logic, the CLI in-process);
# - ssh: what only a real sshd proves; a test that uses the `sshd` fixture (or another that starts
#   one) is ssh by that alone;
# - e2e: real training, several hosts in network namespaces, the browser, the wheel: marked as such.
LAYERS = ("core", "ssh", "e2e")
_layer_of_running_test: list[str] = []


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by the layer markers this adds
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marked = {m.name for m in item.iter_markers() if m.name in LAYERS}
        if "e2e" in marked:
            layer = "e2e"
        elif "ssh" in marked or "sshd" in getattr(item, "fixturenames", ()):
            layer = "ssh"
        else:
            layer = "core"
        if "core" in marked and layer != "core":
            raise pytest.UsageError(f"{item.nodeid} is marked core but needs an sshd or is e2e")
        if layer not in marked:
            item.add_marker(layer)
    # the long layers first: pytest-xdist hands tests out in this order, so the last minutes are spent
    # on short tests that fill both workers, not on one long test with the other worker idle
    items.sort(key=lambda item: LAYERS[::-1].index(_layer_of(item)))


def pytest_configure(config: pytest.Config) -> None:
    """The pair known to drop `--dist loadgroup`'s groups is refused with its reason (the check in each
    worker, below, catches a pair not known yet, though xdist then shows only an internal error)."""
    from importlib.metadata import version

    from packaging.version import Version

    if config.getoption("dist", "no") == "loadgroup" and Version(version("pytest")) >= Version("9.2") \
            and Version(version("pytest-xdist")) <= Version("3.8.0"):
        raise pytest.UsageError(f"pytest {version('pytest')} with pytest-xdist {version('pytest-xdist')} does not "
                                "group tests under --dist loadgroup (pytest-xdist issue 1386): install "
                                "'pytest<9.2' (make setup does)")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    _check_groups_took(session.config, session.items)  # pytest-xdist tags grouped nodeids while collecting


def _check_groups_took(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` a test marked `xdist_group(G)` carries `@G` in its nodeid, which is what
    sends the group to one worker. When it does not (pytest 9.2 with pytest-xdist 3.8 drop it without a
    word), modules whose tests share state would be split over workers: stop before anything runs."""
    if not getattr(config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        pytest.exit(f"--dist loadgroup did not group {lost[0]} (and {len(lost) - 1} more): this "
                    "pytest and pytest-xdist do not work together (see pyproject.toml's pin)", returncode=4)


def _layer_of(item: pytest.Item) -> str:
    return next((m.name for m in item.iter_markers() if m.name in LAYERS), "core")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Which layer the test being set up and run is in (before its fixtures, a module's included): a core
    test that starts an sshd fails (`_start_sshd`)."""
    _layer_of_running_test[:] = [_layer_of(item)]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _layer_of_running_test.clear()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "thrust-test", "-f", str(path)],
        check=True,
    )


@dataclass
class SSHServer:
    root: Path
    port: int
    user: str
    client_key: Path
    host_key: Path
    known_hosts: Path
    wrapper: subprocess.Popen
    log: Path
    _extra: dict = field(default_factory=dict)
    ip: str = "127.0.0.1"  # where it listens (an address in a network namespace: tests/netns.py)
    tmpfs: Path | None = None  # a second filesystem the host sees (the `sshd` fixture's), None if unmountable

    @property
    def address(self) -> str:
        return f"{self.user}@{self.ip}:{self.port}"

    @property
    def known_hosts_line(self) -> str:
        pub = (self.host_key.with_suffix(".pub")).read_text().split()
        return f"[{self.ip}]:{self.port} {pub[0]} {pub[1]}"

    def host_config(self, name: str = "sandbox", **overrides) -> HostConfig:
        base = HostConfig(
            name=name,
            address=self.address,
            workdir=str(self.root / "remote-home" / "thrust"),
            python=str(VENV_BIN / "python"),
            identity=str(self.client_key),
            known_hosts=str(self.known_hosts),
            host_key_policy="strict",
            connect_timeout=5.0,
        )
        return replace(base, **overrides)

    def runner(self, **overrides):
        from thrust_remote.host.ssh import SSHRunner

        return SSHRunner.from_host(self.host_config(**overrides))

    def thrust_yaml(self, path: Path, *, workdir: str | None = None, hosts_extra: str = "",
                    rest: str = "", name: str = "sandbox", known_hosts: Path | None = None) -> Path:
        hc = self.host_config(name)
        text = (
            f"default_host: {name}\n"
            "hosts:\n"
            f"  {name}:\n"
            f"    address: {hc.address}\n"
            f"    workdir: {workdir or hc.workdir}\n"
            f"    python: {hc.python}\n"
            f"    identity: {hc.identity}\n"
            f"    known_hosts: {known_hosts or hc.known_hosts}\n"
            f"    connect_timeout: 5\n"
            f"{hosts_extra}"
            f"{rest}"
        )
        path.write_text(text)
        return path

    def processes(self) -> list:
        """Every process on this host: those in its pid namespace (psutil.Process objects). Found by
        namespace, not as the wrapper's descendants: a process whose connection has just closed is
        reparented to the namespace's first process, and a walk of the tree made meanwhile misses it
        (a wait for a server's end once stopped at once on such a walk)."""
        import psutil

        try:
            namespace = os.readlink(f"/proc/{psutil.Process(self.wrapper.pid).children()[0].pid}/ns/pid")
        except (IndexError, OSError, psutil.Error):  # the host is gone
            return []
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{proc.pid}/ns/pid") == namespace:
                    found.append(proc)
        return found

    def named(self, name: str) -> list:
        """This host's processes called `name`; one that ends between the listing and the read of its
        name is left out (an sshd child ending there once failed a test with NoSuchProcess)."""
        import psutil

        found = []
        for proc in self.processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                if proc.name() == name:
                    found.append(proc)
        return found

    def _sshd_pid(self) -> int | None:
        import psutil

        for child in psutil.Process(self.wrapper.pid).children(recursive=True):
            try:
                if child.name() == "sshd" and child.parent() and child.parent().name() != "sshd":
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        return None

    def sessions(self) -> list[int]:
        """Pids of the per-connection sshd processes (children of the listener)."""
        import psutil

        main = self._sshd_pid()
        if main is None:
            return []
        pids = []
        for child in psutil.Process(main).children(recursive=True):
            try:
                if child.name() == "sshd":  # the privileged monitor and the session process
                    pids.append(child.pid)
            except psutil.NoSuchProcess:
                continue
        return pids

    def stop(self, grace_s: float = 2.0) -> None:
        """End sshd, its sessions and every job started through it: the host is gone. The shells of
        commands still in flight get SIGTERM first, so their EXIT traps run (see `release_rc_lock`),
        then the unshare wrapper gets SIGKILL, which ends everything left in its pid namespace."""
        import psutil

        try:
            shells = [p for p in psutil.Process(self.wrapper.pid).children(recursive=True)
                      if p.name() in ("bash", "sh")]
        except psutil.NoSuchProcess:
            shells = []
        for shell in shells:
            with contextlib.suppress(psutil.NoSuchProcess):
                shell.terminate()
        psutil.wait_procs(shells, timeout=grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.wrapper.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.wrapper.wait(timeout=10)

    def kill_sessions(self) -> int:
        """SIGKILL every per-connection sshd: the client sees the link die mid-command."""
        pids = self.sessions()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return len(pids)


def release_rc_lock(older_than_s: float = 60.0) -> bool:
    """Remove pyenv's rehash lock when it is older than any rehash holds it: True when one was removed.

    The test hosts are accounts of this machine and share its home. Here root's ~/.bashrc runs `pyenv
    rehash`: the test sshds replay that file instead (`account_rc`), but each worker sources it once to
    learn what it sets, and this machine's own shells run it. Rehash holds
    `$PYENV_ROOT/shims/.pyenv-shim` while it works and removes it in an EXIT trap. A shell SIGKILLed
    mid-rehash (a test host killed outright, a run interrupted before this one) leaves the lock behind,
    and every later command of the account waits pyenv's 60 s timeout for it: the suite then fails at
    random, long after the kill. A real host's lock would die with the host; `SSHServer.stop` lets
    shells run their traps first, and this clears what an earlier, harder ending left (a rehash takes
    well under a second)."""
    lock = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "shims" / ".pyenv-shim"
    try:
        if time.time() - lock.stat().st_mtime < older_than_s:
            return False
        lock.unlink()
    except FileNotFoundError:
        return False
    return True


# sshd's PATH for a session (Debian's build, the superuser's path): what the account's rc file starts from
SSHD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HIDDEN_VARS = {"_", "SHLVL", "PWD", "OLDPWD"}


def _rc_environment(bashrc: Path) -> dict[str, str] | None:
    """The variables `bashrc` sets or changes for a command that sshd starts (None: it failed)."""
    base = {"HOME": str(Path.home()), "USER": os_user(), "LOGNAME": os_user(), "SHELL": "/bin/bash",
            "PATH": SSHD_PATH}

    def env_after(script: str) -> dict[str, str] | None:
        done = subprocess.run(["bash", "--norc", "--noprofile", "-c", f"{script}env -0"], env=base,
                              capture_output=True, timeout=60, check=False)
        if done.returncode != 0:
            return None
        pairs = (item.split(b"=", 1) for item in done.stdout.split(b"\0") if b"=" in item)
        return {k.decode(): v.decode() for k, v in pairs}

    before, after = env_after(""), env_after(f". {shlex.quote(str(bashrc))} >/dev/null 2>&1; ")
    if before is None or after is None:
        return None
    return {k: v for k, v in after.items() if before.get(k) != v and k not in _HIDDEN_VARS}


@functools.lru_cache(maxsize=1)
def account_rc() -> str | None:
    """An rc file's text that gives a test host's commands the environment this account's ~/.bashrc gives
    them, without running it; None when there is nothing to replace (no ~/.bashrc, or it cannot be read).

    The test hosts are accounts of this machine, and bash reads ~/.bashrc for every command sshd
    starts. Here that file runs `pyenv init` (a `pyenv rehash` that rewrites the shims under a lock,
    ~140 processes and 0.15 s of CPU) for each of the suite's ~1,600 remote commands: a fifth of the
    suite's CPU, and two workers' commands waiting on each other's lock. Each sshd (in the mount
    namespace of its own `unshare`) sees this text bound over ~/.bashrc instead: the same PATH and
    variables, set by plain exports. What an rc file that prints does to the product is
    test_noisy_account's subject, with an account made for it."""
    bashrc = Path.home() / ".bashrc"
    if not bashrc.is_file():
        return None
    env = _rc_environment(bashrc)
    if env is None:
        return None
    lines = ["# tests/conftest.py: the environment ~/.bashrc gives a command, set without running it\n"]
    for key, value in sorted(env.items()):
        if key == "PATH" and value.endswith(":" + SSHD_PATH):  # what the rc adds, before sshd's own
            lines.append(f'export PATH={shlex.quote(value[:-len(SSHD_PATH)])}"$PATH"\n')
        else:
            lines.append(f"export {key}={shlex.quote(value)}\n")
    return "".join(lines)


def _sshd_argv(config: Path, netns: str | None) -> list[str]:
    """sshd in a pid and mount namespace of its own (`unshare`), with `account_rc` (written beside its
    config) bound over ~/.bashrc there: a mount this namespace alone sees; sshd starts all the same
    when the bind fails."""
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
    text = account_rc()
    if text is not None:
        rc = config.with_name("account_bashrc")
        rc.write_text(text)
        bind = shlex.join(["mount", "--bind", str(rc), str(Path.home() / ".bashrc")])
        argv += ["sh", "-c", f'{bind} 2>/dev/null; exec "$@"', "sh"]
    return [*(["ip", "netns", "exec", netns] if netns else []), *argv, SSHD, "-D", "-e", "-f", str(config)]


def _start_sshd(root: Path, ip: str = "127.0.0.1", netns: str | None = None, extra_config: str = "") -> SSHServer:
    """A private sshd on `ip` (inside network namespace `netns` when given: tests/netns.py), with
    `extra_config` lines appended to its sshd_config."""
    if _layer_of_running_test[-1:] == ["core"]:
        raise RuntimeError("a core test starts an sshd: mark it ssh (or e2e); core runs without one")
    if not Path(SSHD).exists():
        pytest.skip("openssh-server is not installed (make test installs it)")
    if release_rc_lock():
        warnings.warn("removed a stale pyenv rehash lock (a shell was killed mid-rehash before this run)",
                      stacklevel=1)
    root.mkdir(parents=True, exist_ok=True)
    host_key = root / "ssh_host_ed25519_key"
    client_key = root / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = root / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    port = _free_port()
    user = os_user()
    config = root / "sshd_config"
    log = root / "sshd.log"
    config.write_text(
        f"Port {port}\n"
        f"ListenAddress {ip}\n"
        f"HostKey {host_key}\n"
        f"PidFile {root / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {authorized}\n"
        "StrictModes no\n"
        "UsePAM no\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\n"
        "Subsystem sftp internal-sftp\n"
        "MaxSessions 30\n"
        "MaxStartups 100:30:200\n"
        "LogLevel ERROR\n"
        f"{extra_config}"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    wrapper = subprocess.Popen(
        _sshd_argv(config, netns),
        stdout=open(log, "ab"),  # noqa: SIM115 - lives as long as the server
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 10
    while True:
        try:
            with socket.create_connection((ip, port), timeout=1) as s:
                if s.recv(16).startswith(b"SSH-2.0"):
                    break
        except OSError:
            pass
        if wrapper.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sshd did not start: {log.read_text()}")
        time.sleep(0.02)
    known_hosts = root / "known_hosts"
    server = SSHServer(root, port, user, client_key, host_key, known_hosts, wrapper, log, ip=ip)
    known_hosts.write_text(server.known_hosts_line + "\n")
    (root / "remote-home").mkdir(exist_ok=True)
    return server


def os_user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _mount_tmpfs(path: Path, size: str = "256m") -> bool:
    """A tmpfs of its own at `path`: a second filesystem, whose device number (two digits here: 39)
    differs from the disk's (65024), for what passes device numbers between the two sides. False when
    this account may not mount (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


@pytest.fixture(scope="session")
def sshd() -> Iterator[SSHServer]:
    root = Path(tempfile.mkdtemp(prefix="thrust-sshd-"))
    # mounted before sshd starts: its mount namespace (unshare) copies the mounts made before it
    tmpfs = root / "tmpfs"
    mounted = _mount_tmpfs(tmpfs)
    server = _start_sshd(root)
    server.tmpfs = tmpfs if mounted else None
    try:
        yield server
    finally:
        server.stop()
        if mounted:
            subprocess.run(["umount", "-l", str(tmpfs)], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def remote_dir(sshd: SSHServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return remote_tempdir(sshd)


@pytest.fixture(params=["disk", "tmpfs"])
def remote_fs_dir(request: pytest.FixtureRequest, sshd: SSHServer) -> Path:
    """A fresh host-side directory on the disk, then on a tmpfs: the transfer tests run on both, so the
    device numbers a listing passes to the transfer helper differ in size and digits."""
    if request.param == "disk":
        return remote_tempdir(sshd)
    if sshd.tmpfs is None:
        pytest.skip("no tmpfs of the test's own: mounting needs root (make test runs as root in CI)")
    return Path(tempfile.mkdtemp(prefix="remote-", dir=sshd.tmpfs))


# TESTS_CLI=process runs every `cli(...)` call as a process (to compare, or to rule this out)
IN_PROCESS_OFF = os.environ.get("TESTS_CLI") == "process"


class Cli:
    """`thrust-remote ARGS` as a user runs it, with its exit code, stdout and stderr (text) as a
    CompletedProcess. `env=` adds variables (THRUST_CONFIG is dropped unless given), `cwd=` is where it
    runs, `input=` its stdin.

    A call runs in this process by default: the console script's own entry (`cli.main.run`, which maps
    every error to its exit code) inside typer's test runner isolation (stdin, stdout, stderr and the
    environment swapped for the call), in `cwd`. That is the same code a user's process runs, without a
    new interpreter's ~0.3-0.6 s of imports per call. `cli.process(...)` starts the real console script
    instead, and so does a call given a `timeout=` to enforce or made from another thread than the main
    one (calls side by side): what only a process shows (signals, exit at a broken pipe, a terminal)
    is tested that way."""

    def __init__(self) -> None:
        self.exe = str(VENV_BIN / "thrust-remote")

    @staticmethod
    def _env(env: dict | None) -> dict[str, str]:
        full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})}
        if env is None or "THRUST_CONFIG" not in env:
            full.pop("THRUST_CONFIG", None)
        return full

    def process(self, *args: str, env: dict | None = None, cwd: str | Path | None = None, timeout: float = 300,
                input: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([self.exe, *args], capture_output=True, text=True, env=self._env(env), cwd=cwd,
                              timeout=timeout, input=input)

    def __call__(self, *args: str, env: dict | None = None, cwd: str | Path | None = None,
                 timeout: float | None = None, input: str | None = None) -> subprocess.CompletedProcess:
        # a deadline only a process can be held to; and calls made side by side from threads (the
        # isolation swaps this process's streams and environment) are processes too
        if timeout is not None or IN_PROCESS_OFF or threading.current_thread() is not threading.main_thread():
            return self.process(*args, env=env, cwd=cwd, timeout=timeout, input=input)
        return run_in_process(list(args), env=self._env(env), cwd=cwd, input=input)


def run_in_process(args: list[str], *, env: dict[str, str], cwd: str | Path | None = None,
                   input: str | None = None) -> subprocess.CompletedProcess:
    """`thrust-remote ARGS` through its console-script entry in this process (see `Cli`)."""
    from typer.testing import CliRunner

    from thrust_remote.cli.main import run
    from thrust_remote.core.console import console, err_console

    # the variables this process has that `env` lacks are removed for the call, as a child would lack them
    overrides: dict[str, str | None] = {k: None for k in os.environ if k not in env}
    overrides.update(env)
    columns = env.get("COLUMNS", "")
    widths = [(c, c._width) for c in (console, err_console)]
    before = os.getcwd()
    code: int = 0
    with CliRunner().isolation(input=input, env=overrides) as (out, err, _):
        for c, _ in widths:  # rich read COLUMNS when the consoles were made: give them this call's
            c._width = int(columns) if columns.isdigit() else None
        try:
            if cwd is not None:
                os.chdir(cwd)
            run(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.chdir(before)
            for c, width in widths:
                c._width = width
            sys.stdout.flush()
            sys.stderr.flush()
        stdout, stderr = out.getvalue(), err.getvalue()
    return subprocess.CompletedProcess(["thrust-remote", *args], code, stdout.decode("utf-8", "replace"),
                                       stderr.decode("utf-8", "replace"))


@pytest.fixture
def cli() -> Cli:
    return Cli()
