"""Messages between the judge and a host process: length-prefixed JSON over a Unix
socket, with file descriptors (shared memory, on the CPU) passed alongside.

The judge never trusts what comes back: a message is data to validate, a closed socket
or a silent peer is the host's failure."""
from __future__ import annotations

import json
import socket
import struct

HEADER = struct.Struct("!I")
MAX_MESSAGE = 4 << 20  # replies carry call times and short tracebacks, nothing bulky
MAX_FDS = 64


class ChannelClosed(EOFError):
    """The peer closed its end (or died)."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, msg: dict, fds: list[int] | tuple[int, ...] = ()) -> None:
        body = json.dumps(msg).encode()
        data = HEADER.pack(len(body)) + body
        self.sock.settimeout(None)
        if fds:
            sent = socket.send_fds(self.sock, [data], list(fds))
            data = data[sent:]
        self.sock.sendall(data)

    def recv(self, timeout: float | None = None) -> tuple[dict, list[int]]:
        self.sock.settimeout(timeout)
        head, fds, _, _ = socket.recv_fds(self.sock, HEADER.size, MAX_FDS)
        if not head:
            raise ChannelClosed("the peer closed the channel")
        head += self._exact(HEADER.size - len(head))
        (size,) = HEADER.unpack(head)
        if size > MAX_MESSAGE:
            for fd in fds:
                _close(fd)
            raise ValueError(f"message of {size} bytes exceeds {MAX_MESSAGE}")
        msg = json.loads(self._exact(size))
        if not isinstance(msg, dict):
            raise ValueError("a message must be a JSON object")
        return msg, fds

    def _exact(self, n: int) -> bytes:
        chunks = []
        while n > 0:
            chunk = self.sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ChannelClosed("the peer closed the channel mid-message")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _close(fd: int) -> None:
    import os

    try:
        os.close(fd)
    except OSError:
        pass
