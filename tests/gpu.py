"""Whether this machine can run the GPU tests (CI has no GPU: they skip there)."""
from __future__ import annotations


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: all mean "skip"
        return False
