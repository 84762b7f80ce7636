"""A scripted stand-in for a KCoral server, answering a `Client` through httpx's
`MockTransport`: no socket, no process. Tests script the answers to /execute and read back
every request the client made, its multipart body decoded by the standard library (so the
client's framing is checked against a parser that is not ours)."""
from __future__ import annotations

import email.parser
import email.policy
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from kcoral import Client
from kcoral.capabilities import SERVER_EXTENSIONS

# /health of our server (what `Client.capabilities` reads), and of a released router in front
# of our nodes: the router passes the nodes' extensions in `versions`.
OUR_HEALTH: dict[str, Any] = {"status": "ok", "instance_id": "fake-instance", "gpu_count": 0,
                              "extensions": list(SERVER_EXTENSIONS)}
ROUTER_HEALTH: dict[str, Any] = {"status": "ok", "gpu_count": None,
                                 "load": {"request_capacity": 1, "requests_in_progress": 0, "requests_waiting": 0},
                                 "versions": {"kcoral-evolve.extensions": ",".join(SERVER_EXTENSIONS)}}


@dataclass
class Submission:
    """One POST /execute as the fake server received it."""

    headers: httpx.Headers
    program: dict[str, Any]
    program_type: str
    blobs: dict[str, bytes]          # part name blob:<digest> -> its bytes
    blob_types: dict[str, str]


def decode_submission(request: httpx.Request) -> Submission:
    raw = request.read()
    head = f"Content-Type: {request.headers['content-type']}\r\nMIME-Version: 1.0\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + raw)
    assert message.is_multipart(), "an /execute body must be multipart/form-data"
    program: dict[str, Any] | None = None
    program_type = ""
    blobs: dict[str, bytes] = {}
    blob_types: dict[str, str] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True)
        assert isinstance(name, str) and isinstance(data, bytes)
        if name == "program":
            program, program_type = json.loads(data), part.get_content_type()
        else:
            blobs[name], blob_types[name] = data, part.get_content_type()
    assert program is not None, "no 'program' part"
    return Submission(request.headers, program, program_type, blobs, blob_types)


def json_answer(body: dict[str, Any], status: int = 200, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def completed(results: dict[str, Any] | None = None, **fields: Any) -> httpx.Response:
    return json_answer({"status": "COMPLETED", "request_id": "rid-ok", "results": results or {}, **fields})


def cache_miss(*digests: str) -> httpx.Response:
    return json_answer({"status": "CACHE_MISS", "request_id": "rid-miss", "missing_blobs": list(digests)})


def error(status: int, kind: str, message: str = "", **headers: str) -> httpx.Response:
    return json_answer({"status": "ERROR", "request_id": f"rid-{kind}", "error": {"kind": kind, "message": message}},
                       status, headers)


def multipart_answer(parts: list[tuple[str, str, bytes]], boundary: str = "b0und4ry",
                     lengths: bool = True) -> httpx.Response:
    """A multipart/form-data response framed by hand, as RFC 7578 spells it."""
    body = b""
    for name, ctype, data in parts:
        length = f"Content-Length: {len(data)}\r\n" if lengths else ""
        body += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n"
                 f"Content-Type: {ctype}\r\n{length}\r\n").encode() + data + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return httpx.Response(200, content=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


Answer = httpx.Response | BaseException | Callable[[httpx.Request], httpx.Response]


@dataclass
class FakeServer:
    """Answers /execute from `script`, one entry per request (an exception entry is raised
    as the transport's failure); /health with `health`."""

    script: list[Answer] = field(default_factory=list)
    health: dict[str, Any] = field(default_factory=lambda: dict(OUR_HEALTH))
    requests: list[httpx.Request] = field(default_factory=list)

    @property
    def submissions(self) -> list[Submission]:
        return [decode_submission(r) for r in self.requests if r.url.path == "/execute"]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/health":
            return httpx.Response(200, json=self.health)
        if not self.script:
            raise AssertionError(f"unscripted request {request.method} {request.url.path}")
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, httpx.Response):
            return answer
        return answer(request)


@contextmanager
def client_for(monkeypatch: pytest.MonkeyPatch, handler: Callable[[httpx.Request], httpx.Response],
               token: str = "t0ken", **options: Any) -> Iterator[Client]:
    """A real `Client` whose HTTP goes to `handler` in this process. The client builds its
    own transport (one whose sockets abort() can shut down); here it gets a MockTransport,
    which has no sockets, so abort() falls back to closing the client."""
    import kcoral.client

    monkeypatch.setattr(kcoral.client, "tracking_transport", lambda: (httpx.MockTransport(handler), None))
    with Client("http://kcoral.test", token=token, **options) as client:
        yield client

