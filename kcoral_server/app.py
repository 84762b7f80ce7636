"""HTTP routes (Starlette): /health and /execute, with auth and the request log line."""
from __future__ import annotations

import time
import traceback
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kcoral.extensions import HEADER, parse_header
from kcoral.protocol.error_kind import ErrorKind

from .auth import BearerAuth
from .cancel import watch_disconnect
from .engine import Engine, Reply, RequestLog, error_reply
from .joinconfig import RouterJoin
from .reqlog import log_event, log_request


class _TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge()
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise _TooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _request_id(request: Request) -> str:
    """The client's `X-Request-ID` when it is one canonical UUID (as released servers adopt
    it), else a new one; anything else could smuggle arbitrary text into logs."""
    values = request.headers.getlist("x-request-id")
    if len(values) == 1:
        try:
            if str(uuid.UUID(values[0])) == values[0]:
                return values[0]
        except ValueError:
            pass
    return str(uuid.uuid4())


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "-"


def _response(reply: Reply) -> Response:
    return Response(reply.body, status_code=reply.status_code, media_type=reply.content_type, headers=reply.headers)


def build_app(engine: Engine, auth: BearerAuth, join: "RouterJoin | None" = None) -> Starlette:
    """The server's routes; with `join`, it also serves a router's slots once started."""
    async def health(request: Request) -> Response:
        full = auth.allows(request.headers.get("authorization"))
        return JSONResponse(engine.health(full))

    async def execute(request: Request) -> Response:
        t0 = time.monotonic()
        rid = _request_id(request)
        log = RequestLog(rid, _client(request))
        try:
            if not auth.allows(request.headers.get("authorization")):
                reply = error_reply(401, ErrorKind.UNAUTHORIZED, "missing or wrong bearer token", rid)
            else:
                try:
                    body = await _read_body(request, engine.config.max_request_bytes)
                except _TooLarge:
                    reply = error_reply(413, ErrorKind.REQUEST_TOO_LARGE,
                                        f"request exceeds {engine.config.max_request_bytes} bytes", rid)
                except ClientDisconnect:  # gone while sending the body: nothing ran
                    log.fields["status"] = "CANCELLED"
                    reply = error_reply(499, ErrorKind.CANCELLED, "the client disconnected while sending the request", rid)
                else:
                    async with watch_disconnect(request.receive) as gone:
                        reply = await engine.execute(body, request.headers.get("content-type"),
                                                     request.headers.get("idempotency-key"), log,
                                                     parse_header(request.headers.get(HEADER)), gone)
        except Exception as exc:  # noqa: BLE001 - an engine bug answers 500, never a dropped connection
            log.fields["exception"] = traceback.format_exc()[-2000:]
            reply = error_reply(500, ErrorKind.ENGINE, f"{type(exc).__name__}: {exc}", rid)
        reply.headers.setdefault("X-Request-ID", rid)
        reply.headers.setdefault("X-Instance-ID", engine.instance_id)
        fields: dict[str, Any] = dict(log.fields)
        fields["status"] = fields.get("status") or ("ERROR" if reply.status_code != 200 else "OK")
        log_request(request_id=rid, client=log.client, path="/execute", http=reply.status_code,
                    total_ms=round((time.monotonic() - t0) * 1e3, 3), **fields)
        return _response(reply)

    async def submit_job(request: Request) -> Response:
        rid = _request_id(request)
        log = RequestLog(rid, _client(request))
        t0 = time.monotonic()
        if not auth.allows(request.headers.get("authorization")):
            reply = error_reply(401, ErrorKind.UNAUTHORIZED, "missing or wrong bearer token", rid)
        else:
            try:
                body = await _read_body(request, engine.config.max_request_bytes)
            except _TooLarge:
                reply = error_reply(413, ErrorKind.REQUEST_TOO_LARGE, f"request exceeds {engine.config.max_request_bytes} bytes", rid)
            else:
                try:
                    reply = await engine.submit_job(body, request.headers.get("content-type"), log,
                                                    parse_header(request.headers.get(HEADER)))
                except Exception as exc:  # noqa: BLE001
                    log.fields["exception"] = traceback.format_exc()[-2000:]
                    reply = error_reply(500, ErrorKind.ENGINE, f"{type(exc).__name__}: {exc}", rid)
        reply.headers.setdefault("X-Request-ID", rid)
        reply.headers.setdefault("X-Instance-ID", engine.instance_id)
        fields: dict[str, Any] = dict(log.fields)
        fields["status"] = fields.get("status") or ("ERROR" if reply.status_code >= 300 else "OK")
        log_request(request_id=rid, client=log.client, path="/jobs", http=reply.status_code,
                    total_ms=round((time.monotonic() - t0) * 1e3, 3), **fields)
        return _response(reply)

    async def get_job(request: Request) -> Response:
        if not auth.allows(request.headers.get("authorization")):
            return _response(error_reply(401, ErrorKind.UNAUTHORIZED, "missing or wrong bearer token", "-"))
        reply = engine.job_reply(request.path_params["job_id"])
        reply.headers.setdefault("X-Instance-ID", engine.instance_id)
        return _response(reply)

    async def not_found(request: Request) -> Response:
        if not auth.allows(request.headers.get("authorization")):
            return _response(error_reply(401, ErrorKind.UNAUTHORIZED, "missing or wrong bearer token", "-"))
        return _response(error_reply(404, ErrorKind.NOT_FOUND, f"no route {request.method} {request.url.path}", "-"))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await engine.start()
        node = None
        try:
            if join is not None:
                from .gateway.node import RouterNode   # grpc only where a router is joined
                node = RouterNode(_app, router_url=join.router_url, node_id=join.node_id, token=join.token,
                                  slots=len(engine.specs), status=engine.node_status)
                _app.state.router_node = node
                await node.start()
            yield
        finally:
            if node is not None:
                await node.close()
            await engine.close()
            log_event("server_stopped", instance_id=engine.instance_id)

    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/execute", execute, methods=["POST"]),
            Route("/jobs", submit_job, methods=["POST"]),
            Route("/jobs/{job_id}", get_job, methods=["GET"]),
            Route("/{path:path}", not_found, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]),
        ],
        lifespan=lifespan,
    )
    return app
