"""read_body's buffer is the request's body: once the parser has released its view, or
the client has gone mid-body, nothing of read_body may keep it alive."""
from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections.abc import Iterator

import pytest
from starlette.requests import ClientDisconnect, Request

from kcoral_server.body import read_body

PIECE, PIECES = 64 << 10, 64   # a 4 MiB body


def _request(pieces: int, then_disconnect: bool = False) -> Request:
    messages: list[dict] = [{"type": "http.request", "body": b"x" * PIECE, "more_body": True} for _ in range(pieces)]
    messages.append({"type": "http.disconnect"} if then_disconnect else {"type": "http.request", "body": b""})

    async def receive() -> dict:
        return messages.pop(0)

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


@pytest.fixture
def collector_off() -> Iterator[None]:
    """Allocations traced, and the cyclic collector off: on Python 3.11 asyncio.wait_for
    kept read_body's frame, and its buffer, in a cycle that only the collector frees, so
    whether a queued request held its body was chance."""
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()
        gc.enable()


def test_a_read_body_holds_nothing_once_its_view_is_released(collector_off: None) -> None:
    before = tracemalloc.get_traced_memory()[0]
    view = asyncio.run(read_body(_request(PIECES), 1 << 30, stall_seconds=5))
    assert len(view) == PIECE * PIECES
    view.release()
    del view
    assert tracemalloc.get_traced_memory()[0] - before < PIECE * PIECES // 4


def test_a_body_cut_short_by_its_client_is_not_kept(collector_off: None) -> None:
    async def client_gone() -> bool:
        # Caught here, as the server's error middleware does: an exception leaving
        # asyncio.run would keep its frames in a cycle of the test's own making.
        try:
            await read_body(_request(PIECES, then_disconnect=True), 1 << 30, stall_seconds=5)
        except ClientDisconnect:
            return True
        return False

    before = tracemalloc.get_traced_memory()[0]
    assert asyncio.run(client_gone())
    assert tracemalloc.get_traced_memory()[0] - before < PIECE * PIECES // 4
