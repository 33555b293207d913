"""Where a study lives: the driver's lease on the host, the study DB (a remote host's SQLite kept in
step with a local copy, or any --storage URL), and the Optuna study opened on it (docs/optimize.md).
Over several hosts (HostsStore): a SQLite file on the driver, or --storage, and a lease on every host."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import socket
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from thrust_remote.core.config import Config, HostConfig, JobConfig
from thrust_remote.core.errors import AuthError, ConnectionLostError, ThrustError, UnreachableError, UsageError
from thrust_remote.host.runner import pid_alive
from thrust_remote.host.session import HostSession
from thrust_remote.optimize import hostops
from thrust_remote.optimize.model import PRUNERS, OptimizeRequest

JOURNAL = "journal:"  # --storage journal:PATH (Optuna's JournalStorage with a JournalFileBackend)
LEASE_S = 60.0  # a remote study's driver lease: another laptop may take over after this much silence


def default_study_name(job: JobConfig) -> str:
    return job.name


class StudyStore:
    """Where the study lives, and (for a remote host's default SQLite) the copy kept in step with it."""

    def __init__(self, url: str, *, session: HostSession, lease: str, remote_db: str | None = None,
                 local_db: Path | None = None, label: str | None = None) -> None:
        self.url = url
        self.session = session
        self.runner = session.runner
        self.lease = lease
        self.remote_db = remote_db
        self.local_db = local_db
        self.label = label or url
        self.synced = remote_db is not None
        self.exclusive = False  # whether no other driver can use this study (HostsStore's local SQLite)
        self.sqlite_path: str | None = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        self._lease_written = 0.0
        self._token = secrets.token_hex(8)  # this driver's mark in the lease: every write checks it
        self.pushes = 0
        self.push_s = 0.0

    @classmethod
    def open(cls, config: Config, host: HostConfig, session: HostSession, studies_dir: str, study: str,
             storage: str | None) -> StudyStore:
        # one driver per study and host workdir: two would adopt each other's running trials (and two
        # copies of a synced SQLite file would overwrite each other's trials)
        lease = f"{studies_dir}/{study}.driver.json"
        if storage:
            return cls(storage, session=session, lease=lease, label=_redact(storage))
        remote = f"{studies_dir}/{study}.db"
        if host.is_local:
            Path(remote).parent.mkdir(parents=True, exist_ok=True)
            return cls(f"sqlite:///{remote}", session=session, lease=lease, label=f"sqlite:///{remote}")
        local = config.root / ".thrust" / "study-cache" / host.name / f"{study}.db"
        # not pulled here: the caller takes the lease first, then pulls (pulling replaces the local
        # cache, which a driver that already holds the lease may be writing to)
        return cls(f"sqlite:///{local}", session=session, lease=lease, remote_db=remote, local_db=local,
                   label=f"{host.name}:{remote}")

    # -- the synced SQLite copy -----------------------------------------------------------------
    def pull(self) -> None:
        """The host's copy replaces the local cache (the host's is the one that counts)."""
        assert self.runner is not None and self.remote_db is not None and self.local_db is not None
        self.local_db.parent.mkdir(parents=True, exist_ok=True)
        for stale in (self.local_db, *(Path(f"{self.local_db}-{x}") for x in ("journal", "wal", "shm"))):
            stale.unlink(missing_ok=True)
        self.runner.makedirs(os.path.dirname(self.remote_db))
        if self.runner.exists(self.remote_db):
            self.runner.get(self.remote_db, self.local_db)

    def push(self) -> None:
        """A consistent snapshot (sqlite backup) of the local copy onto the host (verified, atomic)."""
        if not self.synced:
            return
        assert self.runner is not None and self.remote_db is not None and self.local_db is not None
        if not self._owned():  # a driver that lost its lease must not overwrite the study
            raise self._lost()
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            snap = Path(tmp) / "snapshot.db"
            src = sqlite3.connect(self.local_db)
            dst = sqlite3.connect(snap)
            try:
                src.backup(dst)
            finally:
                dst.close()
                src.close()
            self.runner.put(snap, self.remote_db)
        self.pushes += 1
        self.push_s += time.monotonic() - t0

    # -- the lease ------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the study's lease on this host: refused while another driver holds it (a live pid on
        this machine, or a heartbeat younger than LEASE_S from another machine)."""
        for _attempt in range(3):
            text = hostops.lease_read(self.session, self.lease)
            if text is not None:
                self._refuse_if_held(text)
                # a dead driver's lease: take it over, then read it back (two takers: one wins)
                hostops.lease_take_over(self.session, self.lease, self._body())
                self._lease_written = time.time()
                if not self._owned():
                    continue
                return
            if hostops.lease_create(self.session, self.lease, self._body()):
                self._lease_written = time.time()
                return
        raise ThrustError(f"could not take the study lease {self.lease}")

    def _refuse_if_held(self, text: str) -> None:
        try:
            other = json.loads(text)
        except ValueError:
            other = {}
        age = time.time() - float(other.get("heartbeat") or 0)
        if other.get("hostname") == socket.gethostname():
            pid = int(other.get("pid") or 0)
            if pid and pid != os.getpid() and pid_alive(pid):
                raise ThrustError(f"this study is already being driven from this machine (pid {pid})",
                                  "wait for it, or stop it: Ctrl-C twice there, or optimize --stop")
        elif age < LEASE_S:
            raise ThrustError(
                f"this study is being driven from {other.get('hostname')} (seen {age:.0f} s ago)",
                f"wait {LEASE_S:.0f} s after it stops; to share one study between machines, give "
                "each its own host and use --storage postgresql://... (docs/optimize.md)")

    def _body(self) -> str:
        return json.dumps({"hostname": socket.gethostname(), "pid": os.getpid(), "heartbeat": time.time(),
                           "token": self._token})

    def _owned(self) -> bool:
        return hostops.lease_owned(self.session, self.lease, self._token)

    def _lost(self) -> ThrustError:
        return ThrustError(
            f"this driver lost the study lease {self.lease} to another driver (it was silent for more than "
            f"{LEASE_S:.0f} s); stopping here so the two do not overwrite each other's trials",
            "the other driver goes on with the study; its trials include this one's finished ones",
        )

    def heartbeat(self, force: bool = False) -> dict[str, ThrustError]:
        """Renew the lease, only while it is still ours (compare-and-swap on the host). Returns the
        hosts lost meanwhile: none here (one host: its link error is raised)."""
        if not force and time.time() - self._lease_written < LEASE_S / 4:
            return {}
        if not hostops.lease_swap(self.session, self.lease, self._body(), self._token):
            raise self._lost()
        self._lease_written = time.time()
        return {}

    def forget(self, host: str) -> None:
        """A lost host's lease is left to expire (HostsStore); one host's store never loses its host."""

    def release(self) -> None:
        """Drop the lease if it is still ours (never another driver's)."""
        hostops.lease_release(self.session, self.lease, self._token)


class HostsStore:
    """A study over several hosts (docs/optimize.md, "Several hosts"): the study DB is one place every
    host's trials reach through this driver, `<project>/.thrust/studies/<study>.db` by default, or
    --storage; each host holds this driver's lease (one driver per study and host workdir, as with one
    host: two would adopt each other's running trials). A lost host's lease is no longer renewed."""

    def __init__(self, url: str, label: str, leases: dict[str, StudyStore], exclusive: bool) -> None:
        self.url = url
        self.label = label
        self.leases = leases
        self.exclusive = exclusive
        self.synced = False
        self.sqlite_path: str | None = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else None
        self.pushes = 0
        self.push_s = 0.0

    @classmethod
    def open(cls, config: Config, hosts: list[tuple[str, HostSession, str]], study: str,
             storage: str | None) -> HostsStore:
        """`hosts`: (name, session, studies dir on that host) for each host the study runs on."""
        if storage:
            url, label = storage, _redact(storage)
        else:
            local = config.root / ".thrust" / "studies" / f"{study}.db"
            local.parent.mkdir(parents=True, exist_ok=True)
            url = label = f"sqlite:///{local}"
        leases = {name: StudyStore(url, session=session, lease=f"{studies_dir}/{study}.driver.json")
                  for name, session, studies_dir in hosts}
        return cls(url, label, leases, exclusive=not storage)

    def acquire(self) -> None:
        """Every host's lease, or none: a refusal on one host releases the ones already taken."""
        taken: list[StudyStore] = []
        try:
            for lease in self.leases.values():
                lease.acquire()
                taken.append(lease)
        except BaseException:
            for lease in taken:
                with contextlib.suppress(ThrustError):
                    lease.release()
            raise

    def pull(self) -> None:
        pass

    def push(self) -> None:
        pass

    def heartbeat(self, force: bool = False) -> dict[str, ThrustError]:
        lost: dict[str, ThrustError] = {}
        for name, lease in list(self.leases.items()):
            try:
                lease.heartbeat(force)
            except (ConnectionLostError, UnreachableError) as exc:
                lost[name] = exc
        return lost

    def forget(self, host: str) -> None:
        self.leases.pop(host, None)

    def release(self) -> None:
        for lease in self.leases.values():
            with contextlib.suppress(ConnectionLostError, UnreachableError):
                lease.release()


# ------------------------------------------------------------------------------- the Optuna study

def open_study(store: StudyStore | HostsStore, name: str, request: OptimizeRequest, direction: str = "maximize",
               storage: Any = None) -> Any:
    """The study (created, or loaded to continue it): TPE with the constant liar, so parallel trials
    asked before any tells spread out instead of sampling the same point. `storage`: the --storage
    one already opened by `open_storage` (else it is opened here from the store's URL)."""
    import optuna

    if storage is None:
        storage = _storage(store)
    return optuna.create_study(
        study_name=name, storage=storage, direction=direction, load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=request.seed, constant_liar=True,
                                           n_startup_trials=min(10, max(2, request.trials // 3))),
        pruner=make_pruner(request),
    )


def _storage(store: StudyStore | HostsStore) -> Any:
    return open_storage(store.url)


def open_storage(url: str) -> Any:
    """The storage at `url` opened, Optuna's tables made on first use: an unusable URL, server or
    driver raises a ThrustError saying which, the password never in it. The driver calls it before any
    host is touched, so a --storage that cannot work costs no sync nor venv."""
    if url.startswith(JOURNAL):
        return journal_storage(url)
    import optuna
    import sqlalchemy
    from sqlalchemy import exc as sa_exc

    label = _redact(url)
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sa_exc.ArgumentError:
        raise UsageError(f"--storage {label}: not a database URL",
                         "give one like postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or journal:FILE") from None
    engine_kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite" and parsed.database:
        engine_kwargs["creator"] = _sqlite_connect(parsed.database)
    elif parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        # libpq waits without end on a host that drops packets; a URL's own connect_timeout wins
        engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    try:
        with _creation_lock(parsed, engine_kwargs):
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except ImportError as exc:
        raise _missing_driver(label, exc) from None
    except sa_exc.ArgumentError as exc:  # NoSuchModuleError: a dialect or driver name SQLAlchemy has not
        raise UsageError(f"--storage {label}: {exc}",
                         "the scheme is DIALECT[+DRIVER], e.g. postgresql:// or postgresql+psycopg://") from None
    except sa_exc.DBAPIError as exc:
        raise _server_error(label, parsed, exc) from None


CONNECT_TIMEOUT_S = 10
# pg_advisory_lock's key while Optuna makes its tables: two drivers opening an empty database at once
# would both create them, and one fail on a duplicate key (alembic_version, pg_type)
TABLES_LOCK = 0x7468727573740001


@contextlib.contextmanager
def _creation_lock(url: Any, engine_kwargs: dict[str, Any]) -> Any:
    """On PostgreSQL, one driver at a time makes (or finds) Optuna's tables: a session-level advisory
    lock of this database on a connection of its own, released when it closes even if we die."""
    if url.get_backend_name() != "postgresql":
        yield
        return
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    engine = sqlalchemy.create_engine(url, poolclass=NullPool, **engine_kwargs)
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:key)"), {"key": TABLES_LOCK})
            try:
                yield
            finally:
                conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:key)"), {"key": TABLES_LOCK})
    finally:
        engine.dispose()


# the package that brings a DB-API module SQLAlchemy imports, where its name is not the module's
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                   "pymysql": "PyMySQL", "mysql": "mysql-connector-python", "cx_Oracle": "cx-Oracle"}


def _missing_driver(label: str, exc: ImportError) -> ThrustError:
    cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
    module = (cause.name or "").split(".")[0]
    package = DRIVER_PACKAGES.get(module, module) or "the database driver its scheme names"
    return UnreachableError(
        f"--storage {label}: thrust-remote's python has no {module or 'driver'} module to talk to this database",
        f"install it there: {shlex.quote(sys.executable)} -m pip install {shlex.quote(package)}")


def _server_error(label: str, url: Any, exc: Any) -> ThrustError:
    """The server's own words (the DB-API's first lines, never the statement nor the password), with
    the exit code of what went wrong: 77 a refused login, 69 anything else that keeps it closed."""
    words = str(getattr(exc, "orig", None) or exc).strip()
    if url.password:
        words = words.replace(str(url.password), "***")
    words = " ".join(line.strip() for line in words.splitlines()[:2] if line.strip())
    where = f"{url.host or 'localhost'}:{url.port or 'default port'}"
    message = f"the study storage {label} cannot be opened: {words}"
    if "authentication failed" in words or "password" in words:
        return AuthError(message, "check the user and password in the URL (--storage or THRUST_STUDY_STORAGE)")
    if "does not exist" in words and url.database and f'"{url.database}"' in words:
        return UnreachableError(message, f"create the database {url.database} on {where} (e.g. createdb -h "
                                         f"{url.host or 'localhost'} -p {url.port or 5432} -U {url.username} "
                                         f"{url.database}, as a role that may), or fix its name in the URL")
    return UnreachableError(message, f"check that the database server is up and accepts connections at {where}")


def _sqlite_connect(path: str) -> Any:
    def connect() -> sqlite3.Connection:
        # WAL + synchronous=NORMAL: a commit without an fsync (~5 ms instead of ~30 ms; a launch
        # writes several), still safe against corruption; readers (optuna-dashboard) never block us
        conn = sqlite3.connect(path, timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    return connect


def journal_storage(url: str) -> Any:
    """`journal:PATH`: Optuna's journal storage in a file (one JSON line per change, appended under a
    lock), which several drivers on one machine or a shared filesystem may use at once."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = Path(url.removeprefix(JOURNAL)).expanduser()
    if not str(path) or str(path) == ".":
        raise UsageError(f"--storage {url}: name the journal file, e.g. journal:studies.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def make_pruner(r: OptimizeRequest) -> Any:
    import optuna

    assert r.pruner in PRUNERS
    if r.pruner == "none":
        return optuna.pruners.NopPruner()
    if r.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(1, r.prune_warmup), reduction_factor=3)
    return optuna.pruners.MedianPruner(n_startup_trials=r.prune_startup, n_warmup_steps=r.prune_warmup)


def remember_settings(study: Any, settings: dict[str, Any], reporter: hostops.Reporter) -> int | None:
    """Record what the study searches; warn when an earlier run of it searched something else. Returns
    the rung size an earlier run fixed (None for a new study)."""
    attrs = study.user_attrs
    old = attrs.get("settings")
    if old is not None and json.loads(json.dumps(old)) != json.loads(json.dumps(settings)):
        now = json.loads(json.dumps(settings))
        changed = sorted(k for k in {*old, *now} if old.get(k) != now.get(k)) if isinstance(old, dict) else []
        what = f" ({', '.join(changed)} changed)" if changed else ""
        reporter.warn(f"study {study.study_name} was started with other settings{what}; its earlier trials "
                      f"still count: give --study NEW_NAME for a study of the new ones alone")
    study.set_user_attr("settings", settings)
    return attrs.get("rung_steps")


def _redact(url: str) -> str:
    """postgresql://user:secret@db/x → postgresql://user:***@db/x (for messages and JSON)."""
    if "://" in url and "@" in url:
        scheme, rest = url.split("://", 1)
        cred, at, tail = rest.rpartition("@")
        if ":" in cred:
            cred = cred.split(":", 1)[0] + ":***"
        return f"{scheme}://{cred}{at}{tail}"
    return url
