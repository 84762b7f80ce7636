"""Host side of IKET (in-kernel event tracing) for the KDA candidates.

With ``IKET=1`` in the environment a candidate compiles its kernels with ``-DIKET=1``,
gives each traced module a buffer through :class:`IketTracer`, and after each call
writes ``$IKET_OUT/<kernel>.iket.bin`` (the whole buffer: ``uint64 capacity, uint64
count`` then 32-byte records, little-endian) and ``$IKET_OUT/<kernel>.iket.json``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy

try:
    import cupy
except ImportError:  # reading dumped records needs no GPU
    cupy = None

HEADER_BYTES = 16
RECORD_BYTES = 32


def enabled() -> bool:
    return os.environ.get("IKET") == "1"


def defines() -> tuple[str, ...]:
    return ("IKET=1",) if enabled() else ()


class IketTracer:
    """One kernel's record buffer, bound to the ``iket_buffer`` global of its module."""

    def __init__(self, module: cupy.RawModule, kernel: str, stages: dict[int, str],
                 warp_roles: dict[int, str], chunk_stage: str, capacity: int | None = None):
        # $IKET_CAPACITY records (default 2^18, 8 MiB) unless the caller says otherwise
        capacity = capacity or int(os.environ.get("IKET_CAPACITY", 1 << 18))
        self.kernel = kernel
        self.capacity = capacity
        self.meta = {
            "kernel": kernel,
            "stages": {str(k): v for k, v in stages.items()},
            "warp_roles": {str(k): v for k, v in warp_roles.items()},
            "chunk_stage": chunk_stage,
        }
        self.buffer = cupy.zeros(HEADER_BYTES + RECORD_BYTES * capacity, dtype=cupy.uint8)
        self._header = cupy.asarray(numpy.array([capacity, 0], dtype="<u8").view(numpy.uint8))
        slot = module.get_global("iket_buffer")
        cupy.ndarray((1,), cupy.uint64, slot)[...] = self.buffer.data.ptr
        self.reset()

    def reset(self) -> None:
        """Empty the buffer (on the current stream, ahead of the traced launch)."""
        self.buffer[:HEADER_BYTES] = self._header

    def dump(self, out_dir: str | os.PathLike | None = None) -> Path:
        out = Path(out_dir or os.environ.get("IKET_OUT", "."))
        out.mkdir(parents=True, exist_ok=True)
        cupy.cuda.get_current_stream().synchronize()
        (out / f"{self.kernel}.iket.bin").write_bytes(self.buffer.get().tobytes())
        (out / f"{self.kernel}.iket.json").write_text(json.dumps(self.meta, indent=1))
        return out


def read_records(path: str | os.PathLike) -> numpy.ndarray:
    """The records of a dumped ``.iket.bin`` as a structured array."""
    raw = Path(path).read_bytes()
    capacity, count = numpy.frombuffer(raw[:HEADER_BYTES], "<u8")
    dtype = numpy.dtype([("cta", "<u4"), ("warp", "<u4"), ("stage", "<u4"), ("seq", "<u4"),
                         ("start_ns", "<u8"), ("end_ns", "<u8")])
    n = int(min(count, capacity))
    return numpy.frombuffer(raw[HEADER_BYTES:HEADER_BYTES + n * RECORD_BYTES], dtype)
