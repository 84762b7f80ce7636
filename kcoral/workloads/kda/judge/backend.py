"""Array backend: NumPy on a CPU workload, CuPy on a CUDA one, behind one small surface.

bf16 tensors carry ml_dtypes.bfloat16 (CuPy 14 understands it); conversions go through
the uint16 bit pattern so they work the same on both modules.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_NAN_BITS = 0x7FC0


class BackendUnavailable(RuntimeError):
    """The workload needs a device this machine does not have."""


@dataclass
class Backend:
    xp: Any  # numpy or cupy
    device: str  # "cpu" or "cuda"
    name: str  # human-readable device name

    def sync(self) -> None:
        if self.device == "cuda":
            self.xp.cuda.Device().synchronize()

    def asarray(self, host: np.ndarray) -> Any:
        return self.xp.asarray(host) if self.device == "cuda" else np.ascontiguousarray(host)

    def to_host(self, arr: Any) -> np.ndarray:
        return self.xp.asnumpy(arr) if self.device == "cuda" else np.asarray(arr)

    def now(self) -> float:
        return time.perf_counter()


def make_backend(device: str) -> Backend:
    if device == "cpu":
        import platform

        return Backend(xp=np, device="cpu", name=f"cpu ({platform.processor() or platform.machine()})")
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA library that fails to load
        raise BackendUnavailable(f"CUDA workload but CuPy is not importable here: {exc}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - whatever the driver raises, there is no GPU to use
        raise BackendUnavailable(f"CUDA workload but no usable GPU: {exc}") from None
    if count < 1:
        raise BackendUnavailable("CUDA workload but no GPU is visible")
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Backend(xp=cupy, device="cuda", name=name)


def bf16_bits_from_f32(xp, x):
    """Round-to-nearest-even fp32 -> bf16 bit pattern (uint16). Inputs are finite."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounding = ((u >> 16) & 1) + xp.uint32(0x7FFF)
    return ((u + rounding) >> 16).astype(xp.uint16)


def to_bf16(xp, x):
    return bf16_bits_from_f32(xp, x).view(BF16)


def bf16_to_f32(xp, x):
    bits = xp.ascontiguousarray(x).view(xp.uint16)
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def as_f32(xp, x):
    """Any input or output tensor as fp32 (bf16 converted by bits)."""
    if x.dtype == BF16:
        return bf16_to_f32(xp, x)
    return x.astype(xp.float32)


def bits_view(xp, x):
    """An integer view for bitwise comparison (equal bits, NaNs included)."""
    width = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32, 8: xp.uint64}[x.dtype.itemsize]
    return xp.ascontiguousarray(x).view(width)


def poison(xp: Any, x: Any) -> None:
    """Fill a float buffer with NaN in place."""
    if x.dtype == BF16:
        x.view(xp.uint16).fill(BF16_NAN_BITS)
    else:
        x.fill(float("nan"))


def write_into(xp: Any, dst: Any, src: Any) -> None:
    """Overwrite dst's contents in place with src (same shape), keeping dst's dtype."""
    if dst.dtype == BF16:
        src_bits = bits_view(xp, src) if src.dtype == BF16 else bf16_bits_from_f32(xp, src)
        dst.view(xp.uint16)[...] = src_bits
    else:
        dst[...] = src


def sigmoid(xp, x):
    # tanh form: no overflow warnings for large |x|
    return 0.5 * (1.0 + xp.tanh(0.5 * x))
