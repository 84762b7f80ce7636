"""Every malformed request gets its 4xx and error kind, and nothing runs."""
from __future__ import annotations

import json

import httpx
import pytest

from kcoral.errors import WireError
from kcoral.protocol.limits import MAX_OUTPUT_LIMIT, MAX_TIMEOUT_SECONDS
from kcoral.protocol.program import parse_program
from tests.serverproc import ServerProcess

from .helpers import post_program, post_raw, sha

BLOB = b"some bytes"
D = sha(BLOB)
MOD = {"op": "upload", "kind": "module", "id": "m", "source": "def f():\n    return 1\n"}


def prog(*instructions, **extra):
    return {"instructions": list(instructions), **extra}


def file_upload(path):
    return {"op": "upload", "kind": "file", "blob": D, "path": path}


BAD_PROGRAMS = {
    "duplicate key": '{"instructions": [], "instructions": []}',
    "nan": '{"instructions": [{"op": "run", "id": "r", "fn": "builtin.zeros", "args": [NaN]}]}',
    "infinity": '{"instructions": [{"op": "run", "id": "r", "fn": "builtin.zeros", "args": [Infinity]}]}',
    "huge number": '{"instructions": [{"op": "run", "id": "r", "fn": "builtin.zeros", "args": [1e999]}]}',
    "not json": '{"instructions": [',
    "not an object": "[]",
    "unknown program field": json.dumps(prog(extra=1)),
    "unknown op": json.dumps(prog({"op": "exec", "id": "x"})),
    "unknown instruction field": json.dumps(prog({**MOD, "mode": "fast"})),
    "unknown upload kind": json.dumps(prog({"op": "upload", "kind": "image", "id": "x", "blob": D})),
    "unknown option": json.dumps(prog(options={"timeout_seconds": 5, "priority": 1})),
    "negative timeout": json.dumps(prog(options={"timeout_seconds": -1})),
    "negative output limit": json.dumps(prog(options={"output_limit_bytes": -1})),
    "bool option": json.dumps(prog(options={"timeout_seconds": True})),
    "string id type": json.dumps(prog({**MOD, "id": 5})),
    "empty id": json.dumps(prog({**MOD, "id": ""})),
    "duplicate id": json.dumps(prog(MOD, MOD)),
    "ref with extra key": json.dumps(prog(MOD, {"op": "get_function", "id": "f", "module": {"$ref": "m", "x": 1}, "name": "f"})),
    "ref in args with extra key": json.dumps(prog({"op": "run", "id": "r", "fn": "builtin.zeros", "args": [{"$ref": "r", "k": 2}]})),
    "ref to later instruction": json.dumps(prog({"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"}, MOD)),
    "ref to itself": json.dumps(prog({"op": "run", "id": "r", "fn": "builtin.zeros", "args": [{"$ref": "r"}]})),
    "ref to unknown": json.dumps(prog({"op": "return", "key": "k", "value": {"$ref": "nope"}})),
    "fn not builtin": json.dumps(prog({"op": "run", "id": "r", "fn": "os.system"})),
    "empty function name": json.dumps(prog(MOD, {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": ""})),
    "module ref to a run": json.dumps(prog({"op": "run", "id": "r", "fn": "builtin.zeros", "args": [[1]]},
                                           {"op": "get_function", "id": "f", "module": {"$ref": "r"}, "name": "x"})),
    "duplicate return key": json.dumps(prog(MOD, {"op": "return", "key": "k", "value": {"$ref": "m"}},
                                            {"op": "return", "key": "k", "value": {"$ref": "m"}})),
    "unknown dtype": json.dumps(prog({"op": "upload", "kind": "tensor", "id": "t", "blob": D, "dtype": "float12", "shape": [1]})),
    "bad digest format": json.dumps(prog({"op": "upload", "kind": "bytes", "id": "b", "blob": "ABC"})),
    "absolute path": json.dumps(prog(file_upload("/etc/passwd"))),
    "dotdot path": json.dumps(prog(file_upload("a/../../x"))),
    "backslash path": json.dumps(prog(file_upload("a\\b"))),
    "nul path": json.dumps(prog(file_upload("a\u0000b"))),
    "empty path": json.dumps(prog(file_upload(""))),
    "dot path": json.dumps(prog(file_upload("./."))),
    "directory path": json.dumps(prog(file_upload("dir/"))),
    "duplicate normalised path": json.dumps(prog(file_upload("a/b"), file_upload("a//./b"))),
    "file and directory conflict": json.dumps(prog(file_upload("a"), file_upload("a/b"))),
    "directory then file conflict": json.dumps(prog(file_upload("a/b"), file_upload("a"))),
    "return path with dotdot": json.dumps(prog({"op": "return", "key": "k", "kind": "file", "path": "../x"})),
}


@pytest.mark.parametrize("name", sorted(BAD_PROGRAMS))
def test_malformed_program_is_400_parse(cpu_server, name: str) -> None:
    r = post_program(cpu_server.url, BAD_PROGRAMS[name])
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["status"] == "ERROR" and body["error"]["kind"] == "parse" and body["error"]["message"]
    assert body["request_id"] == r.headers["X-Request-ID"]


UPLOAD_B = json.dumps(prog({"op": "upload", "kind": "bytes", "id": "b", "blob": D})).encode()
BAD_PARTS = {
    "missing program": [("blob:" + D, "application/octet-stream", BLOB)],
    "duplicate program": [("program", "application/json", UPLOAD_B), ("program", "application/json", UPLOAD_B)],
    "program wrong type": [("program", "text/plain", UPLOAD_B)],
    "unknown part": [("program", "application/json", UPLOAD_B), ("extra", "application/octet-stream", b"x")],
    "malformed blob name": [("program", "application/json", UPLOAD_B), ("blob:" + D.upper(), "application/octet-stream", BLOB)],
    "duplicate blob": [("program", "application/json", UPLOAD_B), ("blob:" + D, "application/octet-stream", BLOB),
                       ("blob:" + D, "application/octet-stream", BLOB)],
    "blob wrong type": [("program", "application/json", UPLOAD_B), ("blob:" + D, "text/plain", BLOB)],
    "digest mismatch": [("program", "application/json", UPLOAD_B), ("blob:" + D, "application/octet-stream", b"other")],
    "unreferenced blob": [("program", "application/json", UPLOAD_B), ("blob:" + D, "application/octet-stream", BLOB),
                          ("blob:" + sha(b"zz"), "application/octet-stream", b"zz")],
}


@pytest.mark.parametrize("name", sorted(BAD_PARTS))
def test_malformed_parts_are_400_parse(cpu_server, name: str) -> None:
    r = post_raw(cpu_server.url, BAD_PARTS[name])
    assert r.status_code == 400, r.text
    assert r.json()["error"]["kind"] == "parse"


def test_non_multipart_body_is_400(cpu_server) -> None:
    r = httpx.post(f"{cpu_server.url}/execute", content=UPLOAD_B, headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["kind"] == "parse"
    r = httpx.post(f"{cpu_server.url}/execute", content=b"--x\r\nbroken", headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert r.status_code == 400 and r.json()["error"]["kind"] == "parse"


def test_tensor_length_must_match_shape(cpu_server) -> None:
    data = b"\x00" * 12
    p = prog({"op": "upload", "kind": "tensor", "id": "t", "blob": sha(data), "dtype": "float32", "shape": [2, 2]})
    r = post_program(cpu_server.url, p, {sha(data): data})
    assert r.status_code == 400 and "bytes" in r.json()["error"]["message"]
    # The same check applies when the blob comes from the cache.
    ok = prog({"op": "upload", "kind": "tensor", "id": "t", "blob": sha(data), "dtype": "float32", "shape": [3]})
    assert post_program(cpu_server.url, ok, {sha(data): data}).json()["status"] == "COMPLETED"
    r = post_program(cpu_server.url, p)
    assert r.status_code == 400 and r.json()["error"]["kind"] == "parse"


def test_bad_idempotency_key_is_400(cpu_server) -> None:
    r = post_program(cpu_server.url, prog(), headers={"Idempotency-Key": "k" * 300})
    assert r.status_code == 400 and r.json()["error"]["kind"] == "parse"


def test_options_are_clamped_not_rejected() -> None:
    spec = parse_program({"instructions": [], "options": {"timeout_seconds": 10**6, "output_limit_bytes": 10**12}})
    assert spec.options.timeout_seconds == MAX_TIMEOUT_SECONDS
    assert spec.options.output_limit_bytes == MAX_OUTPUT_LIMIT
    assert parse_program({"instructions": []}).options.timeout_seconds == 300
    with pytest.raises(WireError):
        parse_program({"instructions": [], "options": {"timeout_seconds": 0}})


def test_unknown_route_is_404(cpu_server) -> None:
    r = httpx.get(f"{cpu_server.url}/nope")
    assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"


def test_request_over_the_size_limit_is_413() -> None:
    with ServerProcess(["--cpu-workers", "1", "--max-request-bytes", "4096"]) as srv:
        big = b"x" * 8192
        p = prog({"op": "upload", "kind": "bytes", "id": "b", "blob": sha(big)})
        r = post_program(srv.url, p, {sha(big): big})
        assert r.status_code == 413 and r.json()["error"]["kind"] == "request_too_large"
        small = b"y" * 100
        ok = post_program(srv.url, prog({"op": "upload", "kind": "bytes", "id": "b", "blob": sha(small)}), {sha(small): small})
        assert ok.status_code == 200 and ok.json()["status"] == "COMPLETED"
