"""Length-prefixed messages between the server and its workers.

A frame is a 4-byte big-endian header length, a JSON header, then the binary attachments
whose lengths the header lists under "bin". JSON (never pickle) so that nothing a worker
sends can execute code in the parent, which holds the holdout salt.

Program code can reach its worker's end of the channel and write any frame, so the server
bounds what it reads: a header is at most MAX_WORKER_HEADER bytes, except a `return`
frame's (a returned value's JSON node), whose length word carries RETURN_FLAG and whose
header counts, with its attachments, against the response's remaining budget. Large
headers are parsed in a thread, so one cannot stall the event loop for seconds.
"""
from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # workers (which only use SyncChannel) need not load asyncio
    import asyncio

_LEN = struct.Struct(">I")
RETURN_FLAG = 1 << 31            # set in the length word of a `return` frame
_MAX_LEN = RETURN_FLAG - 1       # the longest header a length word can state
MAX_HEADER = 256 << 20           # what a worker reads from the server (trusted: a job, 100k seeds)
MAX_WORKER_HEADER = 1 << 20      # what the server reads from a worker, but for `return` frames
# A returned value's JSON (bytes and arrays travel as attachments): parsed, JSON takes up to
# ~25 times its size in memory, in the server's process, outside any request's cgroup.
MAX_RETURN_HEADER = 64 << 20
THREAD_PARSE_BYTES = 64 << 10    # headers from this size on are parsed off the event loop
FDS_PER_MESSAGE = 200  # blob descriptors per SCM_RIGHTS message (the kernel takes at most 253)


def encode(msg: dict[str, Any], attachments: Sequence[bytes | memoryview] = ()) -> list[bytes | memoryview]:
    header = dict(msg)
    header["bin"] = [len(a) for a in attachments]
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    if len(raw) > _MAX_LEN:
        raise ValueError(f"a channel message of {len(raw)} bytes exceeds the {_MAX_LEN}-byte frame limit")
    word = len(raw) | (RETURN_FLAG if header.get("t") == "return" else 0)
    return [_LEN.pack(word) + raw, *attachments]


class SyncChannel:
    """Worker side: a blocking socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, msg: dict[str, Any], attachments: Sequence[bytes | memoryview] = ()) -> None:
        frames = encode(msg, attachments)
        if len(frames) == 1:
            self.sock.sendall(frames[0])
        else:
            for f in frames:
                self.sock.sendall(f)

    def _exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if k == 0:
                raise EOFError("channel closed")
            got += k
        return buf

    def recv(self) -> tuple[dict[str, Any], list[bytearray]]:
        (word,) = _LEN.unpack(self._exact(4))
        n = word & _MAX_LEN
        if n > MAX_HEADER:
            raise ValueError("oversized channel header")
        header = json.loads(self._exact(n))
        return header, [self._exact(k) for k in header.get("bin", [])]


class FrameTooLarge(Exception):
    """A worker's frame would exceed the budget the reader gave (a response's room left),
    or a returned value's JSON MAX_RETURN_HEADER; the message says which."""


@dataclass
class Frame:
    """One message from a worker."""

    header: dict[str, Any]
    bins: list[bytes]
    counted: int  # bytes counted against the budget: the attachments, and a `return` header


def _parse_header(raw: bytes) -> dict[str, Any]:
    try:
        header = json.loads(raw)
    except RecursionError:  # nesting deep enough to exhaust the C stack guard
        raise ValueError("channel header from worker nests too deeply") from None
    if not isinstance(header, dict):
        raise ValueError("malformed channel header from worker")
    return header


def _bin_lengths(header: dict[str, Any]) -> list[int]:
    bins = header.get("bin", [])
    if not isinstance(bins, list) or not all(type(k) is int and k >= 0 for k in bins):
        raise ValueError("malformed attachment lengths from worker")
    return bins


def _check_header_length(n: int, is_return: bool, budget: int | None) -> None:
    """Before reading a header: ValueError for one no frame of its kind may have,
    FrameTooLarge for a `return` header over the budget."""
    if not is_return:
        if n > MAX_WORKER_HEADER:
            raise ValueError(f"oversized channel header from worker ({n} bytes)")
    elif budget is None:
        raise ValueError("unexpected return frame from worker")
    elif n > MAX_RETURN_HEADER:
        raise FrameTooLarge(f"a returned value's JSON is {n} bytes, over {MAX_RETURN_HEADER}: return large "
                            "data as bytes or an array (an attachment)")
    elif n > budget:
        raise FrameTooLarge()


class AsyncChannel:
    """Server side: asyncio streams over the parent's end of the socketpair."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> "AsyncChannel":
        import asyncio  # here: workers (which only use SyncChannel) need not load it

        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer)

    async def send(self, msg: dict[str, Any], attachments: Sequence[bytes | memoryview] = ()) -> None:
        for f in encode(msg, attachments):
            self.writer.write(f)
        await self.writer.drain()

    async def recv(self) -> tuple[dict[str, Any], list[bytes]]:
        """One frame that is not a `return` (a worker's `ready`)."""
        frame = await self.recv_frame(None)
        return frame.header, frame.bins

    async def recv_frame(self, budget: int | None) -> Frame:
        """One frame. `budget` bounds what a frame counts (`Frame.counted`); over it,
        FrameTooLarge is raised before the attachments (or a `return` frame's oversized
        header) are read. None: no `return` frame is expected, nor any budget kept."""
        (word,) = _LEN.unpack(await self.reader.readexactly(4))
        n, flagged = word & _MAX_LEN, bool(word & RETURN_FLAG)
        _check_header_length(n, flagged, budget)
        header = await self._header(await self.reader.readexactly(n))
        is_return = header.get("t") == "return"
        if flagged and not is_return:
            raise ValueError("a frame flagged as a return is not one")
        bins = _bin_lengths(header)
        if bins and not is_return:  # only a return carries attachments: these would be read for nothing
            raise ValueError(f"attachments on a {header.get('t')!r} frame from worker")
        counted = sum(bins) + (n if is_return else 0)
        if budget is not None and counted > budget:
            raise FrameTooLarge()
        return Frame(header, [await self.reader.readexactly(k) for k in bins], counted)

    @staticmethod
    async def _header(raw: bytes) -> dict[str, Any]:
        if len(raw) < THREAD_PARSE_BYTES:
            return _parse_header(raw)
        import asyncio

        return await asyncio.to_thread(_parse_header, raw)

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a transport the peer already broke must not raise
            pass
