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
