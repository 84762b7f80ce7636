"""Round trips of every instruction and value type through a real server and client."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from kcoral import Client, FileValue, FolderValue, Program, RemoteError
from kcoral.values import PartSink, decode_value, encode_value
from kcoral.errors import WireError

from .helpers import function_program, post_program, sha

ECHO = "def main(*args):\n    return list(args)\n"


def test_scalar_and_container_values_round_trip(client: Client) -> None:
    values = [None, True, False, 0, -7, 2**70, 1.5, -0.0, "", "héllo ✓", [1, [2, [3]]], {"a": {"b": [None]}}]
    p = function_program(ECHO, args=values)
    out = client.execute(p, timeout_seconds=30).raise_for_failure()
    assert out.results["out"] == values
    assert out.status == "COMPLETED" and out.error is None


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "uint8", "bool", "bfloat16", "complex64"])
def test_tensor_round_trip_keeps_dtype_shape_and_bytes(client: Client, dtype: str) -> None:
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    arr = (np.arange(24) % 5).astype(dt).reshape(2, 3, 4)
    p = Program()
    mod = p.upload(kind="module", source="def main(t):\n    return {'t': t, 'sum': float(t.real.astype('float64').sum())}\n")
    t = p.upload(kind="tensor", value=arr)
    out = p.run(fn=p.get_function(module=mod, name="main"), args=[t])
    p.return_(key="out", value=out)
    p.return_(key="raw", value=t)
    res = client.execute(p, timeout_seconds=30).raise_for_failure()
    back = res.results["out"]["t"]
    assert back.dtype == dt and back.shape == (2, 3, 4)
    assert back.tobytes() == arr.tobytes()
    assert res.results["raw"].tobytes() == arr.tobytes()
    assert res.results["out"]["sum"] == pytest.approx(float(arr.real.astype(np.float64).sum()))


def test_bytes_file_and_folder_round_trip(client: Client) -> None:
    p = Program()
    mod = p.upload(kind="module", source=(
        "import os\n"
        "def main(b):\n"
        "    os.makedirs('out/sub', exist_ok=True)\n"
        "    open('out/a.txt', 'wb').write(b[::-1])\n"
        "    open('out/sub/b.bin', 'wb').write(b'\\x00\\x01')\n"
        "    os.makedirs('out/empty', exist_ok=True)\n"
        "    return b + b'!'\n"))
    blob = p.upload(kind="bytes", value=b"abc" * 30000)
    p.upload(kind="file", path="./in//nested/data.bin", value=b"payload")
    out = p.run(fn=p.get_function(module=mod, name="main"), args=[blob])
    p.return_(key="bytes", value=out)
    p.return_(key="file", kind="file", path="in/nested/data.bin")
    p.return_(key="folder", kind="folder", path="out")
    res = client.execute(p, timeout_seconds=30).raise_for_failure()
    assert res.results["bytes"] == b"abc" * 30000 + b"!"
    assert res.results["file"] == FileValue(b"payload")
    folder = res.results["folder"]
    assert isinstance(folder, FolderValue)
    assert folder.files == {"a.txt": (b"abc" * 30000)[::-1], "sub/b.bin": b"\x00\x01"}
    assert sorted(folder.directories) == ["empty", "sub"]


def test_uploaded_files_are_importable_and_do_not_leak(client: Client) -> None:
    p = Program()
    p.upload(kind="file", path="helper_mod_x.py", value=b"VALUE = 41\n")
    mod = p.upload(kind="module", source="def main():\n    import helper_mod_x\n    return helper_mod_x.VALUE + 1\n")
    p.return_(key="out", value=p.run(fn=p.get_function(module=mod, name="main")))
    assert client.execute(p, timeout_seconds=30).raise_for_failure().results["out"] == 42
    # Both workers: the module from the earlier request must not be importable any more.
    probe = function_program("def main():\n    import importlib.util, sys\n"
                             "    return [importlib.util.find_spec('helper_mod_x') is None, 'helper_mod_x' in sys.modules]\n")
    for _ in range(3):
        assert client.execute(probe, timeout_seconds=30).raise_for_failure().results["out"] == [True, False]


def test_return_path_from_ref_and_cuda_module_text(client: Client) -> None:
    p = Program()
    mod = p.upload(kind="module", source="def main():\n    open('r.txt','w').write('ref')\n    return 'r.txt'\n")
    cu = p.upload(kind="module", source="__global__ void k() {}", language="cuda")
    path = p.run(fn=p.get_function(module=mod, name="main"))
    p.return_(key="f", kind="file", path=path)
    compiled = p.run(fn="builtin.compile_cuda", args=[cu, {"name": "k"}])
    p.return_(key="never", value=compiled)
    res = client.execute(p, timeout_seconds=30)
    assert res.results["f"] == FileValue(b"ref")
    # A CPU server cannot compile CUDA: `unavailable`, at the compile instruction.
    assert res.status == "FAILED" and res.error.kind == "unavailable"
    assert res.error.instruction_index == 5 and res.error.instruction_op == "run"


def test_callable_returned_by_a_run_can_be_run(client: Client) -> None:
    p = Program()
    mod = p.upload(kind="module", source="def make(k):\n    return lambda x: x * k\n")
    f = p.run(fn=p.get_function(module=mod, name="make"), args=[3])
    p.return_(key="out", value=p.run(fn=f, args=[14]))
    assert client.execute(p, timeout_seconds=30).raise_for_failure().results["out"] == 42


def test_cache_miss_flow_then_cached_submission_sends_no_bytes(cpu_server) -> None:
    blob = np.random.default_rng(0).bytes(200_000)
    prog = {"instructions": [
        {"op": "upload", "kind": "bytes", "id": "b", "blob": sha(blob)},
        {"op": "upload", "kind": "module", "id": "m", "source": "import hashlib\ndef main(b):\n    return hashlib.sha256(b).hexdigest()\n"},
        {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "main"},
        {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [{"$ref": "b"}]},
        {"op": "return", "key": "h", "value": {"$ref": "r"}},
    ]}
    first = post_program(cpu_server.url, prog)
    assert first.status_code == 200
    body = first.json()
    assert body["status"] == "CACHE_MISS" and body["missing_blobs"] == [sha(blob)]
    second = post_program(cpu_server.url, prog, {sha(blob): blob})
    assert second.json()["status"] == "COMPLETED"
    assert second.json()["results"]["h"] == {"type": "string", "value": sha(blob)}
    third = post_program(cpu_server.url, prog)  # now cached
    assert third.json()["status"] == "COMPLETED"
    assert third.headers["X-Request-ID"] == third.json()["request_id"]


def test_client_resends_missing_blobs_and_reports_timings(client: Client) -> None:
    big = np.random.default_rng(1).bytes(300_000)  # above the inline limit: goes after CACHE_MISS
    p = function_program("def main(b):\n    return len(b)\n")
    p2 = Program()
    mod = p2.upload(kind="module", source="def main(b):\n    return len(b)\n")
    p2.return_(key="out", value=p2.run(fn=p2.get_function(module=mod, name="main"), args=[big]))
    res = client.execute(p2, timeout_seconds=30).raise_for_failure()
    assert res.results["out"] == 300_000
    assert res.request_id and res.elapsed_ms > 0 and res.queue_ms >= 0
    assert res.lease_wait_ms == 0 and res.lease_held_ms == 0  # CPU server: no GPU lease
    assert p.instructions  # the helper built a valid program too


def test_digest_mismatch_is_detected_by_the_decoder() -> None:
    sink = PartSink()
    node = encode_value({"b": b"data"}, sink)
    parts = {name: bytes(data) for name, data in sink.parts}
    assert decode_value(node, parts) == {"b": b"data"}
    parts["return:0"] = b"tampered"
    with pytest.raises(WireError, match="digest mismatch"):
        decode_value(node, parts)


def test_returns_before_a_failure_keep_their_results(client: Client) -> None:
    p = Program()
    mod = p.upload(kind="module", source="def ok():\n    return 'checkpoint'\ndef bad():\n    raise ValueError('boom')\n")
    p.return_(key="first", value=p.run(fn=p.get_function(module=mod, name="ok")))
    p.run(fn=p.get_function(module=mod, name="bad"))
    res = client.execute(p, timeout_seconds=30)
    assert res.status == "FAILED"
    assert res.results == {"first": "checkpoint"}
    assert res.error.kind == "engine" and "boom" in res.error.message  # program exceptions, as released
    assert res.error.instruction_index == 5 and res.error.instruction_op == "run" and res.error.instruction_id == "run_5"
    assert "ValueError" in res.error.traceback
    with pytest.raises(RemoteError) as info:
        res.raise_for_failure()
    assert info.value.kind == "engine"


def test_failure_kinds_parse_serialization_library(client: Client) -> None:
    p = Program()
    p.upload(kind="module", source="def broken(:\n")
    res = client.execute(p, timeout_seconds=30)
    assert res.error.kind == "parse" and res.error.instruction_index == 0
    res = client.execute(function_program("def main():\n    return float('nan')\n"), timeout_seconds=30)
    assert res.error.kind == "serialization"
    res = client.execute(function_program("def main():\n    return object()\n"), timeout_seconds=30)
    assert res.error.kind == "serialization"
    p = Program()
    p.upload(kind="library", value=b"\x7fELF")
    res = client.execute(p, timeout_seconds=30)
    assert res.error.kind == "unavailable"


def test_unknown_builtin_is_unavailable(client: Client) -> None:
    p = Program()
    p.run(fn="builtin.no_such_thing")
    res = client.execute(p, timeout_seconds=30)
    assert res.status == "FAILED" and res.error.kind == "unavailable"


def test_health_and_target(client: Client, cpu_server) -> None:
    h = client.health()
    assert h["status"] == "ok" and h["gpu_count"] == 0 and h["target"] == {}
    assert {w["worker_id"] for w in h["workers"]} == {"cpu/w0", "cpu/w1"}
    assert client.target() == {}
    assert h["instance_id"] == cpu_server.instance_id
    assert json.loads(json.dumps(h)) == h


def test_unreachable_server_is_a_transport_error() -> None:
    import socket

    from kcoral import TransportError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", retries=2) as c, pytest.raises(TransportError) as info:
        c.execute(function_program("def main():\n    return 1\n"), timeout_seconds=5)
    assert info.value.kind == "transport"
