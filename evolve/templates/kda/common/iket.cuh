// In-kernel event tracing (IKET). With -DIKET=1 lane 0 of each warp appends one
// 32-byte record per traced stage to a global buffer set by the host through the
// module global `iket_buffer`; without IKET every macro expands to nothing, so the
// traced kernel is the untraced one.
//
//   IKET_BEGIN(t0);               // read %globaltimer into a local
//   ... stage ...
//   IKET_END(t0, STAGE_ID, seq);  // record (cta, warp, stage, seq, start, end)
//
// The records are spread over IKET_SHARDS counters (`iket_counts`) by a hash of the warp's
// global index, each counter owning an equal share of the buffer: one counter for every
// record of a call made them queue at one address (the fused kernel's 983,040 records a
// call slowed it by 40 %). The host sizes the shares with room for an uneven spread and
// gathers them into one run of records on dump (iket_host.py): the file is laid out as before.
#pragma once

#ifdef IKET
#ifndef IKET_SHARDS
#define IKET_SHARDS 64   // iket_host.py passes its own count (SHARDS)
#endif
struct IketRecord {
    unsigned cta, warp, stage, seq;
    unsigned long long start_ns, end_ns;
};
struct IketBuffer {
    unsigned long long capacity;   // records in all shares (the device's buffer)
    unsigned long long count;      // 0 on the device: the host writes it on dump
    IketRecord records[1];         // `capacity` records follow the header, share s from s * (capacity / IKET_SHARDS)
};

__device__ IketBuffer* iket_buffer;
__device__ unsigned long long iket_counts[IKET_SHARDS];   // records asked of each share (past its size: dropped)

__device__ __forceinline__ unsigned long long iket_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ void iket_record(unsigned long long start, unsigned stage, unsigned seq) {
    unsigned long long end = iket_now();
    IketBuffer* buf = iket_buffer;
    if (buf == nullptr || (threadIdx.x & 31) != 0) return;
    const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned warps = (blockDim.x * blockDim.y * blockDim.z + 31) >> 5;
    // Fibonacci hashing: warps of one role (as many records each) land in every share alike
    const unsigned shard = (((cta * warps + (threadIdx.x >> 5)) * 2654435761u) >> 16) % IKET_SHARDS;
    const unsigned long long share = buf->capacity / IKET_SHARDS;
    unsigned long long i = atomicAdd(&iket_counts[shard], 1ull);
    if (i >= share) return;   // its share is full: the count still says how many were dropped
    IketRecord r;
    r.cta = cta;
    r.warp = threadIdx.x >> 5;
    r.stage = stage;
    r.seq = seq;
    r.start_ns = start;
    r.end_ns = end;
    buf->records[shard * share + i] = r;
}

#define IKET_BEGIN(var) unsigned long long var = iket_now()
#define IKET_END(var, stage, seq) iket_record((var), (stage), (seq))
#else
#define IKET_BEGIN(var) do { } while (0)
#define IKET_END(var, stage, seq) do { } while (0)
#endif
