"""GPU builtins with CuPy on a real GPU server (skipped without CuPy or a GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu import gpu_available

from kcoral import Client, Program
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.gpu



if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(scope="module")
def gpu_server():
    with ServerProcess(["--gpus", "0", "--workers-per-gpu", "2"], startup_timeout=120) as srv:
        yield srv


def test_health_reports_the_gpu(gpu_server) -> None:
    h = gpu_server.health()
    assert h["gpu_count"] == 1 and [(g["gpu_id"], g["lease_depth"]) for g in h["gpus"]] == [(0, 0)]
    assert 0 <= h["gpus"][0]["lease_held_s"] <= h["uptime_seconds"]
    assert h["target"].get("arch", "").startswith("sm_")


def test_cupy_allocation_and_checks(gpu_server) -> None:
    p = Program()
    z = p.run(fn="builtin.zeros", args=[{"shape": [4, 4], "dtype": "bfloat16"}])
    r = p.run(fn="builtin.randn", args=[{"shape": [1 << 16], "dtype": "float32", "seed": 3}])
    t = p.upload(kind="tensor", value=np.ones(8, np.float32))
    same = p.run(fn="builtin.check_close", args=[t, t, {"rtol": 0, "atol": 0}])
    mod = p.upload(kind="module", source="import cupy\ndef kind(x):\n    return type(x).__module__.split('.')[0]\n")
    kind = p.run(fn=p.get_function(module=mod, name="kind"), args=[t])
    for key, reg in (("z", z), ("r", r), ("same", same), ("kind", kind)):
        p.return_(key=key, value=reg)
    with Client(gpu_server.url) as c:
        out = c.execute(p, timeout_seconds=120).raise_for_failure()
    assert str(out.results["z"].dtype) == "bfloat16" and not out.results["z"].astype(np.float32).any()
    assert abs(float(out.results["r"].mean())) < 0.05
    assert out.results["same"]["ok"] is True
    assert out.results["kind"] == "cupy"
    assert out.lease_held_ms > 0 and out.gpu == 0


def test_compile_cuda_run_and_benchmark(gpu_server) -> None:
    n = 1 << 20
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    p = Program()
    src = p.upload(kind="module", source=SAXPY, language="cuda")
    kern = p.run(fn="builtin.compile_cuda", args=[src, {"name": "saxpy", "options": ["-std=c++17"]}])
    xs, ys = p.upload(kind="tensor", value=x), p.upload(kind="tensor", value=y)
    out = p.run(fn="builtin.zeros", args=[[n], "float32"])
    grid, block = [(n + 255) // 256], [256]
    p.run(fn=kern, args=[grid, block, 2.0, xs, ys, out, n])
    p.return_(key="out", value=out)
    stats = p.run(fn="builtin.benchmark", args=[kern, [grid, block, 2.0, xs, ys, out, n], {"warmup_ms": 5, "rep_ms": 20}])
    p.return_(key="stats", value=stats)
    bad = p.upload(kind="module", source="__global__ void broken( {", language="cuda")
    p.run(fn="builtin.compile_cuda", args=[bad, {"name": "broken"}])
    with Client(gpu_server.url) as c:
        res = c.execute(p, timeout_seconds=300)
    np.testing.assert_allclose(res.results["out"], 2.0 * x + y, rtol=1e-6)
    s = res.results["stats"]
    assert s["samples"] >= 1 and 0 < s["latency_ms_min"] <= s["latency_ms_median"] <= s["latency_ms_max"]
    assert res.status == "FAILED" and res.error.kind == "compile"


def test_assert_close_fails_with_correctness(gpu_server) -> None:
    p = Program()
    a = p.run(fn="builtin.zeros", args=[[16], "float32"])
    b = p.run(fn="builtin.randn", args=[[16], "float32"])
    p.run(fn="builtin.assert_close", args=[a, b, {"atol": 1e-3}])
    with Client(gpu_server.url) as c:
        res = c.execute(p, timeout_seconds=120)
    assert res.status == "FAILED" and res.error.kind == "correctness"


def test_workers_see_only_their_gpu(gpu_server) -> None:
    p = Program()
    mod = p.upload(kind="module", source=(
        "import os, cupy\n"
        "def main():\n"
        "    os.environ['CUDA_VISIBLE_DEVICES'] = '1,2,3'\n"
        "    return [os.environ.get('KCORAL_WORKER_ID'), cupy.cuda.runtime.getDeviceCount()]\n"))
    p.return_(key="out", value=p.run(fn=p.get_function(module=mod, name="main")))
    with Client(gpu_server.url) as c:
        wid, count = c.execute(p, timeout_seconds=120).raise_for_failure().results["out"]
    assert wid.startswith("gpu0/") and count == 1
