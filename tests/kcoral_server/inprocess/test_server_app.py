"""The server's routes through Starlette's TestClient, against a real `Engine` that is never
started: no worker, zygote or sandbox exists, so these cover what the server answers before
a program reaches a worker (auth, limits, parsing, CACHE_MISS, request ids, draining)."""
from __future__ import annotations

import json
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from kcoral import Program, RemoteError
from kcoral_server import privs
from kcoral_server.app import build_app
from kcoral_server.auth import BearerAuth
from kcoral_server.config import ServerConfig
from kcoral_server.engine import Engine

from tests.kcoral.inprocess.fakeserver import client_for, sha256

with warnings.catch_warnings():
    # Newer Starlette asks for httpx2 under its TestClient; httpx (the client's) still works.
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from starlette.testclient import TestClient

TOKEN = "in-process-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODULE = "def main(*a):\n    return 0\n"


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = Engine(ServerConfig(cpu_workers=1, work_dir=str(tmp_path), blob_dir=str(tmp_path), sandbox="none",
                                 pin_cpus=False, max_request_bytes=64 << 10))
    try:
        yield engine
    finally:
        engine.blobs.close()
        shutil.rmtree(engine.run_root, ignore_errors=True)
        privs.set_dumpable(True)  # the engine made this (pytest's) process non-dumpable


@pytest.fixture
def http(engine: Engine) -> TestClient:
    # Not entered as a context manager: the lifespan (which starts the workers) never runs.
    return TestClient(build_app(engine, BearerAuth(TOKEN)), raise_server_exceptions=True)


def body(program: dict, blobs: dict[str, bytes] | None = None, boundary: str = "xyz") -> tuple[bytes, str]:
    out = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"program\"\r\n"
           f"Content-Type: application/json\r\n\r\n").encode() + json.dumps(program).encode() + b"\r\n"
    for digest, data in (blobs or {}).items():
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"blob:{digest}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def bytes_program(data: bytes) -> dict:
    return {"instructions": [
        {"op": "upload", "kind": "module", "id": "m", "source": MODULE},
        {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "main"},
        {"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(data)},
        {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [{"$ref": "b"}]},
        {"op": "return", "key": "out", "value": {"$ref": "r"}},
    ]}


def post(http: TestClient, program: dict, blobs: dict[str, bytes] | None = None, **headers: str) -> httpx.Response:
    content, ctype = body(program, blobs)
    return http.post("/execute", content=content, headers={**AUTH, "Content-Type": ctype, **headers})


def kind(r: httpx.Response) -> str:
    return str(r.json()["error"]["kind"])


def test_health_says_more_to_a_client_with_the_token(http: TestClient, engine: Engine) -> None:
    short = http.get("/health")
    assert short.status_code == 200 and short.json() == {"status": "ok", "instance_id": engine.instance_id}
    full = http.get("/health", headers=AUTH).json()
    assert full["instance_id"] == engine.instance_id and full["active_requests"] == 0
    assert "builtins" in full["extensions"] and full["sandbox"]["mode"] == "none"


@pytest.mark.parametrize("method,path", [("POST", "/execute"), ("POST", "/jobs"), ("GET", "/jobs/abc"),
                                         ("GET", "/nowhere"), ("DELETE", "/execute/x")])
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", f"Basic {TOKEN}", TOKEN])
def test_every_route_but_health_wants_the_token(http: TestClient, method: str, path: str,
                                                authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    r = http.request(method, path, headers=headers, content=b"")
    assert r.status_code == 401 and kind(r) == "unauthorized"


def test_the_scheme_is_case_insensitive(http: TestClient) -> None:
    r = http.get("/nowhere", headers={"Authorization": f"BEARER {TOKEN}"})
    assert r.status_code == 404 and kind(r) == "not_found"


def test_a_body_over_the_limit_is_refused_before_it_is_read(http: TestClient) -> None:
    big = b"x" * (64 << 10)
    r = post(http, bytes_program(big), {sha256(big): big})
    assert r.status_code == 413 and kind(r) == "request_too_large"
    assert r.headers["X-Instance-ID"]


@pytest.mark.parametrize("content,ctype,message", [
    (b"{}", "application/json", "expected multipart/form-data"),
    (b"--xyz--\r\n", "multipart/form-data; boundary=xyz", "missing 'program' part"),
    (body({"instructions": []}, boundary="a")[0], "multipart/form-data; boundary=other", "no parts"),
    (body({"instructions": [{"op": "teleport"}]})[0], "multipart/form-data; boundary=xyz", "instruction 0"),
])
def test_malformed_requests_are_a_parse_error(http: TestClient, content: bytes, ctype: str, message: str) -> None:
    r = http.post("/execute", content=content, headers={**AUTH, "Content-Type": ctype})
    assert r.status_code == 400 and kind(r) == "parse"
    assert message in r.json()["error"]["message"]


def test_a_blob_must_match_its_digest_and_be_referenced(http: TestClient) -> None:
    data = b"payload"
    wrong = post(http, bytes_program(data), {sha256(data): b"other bytes"})
    assert wrong.status_code == 400 and "does not match its digest" in wrong.json()["error"]["message"]
    stray = post(http, bytes_program(data), {sha256(data): data, sha256(b"stray"): b"stray"})
    assert stray.status_code == 400 and "not referenced" in stray.json()["error"]["message"]


def test_an_uncached_blob_is_a_cache_miss_naming_it(http: TestClient, engine: Engine) -> None:
    data = b"never sent"
    r = post(http, bytes_program(data))
    assert r.status_code == 200
    assert r.json() == {"status": "CACHE_MISS", "request_id": r.headers["X-Request-ID"],
                        "missing_blobs": [sha256(data)]}
    assert len(engine.blobs) == 0 and engine.active == 0


def test_a_tensor_blob_of_the_wrong_size_is_refused(http: TestClient) -> None:
    data = b"\0" * 10
    program = {"instructions": [{"op": "upload", "kind": "tensor", "id": "t", "blob": sha256(data),
                                 "dtype": "float32", "shape": [4]}]}
    r = post(http, program, {sha256(data): data})
    assert r.status_code == 400 and "10 bytes" in r.json()["error"]["message"]


def test_a_canonical_request_id_is_adopted_and_anything_else_replaced(http: TestClient) -> None:
    mine = str(uuid.uuid4())
    assert post(http, bytes_program(b"a"), **{"X-Request-ID": mine}).headers["X-Request-ID"] == mine
    for foreign in (mine.upper(), "not-a-uuid\r\n", "x" * 40):
        got = post(http, bytes_program(b"a"), **{"X-Request-ID": foreign}).headers["X-Request-ID"]
        assert got != foreign and str(uuid.UUID(got)) == got


def test_an_overlong_idempotency_key_is_refused(http: TestClient) -> None:
    data = b"k"
    r = post(http, bytes_program(data), {sha256(data): data}, **{"Idempotency-Key": "k" * 257})
    assert r.status_code == 400 and "Idempotency-Key" in r.json()["error"]["message"]


def test_an_unknown_job_is_not_found(http: TestClient) -> None:
    r = http.get("/jobs/0123abcd", headers=AUTH)
    assert r.status_code == 404 and kind(r) == "not_found"


def test_a_draining_server_answers_busy_with_retry_after(http: TestClient, engine: Engine) -> None:
    engine.draining = True
    r = post(http, bytes_program(b"a"))
    assert r.status_code == 503 and kind(r) == "busy" and r.headers["Retry-After"] == "5"
    assert http.get("/health", headers=AUTH).json()["status"] == "draining"


# ---------------------------------------------------------------------- our client, in process
def forward_to(http: TestClient, seen: list[httpx.Request]) -> Callable[[httpx.Request], httpx.Response]:
    """A transport handler that hands the client's requests to the app."""
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        r = http.request(request.method, request.url.path, content=request.read(), headers=headers)
        return httpx.Response(r.status_code, headers=r.headers, content=r.content)
    return handle


def test_our_client_re_uploads_what_our_server_misses(monkeypatch, http: TestClient) -> None:
    # The blob is above the inline limit, so the first request goes without it; the engine
    # answers CACHE_MISS and the second request carries it. Its size is wrong for the
    # tensor's shape, which only a server holding the bytes can tell: the second answer.
    data = b"\1" * 3000
    p = Program()
    p.upload("tensor", data, dtype="float32", shape=[4])
    seen: list[httpx.Request] = []
    with client_for(monkeypatch, forward_to(http, seen), token=TOKEN, inline_blob_limit=1024) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(p, timeout_seconds=10)
    assert (info.value.kind, info.value.status_code) == ("parse", 400)
    assert "3000 bytes" in info.value.message
    executes = [r for r in seen if r.url.path == "/execute"]
    assert len(executes) == 2
    assert f"blob:{sha256(data)}".encode() not in executes[0].read()
    assert f"blob:{sha256(data)}".encode() in executes[1].read()


def test_our_client_retries_a_draining_server_then_reports_busy(monkeypatch, http: TestClient, engine: Engine,
                                                                 no_sleep: list[float]) -> None:
    engine.draining = True
    seen: list[httpx.Request] = []
    with client_for(monkeypatch, forward_to(http, seen), token=TOKEN, retries=3, max_retry_after=30.0) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(Program(), timeout_seconds=10)
    assert (info.value.kind, info.value.status_code) == ("busy", 503)
    assert len([r for r in seen if r.url.path == "/execute"]) == 3
    assert no_sleep == [5.0, 5.0]   # the server's Retry-After
