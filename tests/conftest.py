"""Shared fixtures: a real CPU server process on loopback and a client for it."""
from __future__ import annotations

import pytest

from tests.serverproc import ServerProcess


@pytest.fixture(scope="session")
def cpu_server():
    """One `python -m server --cpu-workers 2` for the whole session (read-only use)."""
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
