"""Helpers a program can import on the server: `from kcoral.builtins import benchmark`.

Programs written for the released KCoral server import this module inside their workers;
ours offers the same names. The server's worker installs the implementations it has
(`install`); elsewhere, and for what this server cannot offer (TVM), a call fails with an
`ExecutionError` whose `kind` becomes the program's FAILED kind.
"""
from __future__ import annotations

from typing import Any, Callable

from kcoral.protocol.error_kind import ErrorKind

__all__ = ["ExecutionError", "benchmark", "compile_tirx"]

# (fn, args, {"warmup_ms", "rep_ms", "flush_l2"}) -> latency stats, set by the worker.
BenchmarkImpl = Callable[[Any, list[Any], dict[str, Any]], dict[str, Any]]
_benchmark_impl: BenchmarkImpl | None = None

_CONFIG_KEYS = frozenset({"warmup_ms", "repeat_ms", "flush_l2", "warmup", "repeat"})


class ExecutionError(Exception):
    """Ends the program FAILED with `kind` (a protocol error kind)."""

    def __init__(self, kind: ErrorKind | str, message: str) -> None:
        super().__init__(message)
        self.kind = ErrorKind.of(kind)


def install(benchmark_impl: BenchmarkImpl) -> None:
    global _benchmark_impl
    _benchmark_impl = benchmark_impl


def benchmark(fn: Any, *rest: Any) -> dict[str, Any]:
    """Time `fn(*args)`; `rest` is the arguments, optionally followed by a config dict
    (`warmup_ms`, default 25; `repeat_ms`, default 100; `flush_l2`, default true).

    Returns `latency_ms_median/mean/min/max`, `flush_l2` and `repeat` (timed calls).
    Explicit `warmup`/`repeat` counts are not offered (FAILED `unavailable`).
    """
    args, cfg = (list(rest[:-1]), rest[-1]) if rest and isinstance(rest[-1], dict) else (list(rest), {})
    if not callable(fn):
        raise ExecutionError(ErrorKind.RUNTIME, "benchmark expects a callable")
    unknown = set(cfg) - _CONFIG_KEYS
    if unknown:
        raise ExecutionError(ErrorKind.RUNTIME, f"benchmark: unknown config keys {sorted(unknown)}")
    if "warmup" in cfg or "repeat" in cfg:
        raise ExecutionError(ErrorKind.UNAVAILABLE, "benchmark: explicit warmup/repeat counts are not offered; "
                             "use warmup_ms/repeat_ms")
    if _benchmark_impl is None:
        raise ExecutionError(ErrorKind.UNAVAILABLE, "benchmark runs only inside a KCoral worker")
    flush = bool(cfg.get("flush_l2", True))
    opts = {"warmup_ms": float(cfg.get("warmup_ms", 25)), "rep_ms": float(cfg.get("repeat_ms", 100)),
            "flush_l2": flush}
    stats = dict(_benchmark_impl(fn, args, opts))
    stats["flush_l2"] = flush
    stats["repeat"] = stats.pop("samples", None)
    return stats


def compile_tirx(fn: Any, bindings: Any = None) -> Any:
    raise ExecutionError(ErrorKind.UNAVAILABLE, "compile_tirx needs TVM, which this server does not offer")
