// The side prep's schedule and its hand-over. Of every 16 chunks of a head, `side` (0-8) are
// prepared by a second kernel on the SMs the fused kernel leaves idle, into global scratch, and
// flagged ready there; the fused kernel's walk copies each from scratch into its ring. The side
// chunks are spread evenly (never two in a row) and chunk 0 is never one, so the walk's first
// chunk waits for no other kernel.
#pragma once

// 1 where chunk c is the side kernel's: ((c + 1) side) / 16 - (c side) / 16
__device__ __forceinline__ bool is_side_chunk(int c, int side) { return ((c + 1) * side) / 16 != (c * side) / 16; }
// the chunk of side ordinal j (the j-th chunk c with is_side_chunk), and the side chunks of NC
__device__ __forceinline__ int side_chunk(int j, int side) { return (16 * (j + 1) + side - 1) / side - 1; }
__device__ __forceinline__ int side_chunks_of(int nc, int side) { return nc * side / 16; }
// The scratch block (and flag) of side chunk c of head (bz, h): the scratch holds the side
// chunks alone, each head's in order, so the block is the head's times its side chunks, plus
// the side chunks before c. (Unsigned: every term is non-negative, and a signed division by 16
// costs a rounding fix-up, which took registers the side kernel's prep spilled for.)
__device__ __forceinline__ long side_block(int bz, int h, int H, int NC, int c, int side) {
    return ((long)bz * H + h) * (long)(((unsigned)NC * side) >> 4) + (long)(((unsigned)c * side) >> 4);
}
// the chunk after c that the fused prep takes (side chunks never come two in a row)
__device__ __forceinline__ int next_prep_chunk(int c, int side) { return is_side_chunk(c + 1, side) ? c + 2 : c + 1; }

// The producer's stores, made visible at GPU scope, then the flag (its release).
__device__ __forceinline__ void flag_release(unsigned* flag, unsigned value) {
    asm volatile("st.release.gpu.global.u32 [%0], %1;\n" :: "l"(flag), "r"(value) : "memory");
}
// Whether *flag holds `value` now (one acquiring load); if so, this thread's later bulk copies
// are ordered after the stores the flag released, as by flag_wait.
__device__ __forceinline__ bool flag_test(const unsigned* flag, unsigned value) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(flag) : "memory");
    if (v != value) return false;
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    return true;
}
// Spins until *flag holds `value` (the call's epoch), then orders as flag_test.
__device__ __forceinline__ void flag_wait(const unsigned* flag, unsigned value) {
    while (!flag_test(flag, value)) __nanosleep(128);
}
