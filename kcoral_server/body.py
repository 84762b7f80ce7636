"""Reading a request body within the server's size limit, and at a pace."""
from __future__ import annotations

import asyncio

from starlette.requests import Request


class RequestTooLarge(Exception):
    """The body, or a part of it, is over `limit` bytes (declared or sent); answered 413 by
    the error middleware with `message` (by default: the request exceeds the limit)."""

    def __init__(self, limit: int, message: str | None = None) -> None:
        super().__init__(message or f"request exceeds {limit} bytes")
        self.limit = limit


class BodyStalled(Exception):
    """No piece of the body came for `seconds` (answered 408): a client trickling bodies
    would otherwise hold connections past the head timeout, and --max-connections with them."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the request body stalled: nothing came for {seconds:g} s")


async def read_body(request: Request, limit: int, stall_seconds: float | None = None) -> memoryview:
    """The whole body; stops reading as soon as it is known to be too large, or when no
    piece of it comes for `stall_seconds`.

    Gathered in one bytearray (no second copy to join chunks) and handed out as a
    memoryview, which `parse_execute_body` releases once parsed: the request then no
    longer holds its body while it waits for a worker and runs."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(limit)
    buf = bytearray()
    chunks = request.stream().__aiter__()
    while True:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for runs the read as a task of
        # its own, and an exception it ends with (the stream's end, a client gone mid-body)
        # keeps this frame, and the body in it, in a reference cycle until the collector
        # runs: a queued request held its 48 MiB or not by when that had last happened.
        try:
            async with asyncio.timeout(stall_seconds):
                chunk = await chunks.__anext__()
        except StopAsyncIteration:
            return memoryview(buf)
        except TimeoutError:
            raise BodyStalled(stall_seconds or 0.0) from None
        if len(buf) + len(chunk) > limit:
            raise RequestTooLarge(limit)
        buf += chunk
