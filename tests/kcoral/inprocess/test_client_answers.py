"""Decoding the server's answers: JSON and multipart results, typed values and their
digests, and what an unreadable answer becomes."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from kcoral import FileValue, FolderValue, Program, TransportError

from .fakeserver import FakeServer, client_for, completed, json_answer, multipart_answer, sha256

TENSOR = np.arange(6, dtype=np.int32).reshape(2, 3)
RAW = b"--b0und4ry\r\nnot a delimiter\r\n"   # payload bytes that mimic the framing


def program() -> Program:
    p = Program()
    p.return_("out", p.run("builtin.zeros", [1]))
    return p


def result_json(results: dict, **fields) -> bytes:
    return json.dumps({"status": "COMPLETED", "request_id": "rid-1", "results": results, **fields}).encode()


def tensor_node(part: str, data: bytes, digest: str | None = None) -> dict:
    return {"type": "tensor", "dtype": "int32", "shape": [2, 3], "part": part, "sha256": digest or sha256(data)}


def run(monkeypatch, answer: httpx.Response, **options):
    server = FakeServer([answer])
    with client_for(monkeypatch, server.handle, **options) as client:
        return client.execute(program(), timeout_seconds=10)


def test_a_multipart_answer_decodes_into_typed_values(monkeypatch) -> None:
    data = TENSOR.tobytes()
    results = {
        "t": tensor_node("return:0", data),
        "b": {"type": "bytes", "part": "return:1", "sha256": sha256(RAW)},
        "nested": {"type": "object", "value": {
            "f": {"type": "file", "size": 3, "part": "return:2", "sha256": sha256(b"abc")},
            "d": {"type": "folder", "directories": ["sub"],
                  "files": {"sub/x.txt": {"type": "file", "size": 1, "part": "return:3", "sha256": sha256(b"x")}}},
            "list": {"type": "array", "value": [{"type": "null"}, {"type": "boolean", "value": True},
                                                {"type": "number", "value": 0.5}, {"type": "string", "value": "s"}]},
        }},
    }
    outcome = run(monkeypatch, multipart_answer([
        ("result", "application/json", result_json(results, stdout="hi\n", worker_id="cpu/w0")),
        ("return:0", "application/octet-stream", data),
        ("return:1", "application/octet-stream", RAW),
        ("return:2", "application/octet-stream", b"abc"),
        ("return:3", "application/octet-stream", b"x"),
    ]))
    assert outcome.status == "COMPLETED" and outcome.request_id == "rid-1"
    assert (outcome.stdout, outcome.worker_id) == ("hi\n", "cpu/w0")
    np.testing.assert_array_equal(outcome.results["t"], TENSOR)
    assert outcome.results["t"].dtype == np.int32
    assert outcome.results["b"] == RAW
    nested = outcome.results["nested"]
    assert nested["f"] == FileValue(b"abc")
    assert nested["d"] == FolderValue(files={"sub/x.txt": b"x"}, directories=["sub"])
    assert nested["list"] == [None, True, 0.5, "s"]


def test_parts_without_content_length_decode_too(monkeypatch) -> None:
    outcome = run(monkeypatch, multipart_answer([("result", "application/json", result_json(
        {"b": {"type": "bytes", "part": "return:0", "sha256": sha256(RAW)}})),
        ("return:0", "application/octet-stream", RAW)], lengths=False))
    assert outcome.results["b"] == RAW


def test_a_part_that_does_not_match_its_digest_is_refused(monkeypatch) -> None:
    data = TENSOR.tobytes()
    answer = multipart_answer([("result", "application/json", result_json({"t": tensor_node("return:0", data, "0" * 64)})),
                               ("return:0", "application/octet-stream", data)])
    with pytest.raises(TransportError, match="digest mismatch"):
        run(monkeypatch, answer)


def test_digests_go_unchecked_when_the_client_says_so(monkeypatch) -> None:
    data = TENSOR.tobytes()
    answer = multipart_answer([("result", "application/json", result_json({"t": tensor_node("return:0", data, "0" * 64)})),
                               ("return:0", "application/octet-stream", data)])
    np.testing.assert_array_equal(run(monkeypatch, answer, verify_digests=False).results["t"], TENSOR)


@pytest.mark.parametrize("answer,message", [
    (multipart_answer([("return:0", "application/octet-stream", b"x")]), "without a 'result' part"),
    (multipart_answer([("result", "application/json", result_json({"b": {"type": "bytes", "part": "return:0",
                                                                         "sha256": sha256(b"")}}))]),
     "missing part"),
    (httpx.Response(200, content=b"--x\r\nbroken", headers={"Content-Type": "multipart/form-data; boundary=x"}),
     "unreadable response"),
    (httpx.Response(200, content=b"<html/>", headers={"Content-Type": "text/html"}), "unexpected response content type"),
    (httpx.Response(200, content=b'{"status": "COMPLETED", "status": "FAILED"}',
                    headers={"Content-Type": "application/json"}), "unreadable response"),
    (httpx.Response(200, content=b'{"status": "COMPLETED", "results": {"x": {"type": "number", "value": NaN}}}',
                    headers={"Content-Type": "application/json"}), "unreadable response"),
    (json_answer({"status": "QUEUED", "request_id": "r"}), "unexpected status 'QUEUED'"),
    (json_answer({"status": "COMPLETED", "results": {"x": {"type": "mystery"}}}), "unknown value type"),
])
def test_an_unreadable_answer_is_a_transport_error(monkeypatch, answer: httpx.Response, message: str) -> None:
    with pytest.raises(TransportError, match=message):
        run(monkeypatch, answer)


def test_a_part_whose_length_header_lies_is_refused(monkeypatch) -> None:
    body = (b"--B\r\nContent-Disposition: form-data; name=\"result\"\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999\r\n\r\n" + result_json({}) + b"\r\n--B--\r\n")
    answer = httpx.Response(200, content=body, headers={"Content-Type": "multipart/form-data; boundary=B"})
    with pytest.raises(TransportError, match="Content-Length does not match"):
        run(monkeypatch, answer)


def test_a_failed_outcome_keeps_its_error(monkeypatch) -> None:
    outcome = run(monkeypatch, json_answer({"status": "FAILED", "request_id": "rid-f",
                                            "error": {"kind": "runtime", "message": "boom", "instruction_index": 2}},
                                           headers={"X-Instance-ID": "inst-7"}))
    assert outcome.status == "FAILED" and outcome.error is not None
    assert (outcome.error.kind, outcome.error.message, outcome.error.instruction_index) == ("runtime", "boom", 2)
    assert outcome.server_instance == "inst-7"


def test_the_request_id_falls_back_to_the_header(monkeypatch) -> None:
    answer = completed()
    body = json.loads(answer.content)
    del body["request_id"]
    outcome = run(monkeypatch, json_answer(body, headers={"X-Request-ID": "from-header"}))
    assert outcome.request_id == "from-header"
