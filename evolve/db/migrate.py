"""Schema versions: Alembic configured in code, so no alembic.ini or cwd is needed.

`ensure_schema` is what `open_database` calls: an empty database is migrated to the
newest revision, a database at the newest revision is used as is, anything else is
refused with a message that names `evolve db upgrade`.
"""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from .engine import SCHEMA_LOCK, Database

UPGRADE_COMMAND = "evolve db upgrade"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"  # Alembic's env.py and versions/


class SchemaVersionError(RuntimeError):
    """The database's schema is not the one this evolve was built for."""


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if url is not None:
        # ConfigParser interpolation treats % specially (URL-escaped passwords).
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"{MIGRATIONS / 'versions'} holds no revision"
    return head


def known_revisions() -> set[str]:
    script = ScriptDirectory.from_config(alembic_config())
    return {rev.revision for rev in script.walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _is_empty(connection: Connection) -> bool:
    # An alembic_version table alone (left by a downgrade to base) still counts as empty.
    return not set(inspect(connection).get_table_names()) - {"alembic_version"}


def _upgrade_on(connection: Connection, revision: str) -> None:
    cfg = alembic_config()
    cfg.attributes["connection"] = connection
    command.upgrade(cfg, revision)


def upgrade(db: Database, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to `revision` in one write transaction; returns (before, after)."""
    with db.write_connection() as conn:
        db.serialize(conn, SCHEMA_LOCK)
        before = current_revision(conn)
        if before is not None and before not in known_revisions():
            raise SchemaVersionError(
                f"database {db.url} is at schema revision {before!r}, which this evolve does not know "
                f"(newest here: {head_revision()!r}); it was written by a newer evolve: upgrade evolve itself"
            )
        if before is None and not _is_empty(conn):
            raise SchemaVersionError(
                f"database {db.url} has tables but no evolve schema revision; refusing to touch it"
            )
        _upgrade_on(conn, revision)
        after = current_revision(conn)
    return before, after


def ensure_schema(db: Database) -> None:
    """Migrate an empty database; accept one at head; refuse any other version."""
    head = head_revision()
    with db.engine.connect() as conn:
        current = current_revision(conn)
        conn.rollback()
    if current == head:
        return
    if current is None:
        with db.write_connection() as conn:
            db.serialize(conn, SCHEMA_LOCK)
            # Re-checked under the lock: another process may have migrated meanwhile, and the
            # two unlocked reads above may straddle its commit (no revision yet, then its
            # tables), which made a fresh database look foreign.
            current = current_revision(conn)
            if current is None and _is_empty(conn):
                _upgrade_on(conn, "head")
                current = current_revision(conn)
        if current == head:
            return
    if current is None:
        raise SchemaVersionError(
            f"database {db.url} has tables but no evolve schema revision; "
            f"use an empty database or one created by evolve (`{UPGRADE_COMMAND}` only migrates evolve databases)"
        )
    if current in known_revisions():
        raise SchemaVersionError(
            f"database {db.url} is at schema revision {current!r} but this evolve needs {head!r}; "
            f"run `{UPGRADE_COMMAND} --db {db.url}` to migrate it"
        )
    raise SchemaVersionError(
        f"database {db.url} is at schema revision {current!r}, unknown to this evolve (newest here: {head!r}); "
        f"it was probably written by a newer evolve: upgrade evolve, then run `{UPGRADE_COMMAND} --db {db.url}`"
    )
