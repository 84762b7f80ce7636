// Hopper bulk copies (cp.async.bulk: the TMA engine without a tensor map) that complete on a
// shared-memory mbarrier. One thread copies a whole contiguous tile with one instruction,
// where cp.async takes one per 16 bytes and thread; the barrier counts the bytes that land.
//
// Protocol: mbar_init once (arrival count 1), then per fill the producer thread announces
// the bytes (mbar_expect_tx, its one arrival) and issues the copies; every consumer waits
// for the fill's phase with mbar_wait(bar, fill % 2).
// Below: the by-k-step layout that makes each k-step of a block-lower-triangular tile one copy.
#pragma once
#include "kda_tiles.cuh"

__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// makes the initialised barriers visible to the copy engine (before the barrier that hands them over)
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Returns once the phase of parity `parity` has completed (every announced byte landed).
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n"
        "}\n" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// counted on bar
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 :: "r"(smem_addr(smem)), "l"(gmem), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}

// A C x C bf16 tile that is zero above its 16 x 16 block diagonal (P, T) stored by block
// column j (one wgmma k-step of 16): the column's rows 16 j .. C - 1 only, 32 bytes a row, the
// two 16-byte halves of row r swapped where r % 8 >= 4 (the 32-byte swizzle), so a k-step is
// one contiguous copy. Block column j starts at element kstep_column_offset(j, nb), nb = C / 16.
__device__ __forceinline__ int kstep_column_offset(int j, int nb) { return 256 * (j * nb - j * (j - 1) / 2); }
