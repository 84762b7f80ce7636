"""A tiny CuPy app for the GPU tests: one kernel whose warps record IKET events with
%globaltimer, written like a candidate's host code does (when IKET=1 in the environment,
the buffer and meta pair go to $IKET_OUT). Also the "capture" app of the ncu GPU test."""
from __future__ import annotations

import json
import os

import cupy as cp
import numpy as np

SOURCE = r"""
struct IketRecord { unsigned cta, warp, stage, seq; unsigned long long start_ns, end_ns; };
struct IketBuffer { unsigned long long capacity, count; IketRecord records[1]; };

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ void record(IketBuffer* buf, unsigned stage, unsigned seq,
                       unsigned long long s, unsigned long long e) {
    if (buf == nullptr || (threadIdx.x & 31) != 0) return;
    unsigned long long i = atomicAdd(&buf->count, 1ull);
    if (i < buf->capacity) {
        IketRecord r = {blockIdx.x, threadIdx.x / 32, stage, seq, s, e};
        buf->records[i] = r;
    }
}

extern "C" __global__ void toy_chunks(const float* x, float* y, int n, int chunks,
                                      IketBuffer* buf) {
    int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int c = 0; c < chunks; ++c) {
        unsigned long long s = now_ns();
        for (int i = lane; i < n; i += 32) acc += x[i] * (c + 1);
        unsigned long long m = now_ns();
        record(buf, 0, 2 * c, s, m);
        for (int i = lane; i < n; i += 32) acc = acc * 0.5f + x[(i * 7) % n];
        record(buf, 1, 2 * c + 1, m, now_ns());
    }
    y[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""

CTAS, WARPS, CHUNKS, N = 4, 4, 32, 4096


def main() -> None:
    kernel = cp.RawKernel(SOURCE, "toy_chunks")
    x = cp.arange(N, dtype=cp.float32) / N
    y = cp.zeros(CTAS * WARPS * 32, dtype=cp.float32)
    tracing = os.environ.get("IKET") == "1"
    capacity = CTAS * WARPS * CHUNKS * 2 + 16
    buf = None
    if tracing:
        buf = cp.zeros(16 + 32 * capacity, dtype=cp.uint8)
        buf[:8] = cp.asarray(np.frombuffer(np.uint64(capacity).tobytes(), dtype=np.uint8))
    ptr = np.uint64(buf.data.ptr if buf is not None else 0)
    kernel((CTAS,), (WARPS * 32,), (x, y, np.int32(N), np.int32(CHUNKS), ptr))
    cp.cuda.runtime.deviceSynchronize()
    print("toy_chunks ran, checksum", float(y.sum()))
    if tracing:
        out = os.environ["IKET_OUT"]
        with open(os.path.join(out, "toy_chunks.iket.bin"), "wb") as fh:
            fh.write(cp.asnumpy(buf).tobytes())
        with open(os.path.join(out, "toy_chunks.iket.json"), "w") as fh:
            json.dump({"kernel": "toy_chunks", "stages": {"0": "load", "1": "mix"},
                       "warp_roles": {str(w): "worker" for w in range(WARPS)},
                       "chunk_stage": "load"}, fh)


if __name__ == "__main__":
    main()
