"""Host side of IKET (in-kernel event tracing) for the KDA candidates.

With ``IKET=1`` in the environment a candidate compiles its kernels with ``-DIKET=1``,
gives each traced module a buffer through :class:`IketTracer`, and after each call
writes ``$IKET_OUT/<kernel>.iket.bin`` (``uint64 capacity, uint64 count`` then
``capacity`` 32-byte records, little-endian; ``count`` past ``capacity`` says how many were
dropped) and ``$IKET_OUT/<kernel>.iket.json``.

On the device the records go to the shares of IKET_SHARDS counters (iket.cuh); the buffer
holds ROOM times the capacity asked for, so that an uneven spread over the shares drops
nothing, and the dump gathers the shares into the file above.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy

try:
    import cupy
except ImportError:  # reading dumped records needs no GPU
    cupy = None

HEADER_BYTES = 16
RECORD_BYTES = 32
ROOM = 1.5   # device records per record asked for: the shares fill unevenly
SHARDS = 64  # the device's counters, passed to it as IKET_SHARDS (iket.cuh)


def enabled() -> bool:
    return os.environ.get("IKET") == "1"


def defines() -> tuple[str, ...]:
    return ("IKET=1", f"IKET_SHARDS={SHARDS}") if enabled() else ()


class IketTracer:
    """One kernel's record buffer, bound to the ``iket_buffer`` and ``iket_counts`` globals
    of its module."""

    def __init__(self, module: cupy.RawModule, kernel: str, stages: dict[int, str],
                 warp_roles: dict[int, str], chunk_stage: str, capacity: int | None = None):
        # $IKET_CAPACITY records (default 2^18, 8 MiB in the file) unless the caller says otherwise
        capacity = capacity or int(os.environ.get("IKET_CAPACITY", 1 << 18))
        self.kernel = kernel
        self.capacity = capacity
        self.meta = {
            "kernel": kernel,
            "stages": {str(k): v for k, v in stages.items()},
            "warp_roles": {str(k): v for k, v in warp_roles.items()},
            "chunk_stage": chunk_stage,
        }
        # the module was compiled with defines(): its IKET_SHARDS counters are SHARDS
        self._counts = cupy.ndarray((SHARDS,), cupy.uint64, module.get_global("iket_counts"))
        self.share = math.ceil(capacity * ROOM / SHARDS)
        self.buffer = cupy.zeros(HEADER_BYTES + RECORD_BYTES * self.share * SHARDS, dtype=cupy.uint8)
        self._header = cupy.asarray(numpy.array([self.share * SHARDS, 0], dtype="<u8").view(numpy.uint8))
        slot = module.get_global("iket_buffer")
        cupy.ndarray((1,), cupy.uint64, slot)[...] = self.buffer.data.ptr
        self.reset()

    def reset(self) -> None:
        """Empty the buffer (on the current stream, ahead of the traced launch)."""
        self.buffer[:HEADER_BYTES] = self._header
        self._counts[...] = 0

    def dump(self, out_dir: str | os.PathLike | None = None) -> Path:
        out = Path(out_dir or os.environ.get("IKET_OUT", "."))
        out.mkdir(parents=True, exist_ok=True)
        cupy.cuda.get_current_stream().synchronize()
        data = gather_shares(self.buffer.get().tobytes(), self._counts.get(), self.share, self.capacity)
        (out / f"{self.kernel}.iket.bin").write_bytes(data)
        (out / f"{self.kernel}.iket.json").write_text(json.dumps(self.meta, indent=1))
        return out


def gather_shares(raw: bytes, counts: numpy.ndarray, share: int, capacity: int) -> bytes:
    """The dump file of a device buffer ``raw`` whose share s (``share`` records from record
    s * share) had ``counts[s]`` records asked of it: the stored records in share order, at
    most ``capacity``, then zeros up to the header's capacity. Where records were lost (a
    full share, or more than ``capacity``) the header says so as a full buffer does: its
    capacity is the records kept, its count those plus the lost."""
    parts, asked = [], 0
    for s, n in enumerate(int(c) for c in counts):
        kept = min(n, share)
        start = HEADER_BYTES + s * share * RECORD_BYTES
        parts.append(raw[start:start + kept * RECORD_BYTES])
        asked += n
    records = b"".join(parts)[:capacity * RECORD_BYTES]
    kept = len(records) // RECORD_BYTES
    lost = asked - kept
    header = (capacity, kept) if lost == 0 else (kept, kept + lost)
    pad = bytes(RECORD_BYTES * (header[0] - kept))
    return numpy.array(header, dtype="<u8").tobytes() + records + pad


def read_records(path: str | os.PathLike) -> numpy.ndarray:
    """The records of a dumped ``.iket.bin`` as a structured array."""
    raw = Path(path).read_bytes()
    capacity, count = numpy.frombuffer(raw[:HEADER_BYTES], "<u8")
    dtype = numpy.dtype([("cta", "<u4"), ("warp", "<u4"), ("stage", "<u4"), ("seq", "<u4"),
                         ("start_ns", "<u8"), ("end_ns", "<u8")])
    n = int(min(count, capacity))
    return numpy.frombuffer(raw[HEADER_BYTES:HEADER_BYTES + n * RECORD_BYTES], dtype)
