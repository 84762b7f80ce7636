"""read_body's buffer is the request's body: once the parser released its view, nothing
of read_body may keep it alive while the request waits for a worker."""
from __future__ import annotations

import asyncio
import gc
import sys

from starlette.requests import Request

from kcoral_server.body import read_body


def _request(chunks: list[bytes]) -> Request:
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    return Request({"type": "http", "method": "POST", "headers": []}, receive)


def test_a_read_body_holds_nothing_once_its_view_is_released() -> None:
    # The end of the stream comes as StopAsyncIteration through asyncio.wait_for: its
    # traceback kept read_body's frame, and the frame its 48 MiB buffer, until the cyclic
    # collector ran, so a queued request held its body or not by chance. With the
    # collector off that is certain, before the fix.
    gc.collect()
    gc.disable()
    try:
        view = asyncio.run(read_body(_request([b"x" * 4096] * 8), 1 << 20, stall_seconds=5))
        buf = view.obj
        assert len(buf) == 8 * 4096
        view.release()
        del view
        assert sys.getrefcount(buf) == 2, gc.get_referrers(buf)   # `buf` and getrefcount's argument
    finally:
        gc.enable()
