"""Alembic environment for evolve's database.

evolve configures Alembic in code (`evolve.db.migrate`) and hands over an open
connection in `config.attributes["connection"]`; when that connection is already inside
a transaction (evolve opens it with the write lock held), the whole upgrade runs in it
and is committed by the caller. Without one (plain `alembic` use), the URL from the
config is used.
"""
from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from evolve.db.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,  # SQLite can't ALTER most things: copy-and-move tables
        compare_type=True,
    )


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no sqlalchemy.url in the Alembic config and no connection handed over")
    engine = create_engine(url)
    with engine.connect() as conn:
        _configure(conn)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
