"""Reading a request body within the server's size limit."""
from __future__ import annotations

from starlette.requests import Request


class RequestTooLarge(Exception):
    """The body, or a part of it, is over `limit` bytes (declared or sent); answered 413 by
    the error middleware with `message` (by default: the request exceeds the limit)."""

    def __init__(self, limit: int, message: str | None = None) -> None:
        super().__init__(message or f"request exceeds {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> memoryview:
    """The whole body; stops reading as soon as it is known to be too large.

    Gathered in one bytearray (no second copy to join chunks) and handed out as a
    memoryview, which `parse_execute_body` releases once parsed: the request then no
    longer holds its body while it waits for a worker and runs."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(limit)
    buf = bytearray()
    async for chunk in request.stream():
        if len(buf) + len(chunk) > limit:
            raise RequestTooLarge(limit)
        buf += chunk
    return memoryview(buf)
