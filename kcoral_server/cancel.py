"""Stopping a program whose HTTP client went away.

A client killed mid-program used to leave its worker busy (and its GPU leased) until the
program's own time limit. app.py sets a request's `Disconnect` when the ASGI channel says
`http.disconnect`; the engine runs each waiting phase through `unless_abandoned`, which
cancels that phase (a running program is killed by the path a timeout takes) unless the
phase finished first or another request still wants the answer.
"""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from starlette.types import Receive

T = TypeVar("T")


class Cancelled(Exception):
    """The client disconnected and nobody else waits for the answer: the work was stopped."""


class Disconnect:
    """Set once, when the client of one request disconnects."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()


@asynccontextmanager
async def watch_disconnect(receive: Receive) -> AsyncIterator[Disconnect]:
    """Watch the ASGI channel (after the body was read: only `http.disconnect` can still
    come) while the block runs."""
    gone = Disconnect()

    async def watch() -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                return

    task = asyncio.get_running_loop().create_task(watch())
    try:
        yield gone
    finally:
        task.cancel()


async def unless_abandoned(work: Awaitable[T], gone: Disconnect | None,
                           still_wanted: Callable[[], Awaitable[bool]] | None = None) -> T:
    """Await `work`; if the client goes first and `still_wanted` (if given) says no, cancel
    it, let its own clean-up run, and raise `Cancelled`. Finished work always wins: a
    result that is ready is returned even when the client is already gone."""
    task = asyncio.ensure_future(work)
    if gone is None:
        return await task
    try:
        watcher = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not task.done() and still_wanted is not None:
            asking = asyncio.ensure_future(still_wanted())
            try:
                await asyncio.wait({task, asking}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                asking.cancel()
            if not task.done() and asking.done() and not asking.cancelled() and asking.result():
                await asyncio.wait({task})  # another request waits for this answer: finish for it
    except BaseException:  # this request itself was cancelled (shutdown): take the work with it
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        await asyncio.wait({task})
        if task.cancelled():
            raise Cancelled()
    return task.result()
