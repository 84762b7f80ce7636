"""Argument parsing and statistics shared by the NumPy and CuPy builtins."""
from __future__ import annotations

import math
import statistics
from typing import Any

from kcoral.values import numpy_dtype

from ..failures import CorrectnessFailure


def alloc_args(name: str, args: tuple[Any, ...]) -> tuple[tuple[int, ...], str, int | None]:
    """(shape, dtype, seed) from `({"shape": [...], "dtype": "float32"})` or `(shape, dtype)`."""
    seed = None
    if len(args) == 1 and isinstance(args[0], dict):
        spec = dict(args[0])
        unknown = set(spec) - {"shape", "dtype", "seed"}
        if unknown:
            raise TypeError(f"builtin.{name}: unknown keys {sorted(unknown)}")
        shape, dtype, seed = spec.get("shape"), spec.get("dtype", "float32"), spec.get("seed")
    elif 1 <= len(args) <= 2:
        shape, dtype = args[0], args[1] if len(args) == 2 else "float32"
    else:
        raise TypeError(f"builtin.{name} takes ({{'shape': [...], 'dtype': ...}}) or (shape, dtype)")
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = [shape]
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise TypeError(f"builtin.{name}: shape must be a list of non-negative integers")
    if not isinstance(dtype, str):
        raise TypeError(f"builtin.{name}: dtype must be a string")
    numpy_dtype(dtype)  # validates the name
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"builtin.{name}: seed must be an integer")
    return tuple(shape), dtype, seed


def bench_options(opts: Any) -> tuple[float, float, bool]:
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise TypeError("builtin.benchmark: options must be an object")
    unknown = set(opts) - {"warmup_ms", "rep_ms", "flush_l2"}
    if unknown:
        raise TypeError(f"builtin.benchmark: unknown options {sorted(unknown)}")
    warmup = float(opts.get("warmup_ms", 25))
    rep = float(opts.get("rep_ms", 100))
    if not (0 <= warmup <= 60_000 and 0 < rep <= 600_000):
        raise ValueError("builtin.benchmark: warmup_ms must be in [0, 60000] and rep_ms in (0, 600000]")
    return warmup, rep, bool(opts.get("flush_l2", True))


def bench_call_args(fn: Any, args_list: Any) -> tuple[Any, ...]:
    if not callable(fn):
        raise TypeError("builtin.benchmark: fn is not callable")
    if args_list is None:
        return ()
    if not isinstance(args_list, (list, tuple)):
        raise TypeError("builtin.benchmark: args must be a list")
    return tuple(args_list)


def repetitions(budget_ms: float, estimate_ms: float, cap: int = 10_000) -> int:
    return max(1, min(cap, int(budget_ms / max(estimate_ms, 1e-4))))


def latency_stats(samples_ms: list[float]) -> dict[str, Any]:
    return {
        "latency_ms_median": statistics.median(samples_ms),
        "latency_ms_mean": statistics.fmean(samples_ms),
        "latency_ms_min": min(samples_ms),
        "latency_ms_max": max(samples_ms),
        "samples": len(samples_ms),
    }


def tolerances(opts: Any) -> tuple[float, float]:
    opts = {} if opts is None else opts
    if not isinstance(opts, dict):
        raise TypeError("check_close: options must be an object {rtol, atol}")
    unknown = set(opts) - {"rtol", "atol"}
    if unknown:
        raise TypeError(f"check_close: unknown options {sorted(unknown)}")
    return float(opts.get("rtol", 1e-5)), float(opts.get("atol", 1e-8))


def closeness(xp: Any, a: Any, b: Any, rtol: float, atol: float) -> dict[str, Any]:
    """Compare in float64 (complex by magnitude); NaN anywhere counts as a mismatch.

    Errors that are not finite are reported as None (JSON carries only finite numbers).
    """
    a, b = xp.asarray(a), xp.asarray(b)
    if a.shape != b.shape:
        return {"ok": False, "max_abs_err": None, "max_rel_err": None, "mismatch_fraction": 1.0,
                "message": f"shape mismatch: {tuple(a.shape)} vs {tuple(b.shape)}"}
    if a.size == 0:
        return {"ok": True, "max_abs_err": 0.0, "max_rel_err": 0.0, "mismatch_fraction": 0.0}
    ctype = xp.complex128 if (a.dtype.kind == "c" or b.dtype.kind == "c") else xp.float64
    a64, b64 = a.astype(ctype), b.astype(ctype)
    diff = xp.abs(a64 - b64)
    mag = xp.abs(b64)
    bad = ~(diff <= atol + rtol * mag)
    rel = diff / xp.maximum(mag, xp.finfo(xp.float64).tiny)
    max_abs, max_rel = float(diff.max()), float(rel.max())
    mismatch = float(bad.mean())
    return {
        "ok": mismatch == 0.0,
        "max_abs_err": max_abs if math.isfinite(max_abs) else None,
        "max_rel_err": max_rel if math.isfinite(max_rel) else None,
        "mismatch_fraction": mismatch,
    }


def require_close(report: dict[str, Any]) -> dict[str, Any]:
    """assert_close's verdict on a check_close report: raise `correctness` when it failed."""
    if not report["ok"]:
        raise CorrectnessFailure(
            report.get("message")
            or f"tensors differ: mismatch_fraction={report['mismatch_fraction']:.6g}, "
            f"max_abs_err={report['max_abs_err']}, max_rel_err={report['max_rel_err']}"
        )
    return report
