"""GPU-only compatibility: torch tensors for released programs, CUDA faults as `runtime`
(skipped without CuPy and a CUDA GPU; the torch check also without torch)."""
from __future__ import annotations

import importlib.util
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.gpu import gpu_available

from kcoral import Client, Program
from kcoral.extensions import HEADER, OptIn
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.strict_json import dumps
from tests.kcoral_server.helpers import sha
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.gpu



if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)

KIND = ("def kind(x):\n    return [type(x).__module__.split('.')[0], str(getattr(x, 'device', ''))]\n"
        "def double(x):\n    return x * 2\n")
FAULT = ("import cupy\n"
         "K = cupy.RawKernel(r'extern \"C\" __global__ void f(int* p) { *(int*)0x10 = 1; }', 'f')\n"
         "def main():\n    K((1,), (1,), (cupy.zeros(1, cupy.int32),))\n    cupy.cuda.Device().synchronize()\n")


@pytest.fixture(scope="module")
def gpu_server() -> Iterator[ServerProcess]:
    with ServerProcess(["--gpus", "0"], startup_timeout=120) as srv:
        yield srv


def _tensor_program() -> tuple[dict, dict[str, bytes]]:
    data = np.arange(4, dtype=np.float32).tobytes()
    program = {"instructions": [
        {"op": "upload", "kind": "module", "id": "m", "source": KIND},
        {"op": "upload", "kind": "tensor", "id": "t", "blob": sha(data), "dtype": "float32", "shape": [4]},
        {"op": "get_function", "id": "k", "module": {"$ref": "m"}, "name": "kind"},
        {"op": "get_function", "id": "d", "module": {"$ref": "m"}, "name": "double"},
        {"op": "run", "id": "kind", "fn": {"$ref": "k"}, "args": [{"$ref": "t"}]},
        {"op": "run", "id": "twice", "fn": {"$ref": "d"}, "args": [{"$ref": "t"}]},
        {"op": "return", "key": "kind", "value": {"$ref": "kind"}},
        {"op": "return", "key": "twice", "value": {"$ref": "twice"}},
    ]}
    return program, {sha(data): data}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch on the GPU worker")
def test_released_programs_get_and_return_torch_cuda_tensors(gpu_server: ServerProcess) -> None:
    program, blobs = _tensor_program()
    parts = [("program", "application/json", dumps(program))]
    parts += [(f"blob:{d}", "application/octet-stream", b) for d, b in blobs.items()]
    ctype, chunks = encode_multipart(parts, part_lengths=False)
    r = httpx.post(f"{gpu_server.url}/execute", content=b"".join(bytes(c) for c in chunks),
                   headers={"Content-Type": ctype}, timeout=120)
    assert r.status_code == 200 and b'"COMPLETED"' in r.content
    assert b'"torch"' in r.content and b"cuda" in r.content
    with_opt_in = httpx.post(f"{gpu_server.url}/execute", content=b"".join(bytes(c) for c in chunks),
                             headers={"Content-Type": ctype, HEADER: OptIn.CUPY_TENSORS.value}, timeout=120)
    assert b'"cupy"' in with_opt_in.content


def test_cuda_faults_are_runtime(gpu_server: ServerProcess) -> None:
    p = Program()
    mod = p.upload(kind="module", source=FAULT)
    p.run(fn=p.get_function(module=mod, name="main"))
    with Client(gpu_server.url) as c:
        res = c.execute(p, timeout_seconds=120)
    assert res.status == "FAILED" and res.error.kind == "runtime"
    assert set(res.error.model_dump()) >= {"kind", "message", "traceback"}
