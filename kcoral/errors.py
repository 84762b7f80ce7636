"""Every exception `kcoral` raises to its callers, under one base, `KcoralError`.

    KcoralError
    ├── WireError            a malformed request or response (kind `parse`); also a ValueError
    ├── SerializationError   a value the protocol cannot carry (kind `serialization`); also a ValueError
    ├── RemoteError          a program that FAILED remotely, or a request the server refused
    │   ├── TransportError       unreachable server, unreadable answer (kind `transport`)
    │   ├── Cancelled            ended by `Client.abort()` (kind `cancelled`)
    │   ├── OutcomeUnknown       a router lost the node mid-request (kind `outcome_unknown`)
    │   └── UnsupportedByServer  the program needs what the server lacks (kind `unsupported`)
    ├── ToolInputError       a remote tool's arguments, refused before anything is sent; also a ValueError
    ├── NcuError             an Nsight Compute report that cannot be read; also a ValueError
    ├── TokenFileError       (kcoral.token) a token file that cannot be used; also a ValueError
    ├── BenchInputError      (kcoral.bench) a bench's local workload or candidate path; also a ValueError
    └── WorkloadNotFound     (kcoral.workloads) no workload by that path or name; also a LookupError

`kind` is an `ErrorKind` member, or the string as it came for a kind the enum does not
name (a newer or foreign server's; `http_<status>` for an answer that names none). The last three are defined beside their tools, on this base.

Outside the tree, on purpose: what runs inside a sandbox, where only the standard library
is certain (a stock server has no `kcoral`): `kcoral.archive.ArchiveError` and
`kcoral.iket.IketError` (staged into the tool runners), the runners' and the bench judge's
own errors. A tool converts them at its boundary (`ArchiveError` becomes `ToolInputError`).
"""
from __future__ import annotations

from .protocol.error_kind import ErrorKind


class KcoralError(Exception):
    """The base of every error `kcoral` raises to its callers."""


class WireError(KcoralError, ValueError):
    """A malformed request or response (the server answers it HTTP 400 `parse`)."""

    kind = ErrorKind.PARSE


class SerializationError(KcoralError, ValueError):
    """A value the protocol cannot carry (a program's result: FAILED `serialization`)."""

    kind = ErrorKind.SERIALIZATION


class RemoteError(KcoralError):
    """A program that failed remotely, or a request the server refused.

    `kind` is the protocol's error kind (`runtime`, `timeout`, `busy`, `parse`, ...);
    `status_code` is the HTTP status for non-200 answers, None for a FAILED outcome.
    """

    def __init__(self, kind: ErrorKind | str, message: str, status_code: int | None = None,
                 request_id: str | None = None) -> None:
        self.kind: ErrorKind | str = ErrorKind.of(kind)
        super().__init__(f"{self.kind}: {message}")
        self.message = message
        self.status_code = status_code
        self.request_id = request_id


class TransportError(RemoteError):
    """The server could not be reached or answered something unreadable (kind `transport`)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(ErrorKind.TRANSPORT, message, None, request_id)


class Cancelled(RemoteError):
    """The call was ended by `Client.abort()` (kind `cancelled`); the server, seeing the
    connection close, stops the program."""

    def __init__(self) -> None:
        super().__init__(ErrorKind.CANCELLED, "the call was aborted by the client")


class OutcomeUnknown(RemoteError):
    """A router lost the node running this program before its answer came back (the
    released router's 502 `server_transport`). Whether the program ran is unknown, and
    neither the router nor this client runs it again: the caller decides, and records it."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(ErrorKind.OUTCOME_UNKNOWN, message, 502, request_id)


class UnsupportedByServer(RemoteError):
    """The program needs something this server does not offer (nothing was sent)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorKind.UNSUPPORTED, message)


class ToolInputError(KcoralError, ValueError):
    """Arguments refused before anything is sent (bad send, env, timeout, ...)."""


class NcuError(KcoralError, ValueError):
    """Report output that cannot be read; the message says why."""
