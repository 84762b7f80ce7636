"""Ending a client's in-flight HTTP calls from another thread.

Closing a socket that another thread is blocked reading does not wake that thread on
Linux, and the server would not see the disconnect until the read ended. `shutdown()`
does both at once: the blocked read fails and the server gets the FIN (which makes our
server cancel the program). httpx offers no hook for its sockets, so the client's
connection pool is given this network backend, which remembers every stream it opened.
"""
from __future__ import annotations

import socket
import threading
import weakref
from typing import Any, Iterable

import httpcore
import httpx


class TrackingBackend(httpcore.NetworkBackend):
    """httpcore's default synchronous backend, remembering the streams it opened."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._streams: "weakref.WeakSet[httpcore.NetworkStream]" = weakref.WeakSet()
        self._lock = threading.Lock()

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        with self._lock:
            self._streams.add(stream)
        return stream

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        stream = self._inner.connect_unix_socket(path, timeout, socket_options)
        with self._lock:
            self._streams.add(stream)
        return stream

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)

    def shutdown_all(self) -> None:
        """Shut every open stream down (thread-safe; blocked reads fail at once)."""
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            sock = stream.get_extra_info("socket")
            if isinstance(sock, socket.socket):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed


def tracking_transport() -> tuple[httpx.HTTPTransport, TrackingBackend | None]:
    """An httpx transport whose sockets `TrackingBackend.shutdown_all` can end; None as the
    backend where this httpx keeps its pool elsewhere (then aborting only closes the client)."""
    transport = httpx.HTTPTransport()
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore.ConnectionPool) or not hasattr(pool, "_network_backend"):
        return transport, None
    backend = TrackingBackend()
    pool._network_backend = backend
    return transport, backend
