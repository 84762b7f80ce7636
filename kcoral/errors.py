"""Exceptions the client raises."""
from __future__ import annotations


class RemoteError(Exception):
    """A program that failed remotely, or a request the server refused.

    `kind` is the protocol's error kind (`runtime`, `timeout`, `busy`, `parse`, ...);
    `status_code` is the HTTP status for non-200 answers, None for a FAILED outcome.
    """

    def __init__(self, kind: str, message: str, status_code: int | None = None, request_id: str | None = None) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.status_code = status_code
        self.request_id = request_id


class TransportError(RemoteError):
    """The server could not be reached or answered something unreadable (kind `transport`)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__("transport", message, None, request_id)


class Cancelled(RemoteError):
    """The call was ended by `Client.abort()` (kind `cancelled`); the server, seeing the
    connection close, stops the program."""

    def __init__(self) -> None:
        super().__init__("cancelled", "the call was aborted by the client")


class OutcomeUnknown(RemoteError):
    """A router lost the node running this program before its answer came back (the
    released router's 502 `server_transport`). Whether the program ran is unknown, and
    neither the router nor this client runs it again: the caller decides, and records it."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__("outcome_unknown", message, 502, request_id)
