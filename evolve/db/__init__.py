"""evolve's database: engine setup, schema versions and the ORM models."""
from __future__ import annotations

import os

from .engine import Database, DatabaseUnavailableError, create_evolve_engine
from .integrity import UnreadableDatabaseError, verify
from .migrate import SchemaVersionError, ensure_schema

DEFAULT_URL = "sqlite:///evolve.db"
DB_HELP = ("database URL or SQLite file path (default: $EVOLVE_DB, else sqlite:///evolve.db in the working "
           "directory); postgresql+psycopg://user@host/db shares one population across hosts")


def default_url() -> str:
    """`$EVOLVE_DB`, else `evolve.db` in the working directory."""
    return os.environ.get("EVOLVE_DB") or DEFAULT_URL


def open_database(url: str | None = None, *, check_schema: bool = True) -> Database:
    """Open `url` (any SQLAlchemy URL, or a SQLite file path); an empty database is migrated to the current
    schema, a database at another schema version raises SchemaVersionError.
    `check_schema=False` skips both (for tools that inspect or migrate it themselves).
    A damaged SQLite file raises UnreadableDatabaseError either way."""
    url = url or default_url()
    db = Database.from_engine(create_evolve_engine(url))
    try:
        verify(db.engine, url)
        if check_schema:
            ensure_schema(db)
    except BaseException:
        db.close()
        raise
    return db


__all__ = ["DB_HELP", "DEFAULT_URL", "Database", "DatabaseUnavailableError", "SchemaVersionError", "UnreadableDatabaseError", "default_url",
           "open_database"]
