"""CuPy builtins for GPU workers.

Imported only in a worker whose CUDA_VISIBLE_DEVICES the server fixed to its one GPU
before CuPy loads, so device 0 here is the leased GPU.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kcoral.values import numpy_dtype

from ..failures import CompileFailure, Unavailable
from . import Builtin, CudaSource
from .common import (alloc_args, bench_call_args, bench_options, closeness, latency_stats, repetitions,
                     require_close, tolerances)

try:
    import cupy as cp
except Exception as exc:  # noqa: BLE001 - any import failure means no CuPy here
    cp = None
    _IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    _IMPORT_ERROR = ""


def _cupy() -> Any:
    if cp is None:
        raise Unavailable(f"CuPy is not usable on this worker ({_IMPORT_ERROR})")
    return cp


class CudaKernel:
    """A compiled kernel; call as kernel(grid, block, *args, shared_mem=0).

    Python ints pass as int32 and floats as float32 (the usual `int n` / `float x`
    kernel parameters); pass NumPy scalars through a module for other widths.
    """

    def __init__(self, kernel: Any, name: str) -> None:
        self._kernel = kernel
        self.name = name

    def __call__(self, grid: Any, block: Any, *args: Any, shared_mem: int = 0) -> None:
        self._kernel(_dim3(grid), _dim3(block), tuple(_kernel_arg(a) for a in args), shared_mem=shared_mem)

    def __repr__(self) -> str:
        return f"<CudaKernel {self.name}>"


def _dim3(v: Any) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,)
    if isinstance(v, (list, tuple)) and 1 <= len(v) <= 3 and all(isinstance(x, int) for x in v):
        return tuple(v)
    raise TypeError(f"grid/block must be an int or a list of 1-3 ints, got {v!r}")


def _kernel_arg(a: Any) -> Any:
    if isinstance(a, bool):
        return np.bool_(a)
    if isinstance(a, int):
        return np.int32(a)
    if isinstance(a, float):
        return np.float32(a)
    if isinstance(a, np.ndarray):
        return _cupy().asarray(a)
    return as_cupy(a)


def as_cupy(a: Any) -> Any:
    """A torch CUDA tensor (what tensor uploads are where torch exists) as a zero-copy CuPy view."""
    if type(a).__module__.split(".")[0] == "torch" and getattr(a, "is_cuda", False):
        return _cupy().from_dlpack(a.detach())
    return a


def empty(*args: Any) -> Any:
    shape, dtype, _ = alloc_args("empty", args)
    return _cupy().empty(shape, dtype=numpy_dtype(dtype))


def zeros(*args: Any) -> Any:
    shape, dtype, _ = alloc_args("zeros", args)
    return _cupy().zeros(shape, dtype=numpy_dtype(dtype))


def randn(*args: Any) -> Any:
    shape, dtype, seed = alloc_args("randn", args)
    xp = _cupy()
    rng = xp.random.default_rng(seed)
    return rng.standard_normal(shape, dtype=xp.float32).astype(numpy_dtype(dtype))


def compile_cuda(module: Any, opts: Any = None) -> CudaKernel:
    xp = _cupy()
    source = module.source if isinstance(module, CudaSource) else module
    if not isinstance(source, str):
        raise TypeError("compile_cuda: first argument must be a CUDA module upload")
    opts = {} if opts is None else opts
    if isinstance(opts, str):
        opts = {"name": opts}
    if not isinstance(opts, dict) or not isinstance(opts.get("name"), str):
        raise TypeError('compile_cuda: second argument must be {"name": kernel, "options": [...]}')
    unknown = set(opts) - {"name", "options"}
    if unknown:
        raise TypeError(f"compile_cuda: unknown keys {sorted(unknown)}")
    options = opts.get("options", [])
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise TypeError("compile_cuda: options must be a list of strings")
    try:
        mod = xp.RawModule(code=source, options=tuple(options))
        kernel = mod.get_function(opts["name"])
    except xp.cuda.compiler.CompileException as exc:
        raise CompileFailure(str(exc)) from None
    return CudaKernel(kernel, opts["name"])


def benchmark(fn: Any, args_list: Any = None, opts: Any = None) -> dict[str, Any]:
    """CUDA-event timing: optional L2 flush (a write of 2x L2) before every timed call,
    events enqueued back to back, one synchronisation at the end."""
    xp = _cupy()
    warmup_ms, rep_ms, flush = bench_options(opts)
    args = bench_call_args(fn, args_list)
    dev = xp.cuda.Device()
    l2 = int(dev.attributes.get("L2CacheSize", 64 << 20))
    cache = xp.empty(max(2 * l2, 1 << 20) // 4, dtype=xp.int32) if flush else None
    fn(*args)
    dev.synchronize()
    start, end = xp.cuda.Event(), xp.cuda.Event()
    start.record()
    for _ in range(5):
        if cache is not None:
            cache.fill(0)
        fn(*args)
    end.record()
    end.synchronize()
    estimate = xp.cuda.get_elapsed_time(start, end) / 5
    for _ in range(repetitions(warmup_ms, estimate, cap=1000) if warmup_ms > 0 else 0):
        fn(*args)
    n = repetitions(rep_ms, estimate)
    starts = [xp.cuda.Event() for _ in range(n)]
    ends = [xp.cuda.Event() for _ in range(n)]
    for i in range(n):
        if cache is not None:
            cache.fill(0)
        starts[i].record()
        fn(*args)
        ends[i].record()
    ends[-1].synchronize()
    return latency_stats([xp.cuda.get_elapsed_time(s, e) for s, e in zip(starts, ends, strict=True)])


def check_close(a: Any, b: Any, opts: Any = None) -> dict[str, Any]:
    rtol, atol = tolerances(opts)
    return closeness(_cupy(), as_cupy(a), as_cupy(b), rtol, atol)


def assert_close(a: Any, b: Any, opts: Any = None) -> dict[str, Any]:
    return require_close(check_close(a, b, opts))


def builtins() -> dict[str, Builtin]:
    return {
        "empty": Builtin(empty, True),
        "zeros": Builtin(zeros, True),
        "randn": Builtin(randn, True),
        "compile_cuda": Builtin(compile_cuda, True),
        "benchmark": Builtin(benchmark, True),
        "check_close": Builtin(check_close, True),
        "assert_close": Builtin(assert_close, True),
    }
