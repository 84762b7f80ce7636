"""Bearer-token authentication for the routes it wraps.

A required route answers 401 `unauthorized` without the server's token, before anything
of the request is read. An open route (/health) is served either way and learns from
`request.auth` (Starlette's convention) whether the token came, to tell its holders more.
"""
from __future__ import annotations

from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from kcoral.protocol.error_kind import ErrorKind

from ..auth import BearerAuth
from ..reply import error_reply
from .logging import request_id

AUTHENTICATED = "authenticated"  # the scope `request.auth` holds when the token came


class BearerAuthMiddleware:
    def __init__(self, app: ASGIApp, *, auth: BearerAuth, required: bool = True) -> None:
        self.app = app
        self.auth = auth
        self.required = required

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed = self.auth.allows(Headers(scope=scope).get("authorization"))
        if not allowed and self.required:
            reply = error_reply(401, ErrorKind.UNAUTHORIZED, "missing or wrong bearer token", request_id(scope))
            await reply.to_response()(scope, receive, send)
            return
        scope["auth"] = AuthCredentials([AUTHENTICATED] if allowed else [])
        await self.app(scope, receive, send)
