"""`optimize --storage postgresql://...`: one study shared by two drivers through a real PostgreSQL
server. `make test` installs Debian's `postgresql` (the server binaries; as root) and the dev extra's
driver, psycopg 3 (SQLAlchemy 2.1 reads a bare `postgresql://` as psycopg); the `postgres` fixture
starts a private cluster of its own for this module: initdb into a temporary directory, a free port
on 127.0.0.1, password (SCRAM) logins over TCP as a user would have them, a database and a role with
a password, the postmaster's pid recorded and stopped at teardown.

The trials are runs of tests/fake_train.py (job `fake`): the subject is the shared study, not training.
"""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_optimize import local_project

# e2e: a real database server, as the browser tests have a real browser; `make test-fast` leaves it out
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.xdist_group("test_optimize_postgres")]

EXE = str(Path(sys.executable).parent / "thrust-remote")
SUPERUSER = "postgres"  # the cluster's own superuser; the study's role below is not one


@dataclass(frozen=True)
class Postgres:
    port: int
    database: str
    role: str
    password: str
    psql: tuple[str, ...]  # the superuser's psql over the cluster's own socket (trusted, no password)

    def url(self, scheme: str = "postgresql", database: str | None = None) -> str:
        return f"{scheme}://{self.role}:{self.password}@127.0.0.1:{self.port}/{database or self.database}"

    def sql(self, text: str) -> None:
        subprocess.run([*self.psql, "-v", "ON_ERROR_STOP=1", "-q"], input=text, check=True, capture_output=True,
                       text=True)

    def empty_database(self, name: str) -> str:
        """A new database of the study's role, without Optuna's tables: its URL."""
        self.sql(f"CREATE DATABASE {name} OWNER {self.role};\n")
        return self.url(database=name)


def server_bin() -> Path | None:
    """Debian's server binaries (initdb, pg_ctl are not on PATH there), the newest version first."""
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / "initdb").exists() and (base / "pg_ctl").exists():
            return base
    return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    pg = server_bin()
    root = os.getuid() == 0
    if pg is None:
        if not root:  # `make test` installs the package only where it may (root, as on CI)
            pytest.skip("no PostgreSQL server binaries under /usr/lib/postgresql, and not root to install "
                        "them: sudo apt-get install postgresql (what `make test` does as root)")
        pytest.fail("no PostgreSQL server binaries under /usr/lib/postgresql: `make system-deps` installs "
                    "Debian's postgresql")
    if importlib.util.find_spec("psycopg") is None:  # a dev dependency: missing is a broken set-up
        pytest.fail("no PostgreSQL driver (psycopg): `make setup` installs the dev extra (pyproject.toml)")
    # initdb and the postmaster refuse to run as root: as root, the package's own `postgres` user runs them
    as_user = ["runuser", "-u", "postgres", "--"] if root else []
    base = Path(tempfile.mkdtemp(prefix="thrust-pg-"))  # not pytest's tmp_path: mode 700, root's
    if root:
        shutil.chown(base, "postgres")
    data, port = base / "data", free_port()
    run = dict(check=True, capture_output=True, text=True)
    subprocess.run([*as_user, str(pg / "initdb"), "-D", str(data), "-U", SUPERUSER, "-E", "UTF8", "--no-sync",
                    "--auth-local=trust", "--auth-host=scram-sha-256"], **run)
    # fsync off: a throwaway cluster; -k: its socket in our directory, not /var/run/postgresql
    subprocess.run([*as_user, str(pg / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-w", "-o",
                    f"-p {port} -h 127.0.0.1 -k {base} -c fsync=off", "start"], **run)
    pid = int((data / "postmaster.pid").read_text().split()[0])
    try:
        psql = (str(pg / "psql"), "-h", str(base), "-p", str(port), "-U", SUPERUSER, "-d", "postgres")
        server = Postgres(port, "studies", "optuna", secrets.token_urlsafe(18), psql)
        # the password goes in on stdin (a command line is public in /proc), over the trusted socket
        server.sql(f"CREATE ROLE {server.role} LOGIN PASSWORD '{server.password}';\n"
                   f"CREATE DATABASE {server.database} OWNER {server.role};\n")
        yield server
    finally:
        subprocess.run([*as_user, str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True)
        if Path(f"/proc/{pid}").exists():  # pg_ctl could not stop it: the pid we recorded at start
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


def start_driver(root: Path, storage: str, out: Path) -> subprocess.Popen:
    """`optimize fake` as its own process, the storage URL in THRUST_STUDY_STORAGE, not on its command
    line; stdout (the JSON summary) and stderr into files under `out`."""
    argv = [EXE, "optimize", "fake", "--study", "shared", "--trials", "4", "--parallel", "2", "--pruner", "none",
            "--set", "seconds=0.3", "--json"]
    with (out / "stdout").open("wb") as stdout, (out / "stderr").open("wb") as stderr:
        return subprocess.Popen(argv, cwd=root, stdout=stdout, stderr=stderr,
                                env={**os.environ, "NO_COLOR": "1", "THRUST_STUDY_STORAGE": storage})


@pytest.mark.timeout(300)
def test_two_drivers_share_one_study_in_postgresql(postgres, tmp_path):
    """Two drivers at once (two laptops, each with its own host: here two projects on the local host),
    one study in PostgreSQL: together they stop near N, each driver's summary counts both."""
    import optuna

    # a documented bare postgresql:// and an explicit driver name reach the same database, EMPTY: the
    # two drivers make Optuna's tables at the same moment (one at a time, under an advisory lock)
    urls = {"a": postgres.url(), "b": postgres.url("postgresql+psycopg")}
    drivers = {}
    for name, url in urls.items():
        root = local_project(tmp_path, name, fake=True)
        (tmp_path / f"{name}-out").mkdir()
        drivers[name] = (root, start_driver(root, url, tmp_path / f"{name}-out"))
    for name, (_, proc) in drivers.items():
        proc.wait(timeout=240)
        stderr = (tmp_path / f"{name}-out" / "stderr").read_text()
        assert proc.returncode == 0, stderr
    study = optuna.load_study(study_name="shared", storage=postgres.url())
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    # each driver counts both drivers' trials toward 4: past it by at most the other's two running ones
    assert 4 <= len(done) <= 6, [t.state.name for t in study.trials]
    assert not any(t.state.name == "RUNNING" for t in study.trials)
    ran: dict[str, set[str]] = {}
    for name, url in urls.items():
        root, _ = drivers[name]
        out = json.loads((tmp_path / f"{name}-out" / "stdout").read_text())
        assert out["storage"] == url.replace(postgres.password, "***")
        # it stopped on both drivers' trials: those done and the other's still running count toward N
        assert sum(out["counts"][state] for state in ("COMPLETE", "PRUNED", "RUNNING")) >= 4, out["counts"]
        ran[name] = {p.name for p in (root / ".thrust" / "runs").iterdir()}
        assert not (root / ".thrust" / "studies" / "shared.db").exists()  # nothing in SQLite
    # both drivers launched trials, none twice: the study's trials are the two projects' runs together
    assert ran["a"] and ran["b"] and not ran["a"] & ran["b"]
    assert {t["run_id"] for t in out["trials"]} == ran["a"] | ran["b"]


def test_the_storage_password_is_written_nowhere(postgres, tmp_path):
    """The URL's password reaches the database and nothing else: not the output, not a run's record
    (a trial's command line, its environment file), not the lease."""
    root = local_project(tmp_path, "secret", fake=True)
    (tmp_path / "out").mkdir()
    proc = start_driver(root, postgres.url(), tmp_path / "out")
    proc.wait(timeout=240)
    outputs = [(tmp_path / "out" / name).read_text() for name in ("stdout", "stderr")]
    assert proc.returncode == 0, outputs[1]
    assert "***" in outputs[0]  # the redacted URL is in the summary
    secret = postgres.password.encode()
    leaked = [p for p in (root / ".thrust").rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert not leaked and not any(postgres.password in o for o in outputs), leaked


def open_at_once(url: str, drivers: int) -> tuple[list[str], list[str]]:
    """`drivers` threads open the study at `url` at the same moment (a barrier): the studies' names they
    got, and their errors."""
    from thrust_remote.optimize.store import HostsStore, open_study

    request = SimpleNamespace(seed=1, trials=4, pruner="none", prune_startup=2, prune_warmup=4)
    barrier, errors, names = threading.Barrier(drivers), [], []

    def open_one() -> None:
        barrier.wait(timeout=60)
        try:
            names.append(open_study(HostsStore(url, "race", {}, exclusive=False), "shared", request).study_name)
        except Exception as exc:  # the race's IntegrityError / ProgrammingError, kept to assert on
            errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")

    threads = [threading.Thread(target=open_one) for _ in range(drivers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return names, errors


def test_drivers_opening_an_empty_database_at_once_all_get_the_study(postgres):
    """Six drivers open one EMPTY database at the same moment (Optuna makes its tables on first use),
    three times over: each gets the study, none fails on a table another one made."""
    for attempt in range(3):
        names, errors = open_at_once(postgres.empty_database(f"race{attempt}"), 6)
        assert not errors, errors
        assert names == ["shared"] * 6


def optimize_on(cli, root: Path, storage: str, *flags: str):
    return cli(*flags, "optimize", "fake", "--study", "shared", "--trials", "1", cwd=root,
               env={"THRUST_STUDY_STORAGE": storage})


def assert_user_error(result, code: int, *words: str) -> None:
    """`code`, no traceback, no internal error, every word in stderr."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


def test_a_wrong_password_is_77_without_the_password(postgres, tmp_path, cli):
    root = local_project(tmp_path, "wrong", fake=True)
    wrong = postgres.url().replace(postgres.password, "not-the-password")
    result = optimize_on(cli, root, wrong)
    assert_user_error(result, 77, "password authentication failed", "optuna:***@",
                      "hint: check the user and password in the URL")
    assert "not-the-password" not in result.stderr + result.stdout
    debug = optimize_on(cli, root, wrong, "--debug")  # the traceback, still without the password
    assert debug.returncode == 77 and "not-the-password" not in debug.stderr + debug.stdout


def test_a_missing_database_is_69_naming_it(postgres, tmp_path, cli):
    result = optimize_on(cli, local_project(tmp_path, "nodb", fake=True), postgres.url(database="nosuch"))
    assert_user_error(result, 69, 'database "nosuch" does not exist', "hint: create the database nosuch")
    assert postgres.password not in result.stderr


def test_a_server_not_listening_is_69(postgres, tmp_path, cli):
    closed = postgres.url().replace(f":{postgres.port}/", f":{free_port()}/")
    result = optimize_on(cli, local_project(tmp_path, "closed", fake=True), closed)
    assert_user_error(result, 69, "Connection refused", "hint: check that the database server is up")


def test_a_missing_driver_names_the_package_to_install(postgres, tmp_path, cli):
    # pg8000: a PostgreSQL driver SQLAlchemy knows, not installed here (asserted: else this proves nothing)
    assert importlib.util.find_spec("pg8000") is None
    result = optimize_on(cli, local_project(tmp_path, "nodriver", fake=True), postgres.url("postgresql+pg8000"))
    assert_user_error(result, 69, "no pg8000 module", f"{sys.executable} -m pip install pg8000")


@pytest.mark.parametrize("url", ["postgresql+nosuch://u:secret@127.0.0.1/x", "postgres ql://u:secret@x/y"])
def test_a_url_that_is_none_is_64(tmp_path, cli, url):
    result = optimize_on(cli, local_project(tmp_path, "badurl", fake=True), url)
    assert_user_error(result, 64, "--storage ")
    assert "secret" not in result.stderr


def dead_host_project(tmp_path: Path) -> Path:
    """Job `fake` on a host whose port is closed: whatever reaches the host first fails naming it."""
    return local_project(tmp_path, "dead", "default_host: dead\nhosts:\n  dead:\n    address: someone@127.0.0.1:1\n"
                                           "    connect_timeout: 3\n", fake=True)


@pytest.mark.parametrize("bad", ["password", "journal"])
def test_a_storage_that_cannot_work_fails_before_any_host_is_touched(postgres, tmp_path, cli, bad):
    """The storage is opened first: its own error, never the host's (which the command never reached)."""
    storage = postgres.url().replace(postgres.password, "not-the-password") if bad == "password" else "journal:"
    result = optimize_on(cli, dead_host_project(tmp_path), storage)
    assert_user_error(result, 77 if bad == "password" else 64, "--storage" if bad == "journal" else "storage")
    assert "127.0.0.1:1" not in result.stderr and "cannot connect" not in result.stderr, result.stderr
