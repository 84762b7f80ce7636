"""The server's middleware in-process, on a small app of its own (no engine, no workers):
what a route raises, what a token-less request gets, and the ids a logged response carries."""
from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kcoral_server.auth import BearerAuth
from kcoral_server.body import RequestTooLarge
from kcoral_server.middleware import logging as request_logging
from kcoral_server.middleware.auth import AUTHENTICATED, BearerAuthMiddleware
from kcoral_server.middleware.errors import ErrorAnswerMiddleware
from kcoral_server.middleware.logging import RequestLogMiddleware, logged

TOKEN = "middleware-token-0123456789"
INSTANCE = "instance-under-test"


async def _raises(request: Request) -> Response:
    logged(request).fields["worker_id"] = "w0"
    kind = request.query_params["kind"]
    if kind == "large":
        raise RequestTooLarge(1024)
    if kind == "gone":
        raise ClientDisconnect()
    if kind == "bug":
        raise KeyError("lost")
    headers = {"X-Request-ID": "replayed-id"} if kind == "replay" else {}
    return JSONResponse({"ok": True}, headers=headers)


async def _open(request: Request) -> Response:
    return JSONResponse({"full": AUTHENTICATED in request.auth.scopes})


def _app() -> Starlette:
    auth = BearerAuth(TOKEN)
    return Starlette(routes=[
        Route("/run", _raises, methods=["POST"], middleware=[
            Middleware(RequestLogMiddleware, path="/run", instance_id=INSTANCE),
            Middleware(ErrorAnswerMiddleware),
            Middleware(BearerAuthMiddleware, auth=auth)]),
        Route("/open", _open, middleware=[Middleware(BearerAuthMiddleware, auth=auth, required=False)]),
        Route("/closed", _open, middleware=[Middleware(BearerAuthMiddleware, auth=auth)]),
    ])


@pytest.fixture()
def lines(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    written: list[dict[str, Any]] = []
    monkeypatch.setattr(request_logging, "log_request", lambda **fields: written.append(fields))
    return written


def _request(method: str, path: str, token: str | None = TOKEN, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers.update(kwargs.pop("headers", {}))

    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app()), base_url="http://test") as c:
            return await c.request(method, path, headers=headers, **kwargs)

    return asyncio.run(go())


@pytest.mark.parametrize("kind, code, error_kind, status", [
    ("large", 413, "request_too_large", "ERROR"),
    ("gone", 499, "cancelled", "CANCELLED"),
    ("bug", 500, "engine", "ERROR"),
])
def test_what_a_route_raises_is_answered_and_logged(lines, kind, code, error_kind, status) -> None:
    r = _request("POST", f"/run?kind={kind}")
    body = r.json()
    assert r.status_code == code and body["status"] == "ERROR" and body["error"]["kind"] == error_kind
    assert body["request_id"] == r.headers["X-Request-ID"] and r.headers["X-Instance-ID"] == INSTANCE
    [line] = lines
    assert line["http"] == code and line["status"] == status and line["path"] == "/run"
    assert line["request_id"] == body["request_id"] and line["worker_id"] == "w0"
    assert ("KeyError" in line.get("exception", "")) == (kind == "bug")
    if kind == "large":
        assert body["error"]["message"] == "request exceeds 1024 bytes"


def test_without_the_token_a_logged_route_answers_401_with_its_request_id(lines) -> None:
    r = _request("POST", "/run?kind=ok", token="wrong")
    assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized"
    assert r.json()["request_id"] == r.headers["X-Request-ID"] == lines[0]["request_id"]
    assert lines[0]["status"] == "ERROR" and "worker_id" not in lines[0]  # the route never ran


def test_an_unlogged_route_answers_401_without_ids(lines) -> None:
    r = _request("GET", "/closed", token=None)
    assert r.status_code == 401 and r.json()["request_id"] == "-"
    assert "X-Request-ID" not in r.headers and "X-Instance-ID" not in r.headers and not lines


def test_an_open_route_learns_whether_the_token_came() -> None:
    assert _request("GET", "/open", token=None).json() == {"full": False}
    assert _request("GET", "/open", token="nope").json() == {"full": False}
    assert _request("GET", "/open").json() == {"full": True}


def test_request_ids_adopted_only_when_canonical_and_never_over_a_replay(lines) -> None:
    mine = str(uuid.uuid4())
    assert _request("POST", "/run?kind=ok", headers={"X-Request-ID": mine}).headers["X-Request-ID"] == mine
    other = _request("POST", "/run?kind=ok", headers={"X-Request-ID": "not a uuid"}).headers["X-Request-ID"]
    assert other != "not a uuid" and str(uuid.UUID(other)) == other
    replay = _request("POST", "/run?kind=replay")
    assert replay.headers.get_list("X-Request-ID") == ["replayed-id"]
    assert [line["status"] for line in lines] == ["OK", "OK", "OK"]
