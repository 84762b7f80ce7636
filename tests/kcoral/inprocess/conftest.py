"""In-process tests: the client against a scripted transport, the server's app through
Starlette's TestClient. Nothing here starts a process or opens a socket."""
from __future__ import annotations

import functools

import pytest
import tenacity


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The client's retry waits, recorded instead of slept (only the client's: the
    TestClient's event-loop thread sleeps too)."""
    import kcoral.client

    waits: list[float] = []
    monkeypatch.setattr(kcoral.client, "Retrying", functools.partial(tenacity.Retrying, sleep=waits.append))
    return waits
