"""Request logging: one line per request of a logged route, and the ids that name it.

A logged request gets a request id (the client's `X-Request-ID` when it is one canonical
UUID, else a new one) and a `RequestLog` that the route and the engine add fields to. Its
response carries `X-Request-ID` and `X-Instance-ID` unless it names them already (a replay
keeps those of the answer it replays), so a client's report leads to this line on this
server. The line is written as the response starts, so `total_ms` leaves out sending it.
"""
from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..reqlog import RequestLog, log_request

_STATE_KEY = "request_log"
_UNLOGGED_ID = "-"  # what an error body says where no request id was given out


def request_log(scope: Scope) -> RequestLog | None:
    """The log of a request on a logged route; None elsewhere."""
    log: RequestLog | None = scope.get("state", {}).get(_STATE_KEY)
    return log


def logged(request: Request) -> RequestLog:
    """The log of a request to a route behind `RequestLogMiddleware`."""
    log = request_log(request.scope)
    if log is None:
        raise RuntimeError(f"{request.url.path} is not behind RequestLogMiddleware")
    return log


def request_id(scope: Scope) -> str:
    log = request_log(scope)
    return log.request_id if log is not None else _UNLOGGED_ID


def _adopted_or_new_id(headers: Headers) -> str:
    """The client's `X-Request-ID` when it is one canonical UUID (as released servers adopt
    it), else a new one; anything else could smuggle arbitrary text into logs."""
    values = headers.getlist("x-request-id")
    if len(values) == 1:
        try:
            if str(uuid.UUID(values[0])) == values[0]:
                return values[0]
        except ValueError:
            pass
    return str(uuid.uuid4())


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


class RequestLogMiddleware:
    """Logs each request to the route it wraps under `path`."""

    def __init__(self, app: ASGIApp, *, path: str, instance_id: str) -> None:
        self.app = app
        self.path = path
        self.instance_id = instance_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.monotonic()
        log = RequestLog(_adopted_or_new_id(Headers(scope=scope)), _client(scope))
        scope.setdefault("state", {})[_STATE_KEY] = log

        async def send_logged(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Request-ID", log.request_id)
                headers.setdefault("X-Instance-ID", self.instance_id)
                self._write(log, message["status"], t0)
            await send(message)

        await self.app(scope, receive, send_logged)

    def _write(self, log: RequestLog, http: int, t0: float) -> None:
        fields: dict[str, Any] = dict(log.fields)
        fields["status"] = fields.get("status") or ("ERROR" if http >= 300 else "OK")
        log_request(request_id=log.request_id, client=log.client, path=self.path, http=http,
                    total_ms=round((time.monotonic() - t0) * 1e3, 3), **fields)
