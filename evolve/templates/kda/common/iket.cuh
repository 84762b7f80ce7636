// In-kernel event tracing (IKET). With -DIKET=1 lane 0 of each warp appends one
// 32-byte record per traced stage to a global buffer set by the host through the
// module global `iket_buffer`; without IKET every macro expands to nothing, so the
// traced kernel is the untraced one.
//
//   IKET_BEGIN(t0);               // read %globaltimer into a local
//   ... stage ...
//   IKET_END(t0, STAGE_ID, seq);  // record (cta, warp, stage, seq, start, end)
#pragma once

#ifdef IKET
struct IketRecord {
    unsigned cta, warp, stage, seq;
    unsigned long long start_ns, end_ns;
};
struct IketBuffer {
    unsigned long long capacity;
    unsigned long long count;
    IketRecord records[1];   // `capacity` records follow the header
};

__device__ IketBuffer* iket_buffer;

__device__ __forceinline__ unsigned long long iket_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void iket_record(unsigned long long start, unsigned stage, unsigned seq) {
    unsigned long long end = iket_now();
    IketBuffer* buf = iket_buffer;
    if (buf == nullptr || (threadIdx.x & 31) != 0) return;
    unsigned long long i = atomicAdd(&buf->count, 1ull);
    if (i >= buf->capacity) return;   // full: `count` still says how many were dropped
    IketRecord r;
    r.cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    r.warp = threadIdx.x >> 5;
    r.stage = stage;
    r.seq = seq;
    r.start_ns = start;
    r.end_ns = end;
    buf->records[i] = r;
}

#define IKET_BEGIN(var) unsigned long long var = iket_now()
#define IKET_END(var, stage, seq) iket_record((var), (stage), (seq))
#else
#define IKET_BEGIN(var) do { } while (0)
#define IKET_END(var, stage, seq) do { } while (0)
#endif
