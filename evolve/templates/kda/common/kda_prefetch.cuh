// L2 prefetch: asks for the 128-byte line holding an address to be brought into L2, without
// waiting and without a register to land in, so a later load of it waits for L2, not DRAM.
#pragma once

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}

// Chunk c's rows of q, k, v and g (C = 64 rows of K = 128 bf16 each, H heads apart) into L2, by
// 256 threads: thread tid asks for both lines of row tid % 64 of tensor tid / 64 (rows past T
// are not asked for), so the chunk's loads, issued later, wait for L2 rather than DRAM.
template <typename Bf16>
__device__ __forceinline__ void prefetch_chunk_l2(const Bf16* q, const Bf16* k, const Bf16* v, const Bf16* g,
                                                  int T, int H, int c, int h, int bz, int tid) {
    constexpr int C = 64, K = 128;
    const int r = tid % C, which = tid / C;
    if (which > 3 || c * C + r >= T) return;
    const Bf16* base = which == 0 ? q : which == 1 ? k : which == 2 ? v : g;
    const Bf16* row = base + (((long)bz * T + c * C + r) * H + h) * K;
    prefetch_l2(row);
    prefetch_l2(row + K / 2);
}
