"""CACHE_MISS: the client sends small blobs inline, then exactly what the server says it
misses, then everything; never a blob the program does not hold."""
from __future__ import annotations

import httpx
import numpy as np
import pytest

from kcoral import Program, RemoteError

from .fakeserver import FakeServer, cache_miss, client_for, completed, sha256

SMALL = b"s" * 100
LARGE = bytes(range(256)) * 40          # 10 KiB: above the limit the tests set
OTHER_LARGE = b"\r\n--" * 3000          # bytes that look like multipart framing


def blob_program() -> Program:
    p = Program()
    fn = p.get_function(p.upload("module", source="def main(*a):\n    return len(a)\n"), "main")
    p.return_("out", p.run(fn, [SMALL, LARGE, OTHER_LARGE]))
    return p


def sent(server: FakeServer) -> list[set[str]]:
    return [{name.removeprefix("blob:") for name in s.blobs} for s in server.submissions]


def test_large_blobs_wait_until_the_server_misses_them(monkeypatch) -> None:
    server = FakeServer([cache_miss(sha256(LARGE)), completed()])
    with client_for(monkeypatch, server.handle, inline_blob_limit=1024) as client:
        assert client.execute(blob_program(), timeout_seconds=10).status == "COMPLETED"
    assert sent(server) == [{sha256(SMALL)}, {sha256(LARGE)}]
    second = server.submissions[1]
    assert second.blobs[f"blob:{sha256(LARGE)}"] == LARGE
    assert second.program == server.submissions[0].program, "the re-upload sends the same program"
    assert second.headers["Idempotency-Key"] == server.submissions[0].headers["Idempotency-Key"]


def test_a_cached_program_is_sent_without_its_large_blobs(monkeypatch) -> None:
    server = FakeServer([completed()])
    with client_for(monkeypatch, server.handle, inline_blob_limit=1024) as client:
        client.execute(blob_program(), timeout_seconds=10)
    assert sent(server) == [{sha256(SMALL)}]


def test_a_third_round_sends_every_blob_and_then_gives_up(monkeypatch) -> None:
    # An evicting cache may miss again what it was just sent.
    server = FakeServer([cache_miss(sha256(LARGE)), cache_miss(sha256(OTHER_LARGE)), cache_miss(sha256(SMALL))])
    with client_for(monkeypatch, server.handle, inline_blob_limit=1024) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(blob_program(), timeout_seconds=10)
    assert info.value.kind == "cache_miss"
    assert sent(server) == [{sha256(SMALL)}, {sha256(LARGE)}, {sha256(SMALL), sha256(LARGE), sha256(OTHER_LARGE)}]


def test_the_third_round_can_succeed(monkeypatch) -> None:
    server = FakeServer([cache_miss(sha256(LARGE)), cache_miss(sha256(OTHER_LARGE)), completed()])
    with client_for(monkeypatch, server.handle, inline_blob_limit=1024) as client:
        assert client.execute(blob_program(), timeout_seconds=10).status == "COMPLETED"
    assert len(server.submissions) == 3


def test_a_server_missing_a_blob_the_program_lacks_is_refused(monkeypatch) -> None:
    stranger = sha256(b"not in this program")
    server = FakeServer([cache_miss(stranger)])
    with client_for(monkeypatch, server.handle, inline_blob_limit=1024) as client:
        with pytest.raises(RemoteError) as info:
            client.execute(blob_program(), timeout_seconds=10)
    assert info.value.kind == "parse" and stranger in info.value.message
    assert len(server.submissions) == 1


def test_blob_parts_are_named_by_their_digest_and_hold_the_exact_bytes(monkeypatch) -> None:
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    p = Program()
    fn = p.get_function(p.upload("module", source="def main(*a):\n    return 0\n"), "main")
    p.return_("out", p.run(fn, [array, OTHER_LARGE]))
    server = FakeServer([completed()])
    with client_for(monkeypatch, server.handle) as client:
        client.execute(p, timeout_seconds=10)
    (submission,) = server.submissions
    assert submission.program_type == "application/json"
    assert set(submission.blob_types.values()) == {"application/octet-stream"}
    assert submission.blobs == {f"blob:{sha256(array.tobytes())}": array.tobytes(),
                                f"blob:{sha256(OTHER_LARGE)}": OTHER_LARGE}
    tensor = next(i for i in submission.program["instructions"] if i.get("kind") == "tensor")
    assert (tensor["dtype"], tensor["shape"], tensor["blob"]) == ("float32", [3, 4], sha256(array.tobytes()))


def test_the_request_is_framed_without_part_lengths(monkeypatch) -> None:
    # Requests leave Content-Length out of their parts, as common HTTP clients do.
    server = FakeServer([completed()])
    with client_for(monkeypatch, server.handle) as client:
        client.execute(blob_program(), timeout_seconds=10)
    request: httpx.Request = next(r for r in server.requests if r.url.path == "/execute")
    assert request.headers["content-type"].startswith("multipart/form-data; boundary=")
    assert b"Content-Length" not in request.content
    assert request.headers["content-length"] == str(len(request.content))
