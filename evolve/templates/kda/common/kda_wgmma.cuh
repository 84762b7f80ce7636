// Hopper warpgroup MMA (wgmma) with the A operand in registers, and the shared-memory
// layout its B operand reads: 128-byte swizzled tiles.
//
// A warpgroup's m64nNk16 accumulators and A fragment use, warp by warp (16 rows each), the
// same per-lane layout as mma.sync m16n8k16: n8 tile i holds (row g, cols 8i + 2q, +1) and
// (row g + 8, ...). So a state kept as mma accumulators feeds wgmma unchanged, and one
// accumulator block repacked to bf16 is the next product's A operand (no shared round trip).
#pragma once
#include "kda_tiles.cuh"

// A bf16 tile of ROWS rows x COLS columns, stored as COLS / 64 column panels of ROWS x 128 B;
// inside a panel the 16-byte piece j of row r sits at piece j ^ (r % 8) (the hardware's
// 128-byte swizzle, so a panel must start on a 1024-byte boundary). Loaded by cp.async.
// A thread copies the pieces j = tid % PIECES of rows tid / PIECES + RSTEP n: with RSTEP a
// multiple of 8 its swizzled column is the same in every row, so each copy is one base
// address plus a constant (per-piece division and swizzle arithmetic was most of the
// state kernel's integer work).
template <int ROWS, int COLS, int NTH, int GSTRIDE>
__device__ __forceinline__ void tile_cp_async_sw128(unsigned char* s, const bf16_t* g, int tid) {
    static_assert(COLS % 64 == 0, "a swizzled tile is made of 64-column panels");
    constexpr int PIECES = COLS / 8;
    constexpr int RSTEP = NTH / PIECES;
    static_assert(NTH % PIECES == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "a thread keeps one swizzled column");
    const int r0 = tid / PIECES, j = tid % PIECES;
    unsigned char* dst = s + (j >> 3) * ROWS * 128 + r0 * 128 + (((j & 7) ^ (r0 & 7)) << 4);
    const bf16_t* src = g + r0 * GSTRIDE + j * 8;
#pragma unroll
    for (int n = 0; n < ROWS / RSTEP; ++n) cp_async16(dst + n * RSTEP * 128, src + n * RSTEP * GSTRIDE);
}

// The same layout from rows gstride apart, known only at run time (an input's tokens, H
// heads apart), rows from `valid` on zeroed (past the sequence's end). Kept apart from the
// one above: with its row test the scratch loads compile to more instructions, since the
// compiler cannot see that every row of a full tile is present.
template <int ROWS, int COLS, int NTH>
__device__ __forceinline__ void tile_rows_cp_async_sw128(unsigned char* s, const bf16_t* g, long gstride, int valid,
                                                         int tid) {
    constexpr int PIECES = COLS / 8;
    constexpr int RSTEP = NTH / PIECES;
    static_assert(COLS % 64 == 0 && NTH % PIECES == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "as tile_cp_async_sw128");
    const int r0 = tid / PIECES, j = tid % PIECES;
    unsigned char* dst = s + (j >> 3) * ROWS * 128 + r0 * 128 + (((j & 7) ^ (r0 & 7)) << 4);
    const bf16_t* src = g + r0 * gstride + j * 8;
#pragma unroll
    for (int n = 0; n < ROWS / RSTEP; ++n) {
        if (r0 + n * RSTEP < valid) cp_async16(dst + n * RSTEP * 128, src + n * RSTEP * gstride);
        else *reinterpret_cast<uint4*>(dst + n * RSTEP * 128) = make_uint4(0, 0, 0, 0);
    }
}

// Shared-memory matrix descriptor of a 128-byte swizzled operand. K-major (the 16 k of one
// step lie along a row): lead unused, stride = 1024 B between 8-row groups; the k step
// moves the start by 32 B inside the row. MN-major (n along a row): lead = bytes between
// 64-column panels, stride = 1024 B between groups of 8 k rows.
__device__ __forceinline__ unsigned long long sw128_desc(const void* p, unsigned lead_bytes) {
    const unsigned long long addr = smem_addr(p);
    return ((addr & 0x3FFFF) >> 4) | (unsigned long long)(lead_bytes >> 4) << 16 | (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}
// A 32-byte swizzled K-major operand of one k-step (16 bf16 a row): rows 32 bytes apart, 8-row
// groups 256 B apart, and the two 16-byte halves of a row swapped where row % 8 >= 4 (the
// hardware's 32-byte swizzle: a block must start on a 256-byte boundary).
__device__ __forceinline__ unsigned long long sw32_desc(const void* p) {
    const unsigned long long addr = smem_addr(p);
    return ((addr & 0x3FFFF) >> 4) | 1ull << 16 | (unsigned long long)(256 >> 4) << 32 | 3ull << 62;
}
// The descriptor of the same operand `bytes` further on (a multiple of 16): the start
// address is the low field, and shared memory ends below 256 KiB, so it cannot carry out.
// Lets a loop build one descriptor per tile and step it with an add.
__device__ __forceinline__ unsigned long long desc_at(unsigned long long desc, unsigned bytes) {
    return desc + (bytes >> 4);
}

// stmatrix .x4 .trans: lanes 8 m .. 8 m + 7 give the row addresses of matrix m; r[m] is the
// lane's fragment of an 8 x 8 matrix as mma.sync holds it (row lane / 4, columns 2 (lane % 4),
// + 1), and each matrix is stored transposed: row j of memory gets its column j.
__device__ __forceinline__ void stsm_x4_trans(void* p, const unsigned (&r)[4]) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(smem_addr(p)), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
// cp.async writes through the generic proxy, wgmma reads through the async proxy: the
// writer fences before the barrier that hands the tile over.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving reads or writes of an accumulator across a wgmma that is
// still in flight (the registers belong to the tensor core until wgmma_wait).
template <int N8>
__device__ __forceinline__ void wgmma_hold(float (&d)[N8][4]) {
#pragma unroll
    for (int i = 0; i < N8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
// d (64 x 64) += SCALE_A * a (64 x 16, registers) * B (16 x 64: a K-major tile, 64 rows of n);
// SCALE_D = 0 drops d's old values (d = SCALE_A a B), so a product that starts from zero
// needs no zeros written first: written by the threads while an earlier group is in flight,
// they made the compiler wait for that group
template <int SCALE_A, int SCALE_D = 1>
__device__ __forceinline__ void wgmma_64x64_rs(float (&d)[8][4], const unsigned (&a)[4], unsigned long long desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, %38, %37, 1, 0;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(SCALE_A), "n"(SCALE_D));
}
// d (64 x 128) += SCALE_A * a (64 x 16, registers) * B (16 x 128: an MN-major tile, 16 rows of k)
template <int SCALE_A>
__device__ __forceinline__ void wgmma_64x128_rs_bt(float (&d)[16][4], const unsigned (&a)[4], unsigned long long desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, %69, 1, 1;\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
          "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
          "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
          "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
          "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
          "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(SCALE_A));
}
