"""Length-prefixed messages between the server and its workers.

A frame is a 4-byte big-endian header length, a JSON header, then the binary attachments
whose lengths the header lists under "bin". JSON (never pickle) so that nothing a worker
sends can execute code in the parent, which holds the holdout salt.
"""
from __future__ import annotations

import json
import socket
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # workers (which only use SyncChannel) need not load asyncio
    import asyncio

_LEN = struct.Struct(">I")
MAX_HEADER = 256 << 20
FDS_PER_MESSAGE = 200  # blob descriptors per SCM_RIGHTS message (the kernel takes at most 253)


def encode(msg: dict[str, Any], attachments: Sequence[bytes | memoryview] = ()) -> list[bytes | memoryview]:
    header = dict(msg)
    header["bin"] = [len(a) for a in attachments]
    raw = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return [_LEN.pack(len(raw)) + raw, *attachments]


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
        (n,) = _LEN.unpack(self._exact(4))
        if n > MAX_HEADER:
            raise ValueError("oversized channel header")
        header = json.loads(self._exact(n))
        return header, [self._exact(k) for k in header.get("bin", [])]


class FrameTooLarge(Exception):
    """A worker announced attachments larger than the reader accepts."""


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

    async def recv(self, max_bin_bytes: int | None = None) -> tuple[dict[str, Any], list[bytes]]:
        """One frame; FrameTooLarge (before reading any attachment) when the attachments
        the header announces exceed `max_bin_bytes`."""
        (n,) = _LEN.unpack(await self.reader.readexactly(4))
        if n > MAX_HEADER:
            raise ValueError("oversized channel header from worker")
        header = json.loads(await self.reader.readexactly(n))
        if not isinstance(header, dict):
            raise ValueError("malformed channel header from worker")
        bins = [int(k) for k in header.get("bin", [])]
        if any(k < 0 for k in bins):
            raise ValueError("negative attachment length from worker")
        if max_bin_bytes is not None and sum(bins) > max_bin_bytes:
            raise FrameTooLarge()
        return header, [await self.reader.readexactly(k) for k in bins]

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a transport the peer already broke must not raise
            pass
