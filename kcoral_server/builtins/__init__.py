"""Builtins callable as `"fn": "builtin.<name>"`: NumPy on CPU workers, CuPy on GPU workers.

`load(backend, ctx)` returns {name: Builtin}; `needs_gpu` tells the executor to take the
GPU lease before the call (only meaningful on a GPU or virtual-GPU worker).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

MAX_HOLDOUT_SEEDS = 100_000  # per call; the server checks it again (workers run program code)


class BuiltinContext(Protocol):
    def holdout_seeds(self, namespace: str, count: int) -> list[int]: ...


class CudaSource:
    """A `language: "cuda"` module upload, kept as text for compile_cuda."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __repr__(self) -> str:
        return f"<CudaSource {len(self.source)} chars>"


@dataclass(frozen=True)
class Builtin:
    fn: Callable[..., Any]
    needs_gpu: bool


def load(backend: str, ctx: BuiltinContext) -> dict[str, Builtin]:
    if backend == "gpu":
        from . import gpu

        table = gpu.builtins()
    else:
        from . import cpu

        table = cpu.builtins()
    table["holdout_seeds"] = Builtin(lambda namespace, count: _seeds(ctx, namespace, count), needs_gpu=False)
    return table


def _seeds(ctx: BuiltinContext, namespace: Any, count: Any) -> list[int]:
    if not isinstance(namespace, str) or not namespace:
        raise TypeError("holdout_seeds(namespace, count): namespace must be a non-empty string")
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_HOLDOUT_SEEDS:
        raise TypeError(f"holdout_seeds(namespace, count): count must be an integer in [0, {MAX_HOLDOUT_SEEDS}]")
    return ctx.holdout_seeds(namespace, count)
