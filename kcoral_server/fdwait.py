"""Waiting on a raw descriptor the server owns, without handing it to the event loop.

The loop's pipe transports take a descriptor's number and close it when they are done,
and uvloop's (0.23 and earlier) also leave the file object wrapping it to close the same
number again: a close that, once the number has been reused, takes another request's
socket or pidfd with it (seen on a 16-core machine under a hostile client: well-behaved
requests failed with EBADF). So the server watches its pipes and pidfds with a reader
callback only, reads them with os.read, and closes each once, itself."""
from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator


async def readable(fd: int, timeout: float | None) -> None:
    """Until `fd` is readable (or at end of file), or `timeout` seconds (TimeoutError)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await asyncio.wait_for(fut, timeout)
    finally:
        loop.remove_reader(fd)


async def lines(fd: int) -> AsyncIterator[bytes]:
    """The lines a non-blocking pipe carries, until its end of file; the caller closes it."""
    buf = b""
    while True:
        await readable(fd, None)
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            continue
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line
    if buf:
        yield buf
