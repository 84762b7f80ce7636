"""HTTP routes (Starlette): /health, /execute and /jobs, each with the middleware it needs.

The routes hold only their own logic; the bearer token, the request log line and the
protocol's error answers are middleware (kcoral_server/middleware), put on each route
rather than on the app: /health is open, only /execute and POST /jobs are logged, and
what Starlette answers before any route (405 to an unknown method) stays as it was.
"""
from __future__ import annotations

from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kcoral.extensions import HEADER, parse_header
from kcoral.protocol.error_kind import ErrorKind

from .auth import BearerAuth
from .body import read_body
from .cancel import watch_disconnect
from .engine import Engine
from .joinconfig import RouterJoin
from .middleware.auth import AUTHENTICATED, BearerAuthMiddleware
from .middleware.errors import ErrorAnswerMiddleware
from .middleware.logging import RequestLogMiddleware, logged
from .reply import error_reply
from .reqlog import log_event

Endpoint = Callable[[Request], Awaitable[Response]]


def build_app(engine: Engine, auth: BearerAuth, join: RouterJoin | None = None) -> Starlette:
    """The server's routes; with `join`, it also serves a router's slots once started."""
    async def body_of(request: Request) -> memoryview:
        # A memoryview, which the engine only measures and hands to parse_execute_body:
        # released there once parsed, so a queued or running request no longer holds its
        # body (a bytes object would stay alive in these frames until the answer).
        return await read_body(request, engine.config.max_request_bytes, engine.config.header_timeout_seconds)

    async def health(request: Request) -> Response:
        return JSONResponse(engine.health(AUTHENTICATED in request.auth.scopes))

    async def execute(request: Request) -> Response:
        body = await body_of(request)
        async with watch_disconnect(request.receive) as gone:
            reply = await engine.execute(body, request.headers.get("content-type"),
                                         request.headers.get("idempotency-key"), logged(request),
                                         parse_header(request.headers.get(HEADER)), gone)
        return reply.to_response()

    async def submit_job(request: Request) -> Response:
        body = await body_of(request)
        reply = await engine.submit_job(body, request.headers.get("content-type"), logged(request),
                                        parse_header(request.headers.get(HEADER)))
        return reply.to_response()

    async def get_job(request: Request) -> Response:
        reply = engine.job_reply(request.path_params["job_id"])
        reply.headers.setdefault("X-Instance-ID", engine.instance_id)  # jobs live in one instance
        return reply.to_response()

    async def not_found(request: Request) -> Response:
        return error_reply(404, ErrorKind.NOT_FOUND, f"no route {request.method} {request.url.path}", "-").to_response()

    authorized = Middleware(BearerAuthMiddleware, auth=auth)

    def logged_post(path: str, endpoint: Endpoint) -> Route:
        """A POST route whose requests are logged, get error answers and need the token."""
        return Route(path, endpoint, methods=["POST"], middleware=[
            Middleware(RequestLogMiddleware, path=path, instance_id=engine.instance_id),
            Middleware(ErrorAnswerMiddleware),
            authorized,
        ])

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"],
                  middleware=[Middleware(BearerAuthMiddleware, auth=auth, required=False)]),
            logged_post("/execute", execute),
            logged_post("/jobs", submit_job),
            Route("/jobs/{job_id}", get_job, methods=["GET"], middleware=[authorized]),
            Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"],
                  middleware=[authorized]),
        ],
        lifespan=_lifespan(engine, join),
    )


def _lifespan(engine: Engine, join: RouterJoin | None) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """Start the engine (and the router node, with `join`) before serving; close both after."""
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        node = None
        try:
            if join is not None:
                from .gateway.node import RouterNode   # grpc only where a router is joined
                node = RouterNode(app, router_url=join.router_url, node_id=join.node_id, token=join.token,
                                  slots=len(engine.specs), status=engine.node_status)
                app.state.router_node = node
                await node.start()
            yield
        finally:
            if node is not None:
                await node.close()
            await engine.close()
            log_event("server_stopped", instance_id=engine.instance_id)

    return lifespan
