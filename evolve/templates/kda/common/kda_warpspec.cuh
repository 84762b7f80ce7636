// Helpers for warp-specialised KDA kernels: named barriers between warp roles and the
// repacking of mma accumulators into A operands (so a product's result feeds the next
// product from registers, without a trip through shared memory).
#pragma once
#include "kda_tiles.cuh"

// bar.sync / bar.arrive on hardware barrier `id` (1..15; 0 is __syncthreads) counting
// `nthreads` threads (a multiple of 32). A producer arrives (does not wait), a consumer
// syncs; completion orders the arriving threads' prior shared-memory writes before the
// waiting threads' later reads.
__device__ __forceinline__ void named_bar_sync(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(nthreads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int nthreads) {
    asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(nthreads) : "memory");
}

// The m16n8 fp32 accumulators of two adjacent n-tiles (columns 0..7 in c0, 8..15 in c1)
// hold, lane for lane, the m16k16 A fragment of the same 16 x 16 block: round to bf16.
__device__ __forceinline__ void acc_to_a(unsigned a[4], const float c0[4], const float c1[4]) {
    a[0] = pack_bf16x2(c0[0], c0[1]);
    a[1] = pack_bf16x2(c0[2], c0[3]);
    a[2] = pack_bf16x2(c1[0], c1[1]);
    a[3] = pack_bf16x2(c1[2], c1[3]);
}

// The same pointer, opaque to the optimiser. A loop that walks a shared-memory ring
// re-derives its tile addresses from this each iteration instead of hoisting dozens of
// loop-invariant per-lane addresses into registers (which forces spills at ~168 registers).
template <typename P>
__device__ __forceinline__ P* opaque_ptr(P* p) {
    asm volatile("" : "+l"(p));
    return p;
}
// An int the optimiser cannot see through (same purpose as opaque_ptr, for a ring index:
// the pointer derived from it keeps its shared-memory address space).
__device__ __forceinline__ int opaque_int(int x) {
    asm volatile("" : "+r"(x));
    return x;
}
