"""`kcoral.compat` without a server: what goes out for ours, stock 0.1.0 and 0.1.1, and
the module that compiles CUDA on a worker without our builtins (with a stand-in CuPy)."""
from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from kcoral.capabilities import UNKNOWN, ServerCapabilities
from kcoral.compat import adapt_program, cuda_module_source
from kcoral.errors import UnsupportedByServer
from kcoral.program import Program

OURS = ServerCapabilities(ours=True, extensions=frozenset({"builtins", "max_timeout_3600"}))
STOCK_010 = ServerCapabilities(ours=False, stock_version="0.1.0", gpu_count=0)
STOCK_011 = ServerCapabilities(ours=False, stock_version="0.1.1", gpu_count=1)


def _file_program() -> dict[str, Any]:
    p = Program()
    p.upload(kind="file", value=b"x", path="a.txt")
    return p.to_dict()


def test_capabilities_from_health() -> None:
    ours = ServerCapabilities.from_health({"extensions": ["builtins"], "gpu_count": 0})
    assert ours.ours and ours.has("builtins") and ours.max_timeout == 900.0
    stock = ServerCapabilities.from_health({"gpu_count": 1, "load": {}}, "0.1.1")
    assert not stock.ours and stock.has_gpu and stock.max_timeout == 900.0
    assert OURS.max_timeout == 3600.0 and UNKNOWN.max_timeout == 3600.0
    # Our server's short answer to a client without its token says nothing: change nothing.
    assert ServerCapabilities.from_health({"status": "ok", "instance_id": "x"}) is UNKNOWN


@pytest.mark.parametrize("caps,has_id", [(OURS, False), (UNKNOWN, False), (STOCK_010, False), (STOCK_011, True),
                                          (ServerCapabilities(ours=False), True)])
def test_file_upload_id(caps: ServerCapabilities, has_id: bool) -> None:
    ins = adapt_program(_file_program(), caps)["instructions"][0]
    assert ("id" in ins) == has_id


def test_unknown_server_gets_the_program_unchanged() -> None:
    p = Program()
    m = p.upload(kind="module", source="k", language="cuda")
    p.return_("k", p.run("builtin.compile_cuda", [m, {"name": "k"}]))
    p.return_("all", kind="folder", path=".")
    assert adapt_program(p.to_dict(), UNKNOWN) == p.to_dict()


def test_nested_refs_pass_on_ours_only() -> None:
    p = Program()
    m = p.upload(kind="module", source="def f(x): return x")
    p.run(p.get_function(m, "f"), [[m]])
    adapt_program(p.to_dict(), OURS)
    with pytest.raises(UnsupportedByServer):
        adapt_program(p.to_dict(), STOCK_011)


def test_cuda_module_compiles_with_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    launches: list[tuple[Any, ...]] = []

    class Kernel:
        def __call__(self, grid: Any, block: Any, args: Any) -> None:
            launches.append((grid, block, args))

    class RawModule:
        def __init__(self, code: str, options: tuple[str, ...]) -> None:
            assert "__global__" in code and options == ("-O3",)

        def get_function(self, name: str) -> Kernel:
            assert name == "k"
            return Kernel()

    fake = types.SimpleNamespace(RawModule=RawModule, ndarray=type("nd", (), {}), asarray=lambda a: ("cupy", a))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    namespace: dict[str, Any] = {}
    exec(compile(cuda_module_source('extern "C" __global__ void k(int n) {}'), "<shim>", "exec"), namespace)
    launch = namespace["compile_cuda"]({"name": "k", "options": ["-O3"]})
    launch(4, [32, 2], 7, 1.5)
    grid, block, args = launches[0]
    assert grid == (4, 1, 1) and block == (32, 2, 1)
    assert [type(a).__name__ for a in args] == ["int32", "float32"]
