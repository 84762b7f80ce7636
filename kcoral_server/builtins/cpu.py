"""NumPy builtins for CPU workers (and virtual-GPU workers in tests)."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from kcoral.values import numpy_dtype

from ..failures import Unavailable
from . import Builtin
from .common import (alloc_args, bench_call_args, bench_options, closeness, latency_stats, repetitions,
                     require_close, tolerances)


def empty(*args: Any) -> np.ndarray:
    shape, dtype, _ = alloc_args("empty", args)
    return np.empty(shape, dtype=numpy_dtype(dtype))


def zeros(*args: Any) -> np.ndarray:
    shape, dtype, _ = alloc_args("zeros", args)
    return np.zeros(shape, dtype=numpy_dtype(dtype))


def randn(*args: Any) -> np.ndarray:
    shape, dtype, seed = alloc_args("randn", args)
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape, dtype=np.float64).astype(numpy_dtype(dtype))


def compile_cuda(*_args: Any) -> Any:
    raise Unavailable("compile_cuda needs a GPU worker with CuPy; this worker has no GPU")


def benchmark(fn: Any, args_list: Any = None, opts: Any = None) -> dict[str, Any]:
    """Wall-clock timing with perf_counter (no L2 to flush on a CPU worker)."""
    warmup_ms, rep_ms, _flush = bench_options(opts)
    args = bench_call_args(fn, args_list)
    t0 = time.perf_counter()
    fn(*args)
    estimate = (time.perf_counter() - t0) * 1e3
    end = time.perf_counter() + warmup_ms / 1e3
    while time.perf_counter() < end:
        fn(*args)
    samples = []
    for _ in range(repetitions(rep_ms, estimate)):
        t = time.perf_counter()
        fn(*args)
        samples.append((time.perf_counter() - t) * 1e3)
    return latency_stats(samples)


def check_close(a: Any, b: Any, opts: Any = None) -> dict[str, Any]:
    rtol, atol = tolerances(opts)
    return closeness(np, a, b, rtol, atol)


def assert_close(a: Any, b: Any, opts: Any = None) -> dict[str, Any]:
    return require_close(check_close(a, b, opts))


def builtins() -> dict[str, Builtin]:
    gpu = True  # on a virtual-GPU worker these stand in for device work, so they take the lease
    return {
        "empty": Builtin(empty, gpu),
        "zeros": Builtin(zeros, gpu),
        "randn": Builtin(randn, gpu),
        "compile_cuda": Builtin(compile_cuda, False),
        "benchmark": Builtin(benchmark, gpu),
        "check_close": Builtin(check_close, gpu),
        "assert_close": Builtin(assert_close, gpu),
    }
