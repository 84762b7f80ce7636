"""Engine and session setup.

SQLite gets WAL (readers never wait for the writer), a busy timeout (a writer waits for
the lock instead of failing) and `BEGIN IMMEDIATE` for write transactions: the write lock
is taken when the transaction starts, so two writers queue up instead of one failing
with "database is locked" when a deferred read transaction tries to upgrade. Read
transactions stay deferred.

PostgreSQL (`postgresql+psycopg://...`) keeps its normal READ COMMITTED transactions, so
writers run side by side; what must happen one at a time takes a lock where it matters
instead: a row lock (`SELECT ... FOR NO KEY UPDATE`, which SQLite's dialect leaves out
because its write lock already covers it) or `Database.serialize` (an advisory lock).
Pooled connections are checked before use, so a database restart costs a reconnect,
not a failed stage.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

BUSY_TIMEOUT_MS = 60_000
_WRITE_OPTION = "evolve_write"


# Advisory lock keys (PostgreSQL's pg_advisory_xact_lock takes one bigint): one per
# thing that must happen once at a time across every process on the database.
SCHEMA_LOCK = 0x65766F6C76650001   # "evolve" + 1: migrating the schema


def _is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def _is_postgresql(engine: Engine) -> bool:
    return engine.dialect.name == "postgresql"


def _install_sqlite_hooks(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" hook, not the sqlite3 module, open transactions.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys = ON")
        if engine.url.database not in (None, "", ":memory:"):
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        immediate = connection.get_execution_options().get(_WRITE_OPTION, False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def as_url(text: str) -> URL:
    """A SQLAlchemy URL as given, or a plain file path as the SQLite database at that path
    (`:memory:` as an in-memory one); a path's `?` or `#` stay part of the file name."""
    if "://" in text:
        return make_url(text)
    if text == ":memory:":
        return URL.create("sqlite")
    return URL.create("sqlite", database=str(Path(text).expanduser().resolve()))


class DatabaseUnavailableError(RuntimeError):
    """The database cannot be reached or its driver is not installed."""


def create_evolve_engine(url: str) -> Engine:
    """An engine for any SQLAlchemy URL (or a SQLite file path), with evolve's SQLite
    settings where they apply."""
    parsed = as_url(url)
    kwargs: dict[str, Any] = {}
    if parsed.get_backend_name() == "sqlite":
        # The busy timeout above is the one that matters; sqlite3's own is kept equal.
        kwargs["connect_args"] = {"timeout": BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
    elif parsed.get_backend_name() == "postgresql":
        # A server restart or an idle connection dropped by a firewall costs one reconnect.
        kwargs["pool_pre_ping"] = True
        # The search loop runs a pipeline per GPU slot plus one, each holding at most one
        # connection for one short transaction; the overflow covers bursts beyond that.
        kwargs["pool_size"] = 8
        kwargs["max_overflow"] = 16
    try:
        engine = create_engine(parsed, **kwargs)
    except ModuleNotFoundError as exc:
        hint = " (pip install 'kcoral-evolve[postgres]')" if parsed.get_backend_name() == "postgresql" else ""
        raise DatabaseUnavailableError(
            f"the database driver for {parsed.drivername} is not installed: no module {exc.name!r}{hint}") from None
    if _is_sqlite(engine):
        _install_sqlite_hooks(engine)
    return engine


@dataclass
class Database:
    """An engine plus its session factories; `write()` and `read()` are one transaction each."""

    engine: Engine
    read_sessionmaker: sessionmaker[Session]
    write_sessionmaker: sessionmaker[Session] = field(repr=False)

    @classmethod
    def from_engine(cls, engine: Engine) -> Database:
        writer = engine.execution_options(**{_WRITE_OPTION: True})
        return cls(
            engine=engine,
            read_sessionmaker=sessionmaker(bind=engine, expire_on_commit=False),
            write_sessionmaker=sessionmaker(bind=writer, expire_on_commit=False),
        )

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A session whose transaction holds the write lock from its start; commits on success."""
        with self.write_sessionmaker() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self.read_sessionmaker() as session, session.begin():
            yield session

    def write_connection(self) -> AbstractContextManager[Connection]:
        """A connection in a transaction that holds the write lock from its start;
        commits when the block ends without an exception."""
        return self.engine.execution_options(**{_WRITE_OPTION: True}).begin()

    @property
    def is_postgresql(self) -> bool:
        return _is_postgresql(self.engine)

    def serialize(self, conn: Connection | Session, key: int) -> None:
        """Hold lock `key` until this transaction ends, so work under it runs one process
        at a time (PostgreSQL: an advisory transaction lock; SQLite: its write lock, which a
        write transaction holds already)."""
        if self.is_postgresql:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _signed64(key)})

    def checkpoint(self) -> None:
        """SQLite: move what the write-ahead log holds into the database file, so the file
        alone is the whole population. A closed connection does this itself; a process that
        leaves without closing (an abandoned run exits at once) left it all in `F-wal`, and
        a copy of `F` alone came out empty (seen: an H200 run's database, 2026-12-05)."""
        if self.is_postgresql:
            return
        with self.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self.engine.dispose()


def _signed64(key: int) -> int:
    return key - (1 << 64) if key >= (1 << 63) else key
