"""In-process tests: the client against a scripted transport, the server's app through
Starlette's TestClient. Nothing here starts a process or opens a socket."""
from __future__ import annotations

import time

import pytest


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The retry policy's waits, recorded instead of slept (tenacity sleeps through time.sleep)."""
    waits: list[float] = []
    monkeypatch.setattr(time, "sleep", waits.append)
    return waits
