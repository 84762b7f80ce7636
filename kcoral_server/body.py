"""Reading a request body within the server's size limit."""
from __future__ import annotations

from starlette.requests import Request


class RequestTooLarge(Exception):
    """The body is over `limit` bytes (declared or sent); answered 413 by the error middleware."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"request exceeds {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body; stops reading as soon as it is known to be too large."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(limit)
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise RequestTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
