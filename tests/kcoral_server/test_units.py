"""In-process checks of the server's small parts (no server process needed)."""
from __future__ import annotations

import asyncio
import time

import pytest

from kcoral.errors import WireError
from kcoral.protocol.multipart import encode_multipart, parse_multipart
from kcoral.protocol.paths import normalize_path
from kcoral_server.blobs import BlobStore
from kcoral_server.holdout import HoldoutSalt
from kcoral_server.journal import Journal, StoredResponse
from kcoral_server.scheduler import LeaseScheduler


@pytest.mark.parametrize("raw,norm", [("a/b", "a/b"), ("./a//b/./c", "a/b/c"), ("a/./b", "a/b")])
def test_normalize_path_accepts(raw: str, norm: str) -> None:
    assert normalize_path(raw) == norm


@pytest.mark.parametrize("raw", ["", "/a", "a/../b", "..", "a\\b", "a\x00", ".", "a/"])
def test_normalize_path_refuses(raw: str) -> None:
    with pytest.raises(WireError):
        normalize_path(raw)
    assert normalize_path(".", allow_root=True) == ""


def test_multipart_round_trip_and_strictness() -> None:
    ctype, chunks = encode_multipart([("a", "application/json", b"{}"), ("b", "application/octet-stream", b"\r\n--x\r\n")])
    parts = parse_multipart(b"".join(chunks), ctype)
    assert [(p.name, bytes(p.data)) for p in parts] == [("a", b"{}"), ("b", b"\r\n--x\r\n")]
    with pytest.raises(WireError):
        parse_multipart(b"".join(chunks)[:-10], ctype)
    with pytest.raises(WireError):
        parse_multipart(b"".join(chunks), "multipart/form-data")


def test_blob_store_evicts_lru_but_never_pinned(tmp_path) -> None:
    store = BlobStore(str(tmp_path / "blobs"), capacity_bytes=250)
    for name in ("a", "b", "c"):
        store.write_file(name, bytes(100))
        store.register(name, 100)
    store.pin(["a"])
    store.trim()  # 300 > 250: the oldest unpinned ("b") goes
    assert store.missing(["a", "b", "c"]) == ["b"]
    assert not (tmp_path / "blobs" / "b").exists()
    store.unpin(["a"])
    assert store.used_bytes == 200


def test_journal_replays_then_expires(tmp_path) -> None:
    async def scenario() -> None:
        j = Journal(str(tmp_path), retention_seconds=0.2)
        j.begin("k", "hash")
        await j.finish("k", StoredResponse(200, {"Content-Type": "application/json"}, b"{}"))
        again = Journal(str(tmp_path), retention_seconds=0.2)  # as after a restart
        entry = again.get("k")
        assert entry is not None and entry.response is not None and entry.response.body == b"{}"
        time.sleep(0.25)
        assert again.get("k") is None
        assert Journal(str(tmp_path), retention_seconds=0.2).get("k") is None

    asyncio.run(scenario())


def test_journal_keeps_its_bodies_under_the_byte_budget(tmp_path) -> None:
    async def scenario() -> None:
        j = Journal(str(tmp_path), retention_seconds=3600, max_bytes=250)
        for i in range(4):  # 4 x 100 bytes into a 250-byte budget
            j.begin(f"k{i}", "hash")
            await j.finish(f"k{i}", StoredResponse(200, {}, bytes(100)))
            time.sleep(0.001)  # distinct creation times: eviction is oldest first
        assert j.stored_bytes <= 250
        assert j.get("k0") is None and j.get("k1") is None
        assert j.get("k3") is not None and j.get("k3").response.body == bytes(100)
        reloaded = Journal(str(tmp_path), retention_seconds=3600, max_bytes=250)  # dropped on disk too
        assert reloaded.get("k0") is None and reloaded.get("k3") is not None
        big = Journal(str(tmp_path / "big"), retention_seconds=3600, max_bytes=10)
        big.begin("huge", "hash")
        await big.finish("huge", StoredResponse(200, {}, bytes(50)))  # larger than the budget alone
        assert big.get("huge") is not None  # the outcome just produced is always kept

    asyncio.run(scenario())


def test_leases_are_fifo_and_exclusive() -> None:
    async def scenario() -> list[str]:
        s = LeaseScheduler([0])
        order: list[str] = []

        async def user(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            await s.acquire(0)
            order.append(f"+{name}")
            await asyncio.sleep(0.01)
            order.append(f"-{name}")
            s.release(0)

        await asyncio.gather(user("a", 0), user("b", 0.001), user("c", 0.002))
        assert s.depth(0) == 0
        return order

    assert asyncio.run(scenario()) == ["+a", "-a", "+b", "-b", "+c", "-c"]


def test_holdout_salt_file_and_repr(tmp_path) -> None:
    f = tmp_path / "salt"
    f.write_bytes(b"abc\n")
    salt = HoldoutSalt.load(str(f), None)
    assert "abc" not in repr(salt)
    assert salt.derive("ns", "n1", 0) == HoldoutSalt(b"abc").derive("ns", "n1", 0)
    assert salt.derive("ns", "n1", 0) != HoldoutSalt(b"abd").derive("ns", "n1", 0)
    assert salt.derive("ns", "n1", 0) != salt.derive("ns", "n2", 0)
    assert salt.seeds("ns", 2) != salt.seeds("ns", 2)  # a fresh nonce per call


def test_stale_scratch_folders_of_dead_servers_are_swept(tmp_path) -> None:
    import subprocess

    from kcoral_server.tempdirs import OWNER_FILE, make_owned_dir, sweep_stale

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / "kcoral-x-stale"
    stale.mkdir()
    (stale / OWNER_FILE).write_text(str(dead.pid))
    mine = make_owned_dir("kcoral-x-", str(tmp_path))
    foreign = tmp_path / "kcoral-x-foreign"
    foreign.mkdir()  # no owner file: never touched
    assert sweep_stale(str(tmp_path), "kcoral-x-") == 1
    assert not stale.exists() and (tmp_path / mine).exists() and foreign.exists()


def test_client_request_body_parses_with_an_independent_multipart_parser() -> None:
    """What the client sends must be plain multipart/form-data that any server can read."""
    from python_multipart.multipart import MultipartParser, parse_options_header

    from kcoral.protocol.multipart import encode_multipart

    ctype, chunks = encode_multipart([("program", "application/json", b'{"instructions":[]}'),
                                      ("blob:" + "0" * 64, "application/octet-stream", b"\r\n--\x00")],
                                     part_lengths=False)
    _, params = parse_options_header(ctype)
    parts: list[list] = []

    def on_part_begin() -> None:
        parts.append([b"", b""])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        parts[-1][0] += data[start:end] + b";"

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][1] += data[start:end]

    parser = MultipartParser(params[b"boundary"], callbacks={
        "on_part_begin": on_part_begin, "on_header_value": on_header_value, "on_part_data": on_part_data})
    parser.write(b"".join(bytes(c) for c in chunks))
    parser.finalize()
    assert [p[1] for p in parts] == [b'{"instructions":[]}', b"\r\n--\x00"]
    assert b'name="program"' in parts[0][0] and b"application/octet-stream" in parts[1][0]
