"""Error answers: an exception a route raises becomes the protocol's error reply.

A route raises where it cannot go on: a body over the limit (413 `request_too_large`), a
client gone while sending it (499 `cancelled`: nothing ran), anything else (500 `engine`:
an engine bug answers, it never drops the connection, and its traceback goes to the log).
"""
from __future__ import annotations

import traceback

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kcoral.protocol.error_kind import ErrorKind

from ..body import BodyStalled, RequestTooLarge
from ..reply import Reply, error_reply
from .logging import request_id, request_log

_TRACEBACK_CHARS = 2000  # the end of a traceback: where it was raised


class ErrorAnswerMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception as exc:  # every exception gets the protocol's answer
            if started:  # too late for another answer
                raise
            await _answer(exc, scope).to_response()(scope, receive, send)


def _answer(exc: Exception, scope: Scope) -> Reply:
    log = request_log(scope)
    rid = request_id(scope)
    if isinstance(exc, RequestTooLarge):
        return error_reply(413, ErrorKind.REQUEST_TOO_LARGE, str(exc), rid)
    if isinstance(exc, BodyStalled):
        return error_reply(408, ErrorKind.PARSE, str(exc), rid)
    if isinstance(exc, ClientDisconnect):  # gone while sending the body: nothing ran
        if log is not None:
            log.fields["status"] = "CANCELLED"
        return error_reply(499, ErrorKind.CANCELLED, "the client disconnected while sending the request", rid)
    if log is not None:
        log.fields["exception"] = "".join(traceback.format_exception(exc))[-_TRACEBACK_CHARS:]
    return error_reply(500, ErrorKind.ENGINE, f"{type(exc).__name__}: {exc}", rid)
