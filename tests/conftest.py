"""Shared fixtures: a real CPU server process on loopback and a client for it."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from tests.serverproc import ServerProcess


@pytest.fixture(scope="session")
def cpu_server():
    """One `python -m kcoral_server --cpu-workers 2` for the whole session (read-only use)."""
    with ServerProcess(["--cpu-workers", "2"]) as srv:
        yield srv


@pytest.fixture()
def client(cpu_server):
    from kcoral import Client

    with Client(cpu_server.url) as c:
        yield c


@pytest.fixture(scope="session")
def postgres():
    """One throwaway PostgreSQL server for the whole session (tests/pgserver.py); tests
    that need it are skipped, saying why, only where PostgreSQL is not installed."""
    from tests.pgserver import PostgresUnavailable, TemporaryPostgres

    try:
        server = TemporaryPostgres()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL unavailable: {exc}")
    with server:
        yield server


BACKENDS = ("sqlite", "postgresql")
_databases = itertools.count(1)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Every population test runs on both: the embedded SQLite file and a shared PostgreSQL."""
    return str(request.param)


@pytest.fixture(scope="session")
def pg_template(postgres: Any) -> str:
    """A database migrated once per session; each test gets a copy (CREATE DATABASE ...
    TEMPLATE is a file copy, several times faster than running the migrations again)."""
    from evolve.db import open_database

    url = postgres.create_database("evolve_template")
    open_database(url).close()
    return "evolve_template"


@pytest.fixture
def empty_db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database with nothing in it (not even evolve's schema)."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'evolve.db'}"
    postgres = request.getfixturevalue("postgres")
    return str(postgres.create_database(f"empty_{next(_databases)}"))


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A database for the population: a SQLite file (migrated when first opened) or a
    PostgreSQL database already at the current schema."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'evolve.db'}"
    postgres = request.getfixturevalue("postgres")
    template = request.getfixturevalue("pg_template")
    return str(postgres.create_database(f"t_{next(_databases)}", template=template))
