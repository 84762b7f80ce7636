"""Our client and `kcoral` tools against stock KCoral servers (released 0.1.0 and 0.1.1,
CPU mode), one check per difference between the released protocol and ours.

The released wheels come from PyPI (cached; see stock_for_client.py): without network
the session fixture fails and says so.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

from kcoral import Client, Program
from kcoral.cli import main
from kcoral.errors import UnsupportedByServer
from kcoral.protocol.multipart import parse_multipart
from kcoral.protocol.strict_json import loads_strict
from tests.kcoral.compat.stock_for_client import STOCK_VERSIONS, StockServer, install

REPO = Path(__file__).resolve().parents[3]
WORKLOAD = REPO / "kcoral" / "workloads" / "kda" / "forward_cpu_small"
MODULE = '''
import os

def kinds(*args):
    return [type(a).__name__ for a in args]

def read(path):
    with open(path) as fh:
        return fh.read()

def make_dir():
    os.makedirs("made/sub", exist_ok=True)
    with open("made/sub/x.txt", "w") as fh:
        fh.write("x")
    return "made"

def array():
    import numpy
    return numpy.zeros(2)
'''


@pytest.fixture(scope="session", params=STOCK_VERSIONS)
def stock(request: pytest.FixtureRequest) -> Iterator[StockServer]:
    try:
        paths = install(request.param)
    except RuntimeError as exc:
        pytest.fail(str(exc))
    server = StockServer(request.param, paths)
    # Our editable `kcoral` must not shadow the released one in the server's interpreter.
    imported = server.python("import kcoral, fastapi; print(kcoral.__file__)")
    assert imported.startswith(str(paths[0])), imported
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def client(stock: StockServer) -> Iterator[Client]:
    with Client(stock.url, token="") as c:
        yield c


def _sent_programs(client: Client) -> list[dict[str, Any]]:
    """Record the program JSON of every /execute request the client makes."""
    sent: list[dict[str, Any]] = []

    def hook(request: httpx.Request) -> None:
        if request.url.path == "/execute":
            for part in parse_multipart(request.read(), request.headers["Content-Type"]):
                if part.name == "program":
                    sent.append(loads_strict(bytes(part.data)))

    client._http.event_hooks["request"].append(hook)
    return sent


def _module_program() -> tuple[Program, Any]:
    p = Program()
    return p, p.upload(kind="module", source=MODULE)


def test_detects_stock_server(client: Client, stock: StockServer) -> None:
    caps = client.capabilities()
    assert not caps.ours and caps.stock_version == stock.version and not caps.extensions
    assert client.max_timeout() == 900.0 and caps.has_gpu is False


def test_status_reads_stock_health(stock: StockServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--remote", stock.url]) == 0
    line = capsys.readouterr().out
    assert line.startswith("load=0 queue=0 ") and "server=stock" in line and "/2 busy" in line


def test_file_upload_id_by_version(client: Client, stock: StockServer) -> None:
    sent = _sent_programs(client)
    p, mod = _module_program()
    p.upload(kind="file", value=b"hello", path="data/in.txt")
    out = p.run(p.get_function(mod, "read"), ["data/in.txt"])
    p.return_("text", out)
    p.return_("file", kind="file", path="data/in.txt")
    outcome = client.execute(p).raise_for_failure()
    assert outcome.results["text"] == "hello" and outcome.results["file"].data == b"hello"
    file_ins = next(i for i in sent[-1]["instructions"] if i.get("kind") == "file")
    assert ("id" in file_ins) == (stock.version != "0.1.0")  # 0.1.1 needs it, 0.1.0 refuses it


def test_folder_return_by_concrete_path(client: Client) -> None:
    p, mod = _module_program()
    made = p.run(p.get_function(mod, "make_dir"))
    p.return_("by_name", kind="folder", path="made")
    p.return_("by_ref", kind="folder", path=made)
    outcome = client.execute(p).raise_for_failure()
    for key in ("by_name", "by_ref"):
        assert outcome.results[key].files["sub/x.txt"] == b"x"
    dot = Program()
    dot.return_("all", kind="folder", path=".")
    with pytest.raises(UnsupportedByServer, match="whole workspace"):
        client.execute(dot)


def test_builtins_refused_before_sending(client: Client) -> None:
    sent = _sent_programs(client)
    p = Program()
    p.return_("z", p.run("builtin.zeros", [[4], "float32"]))
    with pytest.raises(UnsupportedByServer, match="no builtin.zeros"):
        client.execute(p)
    assert sent == []


def test_cuda_source_compiled_in_a_module(client: Client) -> None:
    """A CUDA upload that builtin.compile_cuda compiles goes out as a Python module that
    compiles it with the worker's own compiler; a stock CPU worker has none and says so."""
    sent = _sent_programs(client)
    p = Program()
    src = p.upload(kind="module", source='extern "C" __global__ void k(int n) {}', language="cuda")
    kernel = p.run("builtin.compile_cuda", [src, {"name": "k"}])
    p.run(kernel, [1, 32, 7])
    outcome = client.execute(p)
    assert all("language" not in i and not isinstance(i.get("fn"), str) for i in sent[-1]["instructions"])
    assert outcome.status == "FAILED" and outcome.error is not None
    assert "needs CuPy or a CUDA build of torch" in outcome.error.message
    bare = Program()
    bare.upload(kind="module", source="__global__ void k() {}", language="cuda")
    with pytest.raises(UnsupportedByServer, match="language='cuda'"):
        client.execute(bare)


def test_extra_dtypes_refused_released_ones_sent(client: Client) -> None:
    for dtype in ("uint16", "uint32", "uint64", "complex64"):
        p = Program()
        p.upload(kind="tensor", value=np.zeros(2, dtype=dtype))
        with pytest.raises(UnsupportedByServer, match=f"dtype '{dtype}'"):
            client.execute(p)
    # A released dtype goes out; a stock CPU worker holds no tensors and says so.
    p, mod = _module_program()
    t = p.upload(kind="tensor", value=np.zeros(2, dtype=np.float32))
    p.return_("k", p.run(p.get_function(mod, "kinds"), [t]))
    outcome = client.execute(p)
    assert outcome.status == "FAILED" and outcome.error is not None
    assert outcome.error.kind == "unavailable" and "GPU" in outcome.error.message


def test_stock_cpu_worker_returns_no_arrays(client: Client) -> None:
    p, mod = _module_program()
    p.return_("a", p.run(p.get_function(mod, "array")))
    outcome = client.execute(p)
    assert outcome.status == "FAILED" and outcome.error is not None and outcome.error.kind == "serialization"


def test_nested_references_refused(client: Client) -> None:
    p, mod = _module_program()
    data = p.upload(kind="bytes", value=b"abc")
    fn = p.get_function(mod, "kinds")
    p.return_("top", p.run(fn, [data, 1, {"a": 2}]))  # top-level refs resolve on stock too
    assert client.execute(p).raise_for_failure().results["top"] == ["bytes", "int", "dict"]
    nested = Program()
    mod2 = nested.upload(kind="module", source=MODULE)
    nested.return_("n", nested.run(nested.get_function(mod2, "kinds"), [[mod2]]))
    with pytest.raises(UnsupportedByServer, match="whole arguments"):
        client.execute(nested)


def test_timeout_clamped_to_stock_ceiling(client: Client) -> None:
    sent = _sent_programs(client)
    p, mod = _module_program()
    p.return_("k", p.run(p.get_function(mod, "kinds")))
    assert client.execute(p, timeout_seconds=3000).raise_for_failure().results["k"] == []
    assert sent[-1]["options"]["timeout_seconds"] == 900.0


def test_python_tool(stock: StockServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "s.py").write_text("import sys\nopen('out.txt', 'w').write('done')\nprint('argv', sys.argv[1:])\n")
    code = main(["python", "--remote", stock.url, "--send", str(app), "--timeout", "3600", "-o", "out.txt",
                 "--output-dir", str(tmp_path / "back"), "--", "s.py", "a"])
    assert code == 0, capsys.readouterr().err
    assert "argv ['a']" in capsys.readouterr().out
    assert (tmp_path / "back" / "out.txt").read_text() == "done"


@pytest.mark.parametrize("tool", ["ncu", "iket"])
def test_gpu_tools_refused_on_stock_cpu(stock: StockServer, tmp_path: Path, tool: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    extra = ["-o", str(tmp_path / "r.ncu-rep")] if tool == "ncu" else ["--output-dir", str(tmp_path / "o")]
    code = main([tool, "--remote", stock.url, "--send", str(tmp_path), *extra, "--", "python", "x.py"])
    assert code == 125
    assert "needs a GPU" in capsys.readouterr().err


def test_bench_cpu_twin(stock: StockServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", str(WORKLOAD), "scratch/reference", "--remote", stock.url, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    assert report["passed"] and report["holdout_pass"] is True
    assert report["holdout_source"] == "client"  # no server-salted seeds on stock


def test_bench_gpu_workload_refused_on_stock_cpu(stock: StockServer, capsys: pytest.CaptureFixture[str]) -> None:
    gpu_workload = WORKLOAD.parent / "forward_b1_t8192_h96"
    code = main(["bench", str(gpu_workload), "scratch/reference", "--remote", stock.url])
    out = capsys.readouterr().out
    assert code == 125 and "result: FAIL unavailable: the workload runs on a GPU" in out


def test_version_names_the_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("kcoral (kcoral-evolve ")


@pytest.mark.gpu
def test_gpu_tools_on_stock_gpu_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kcoral iket` on a stock GPU server (one started by hand: its GPU stack is large)."""
    url = os.environ.get("KCORAL_STOCK_GPU_URL")
    if not url:
        pytest.skip("set KCORAL_STOCK_GPU_URL to a stock KCoral GPU server")
    app = REPO / "tests" / "kcoral" / "tools" / "gpu_app"
    code = main(["iket", "--remote", url, "--send", str(app), "--output-dir", str(tmp_path),
                 "--", "python", "toy_iket.py"])
    assert code == 0, capsys.readouterr().err
    assert list(tmp_path.glob("*.trace.json"))
