"""A SQLite file that is not a readable database (random bytes, truncated, torn) is
reported as one clear line, not as a driver traceback from whichever query hit it first.

`verify` runs SQLite's `quick_check` when a database is opened (milliseconds for evolve's
sizes), so the damage is found before any command starts work; `explain` recognises the
same damage when it surfaces later as a driver error.
"""
from __future__ import annotations

import sqlite3

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from .engine import as_url

UPGRADE_HINT = "restore it from a backup or move it aside and start a new one with 'evolve db upgrade'"
# sqlite3 messages that mean the file itself is damaged or unusable, not a busy or
# missing-table condition.
_DAMAGE = ("file is not a database", "malformed", "corrupt", "unable to open database file",
           "disk i/o error", "not a database")


class UnreadableDatabaseError(RuntimeError):
    """The SQLite file cannot be read as a database."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"the database file {path} is not a readable SQLite database ({reason}); {UPGRADE_HINT}")


def sqlite_file(url: str) -> str | None:
    """The file behind a SQLite URL or path; None for other databases and :memory:."""
    try:
        parsed = as_url(url)
    except Exception:  # noqa: BLE001 - a URL SQLAlchemy cannot parse is not a SQLite file
        return None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return str(parsed.database)


def _is_damage(exc: BaseException) -> str | None:
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    if not isinstance(orig, sqlite3.DatabaseError):
        return None
    text = str(orig)
    return text if any(d in text.lower() for d in _DAMAGE) else None


def explain(exc: BaseException, url: str) -> UnreadableDatabaseError | None:
    """The one-line error for `exc` if it says the SQLite file at `url` is damaged."""
    path = sqlite_file(url)
    reason = _is_damage(exc)
    if path is None or reason is None:
        return None
    return UnreadableDatabaseError(path, reason)


def verify(engine: Engine, url: str) -> None:
    """Raise UnreadableDatabaseError unless the SQLite file at `url` passes quick_check."""
    path = sqlite_file(url)
    if path is None:
        return
    try:
        with engine.connect() as conn:
            result = conn.exec_driver_sql("PRAGMA quick_check(1)").scalar()
            conn.rollback()
    except DBAPIError as exc:
        unreadable = explain(exc, url)
        if unreadable is None:
            raise
        raise unreadable from None
    if result != "ok":
        raise UnreadableDatabaseError(path, f"integrity check: {str(result).splitlines()[0]}")
