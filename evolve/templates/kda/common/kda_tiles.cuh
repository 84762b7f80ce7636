// Tile helpers shared by the KDA kernel families: bf16 bit handling, cp.async,
// ldmatrix fragment loads and the m16n8k16 bf16 tensor-core MMA (fp32 accumulate).
//
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16), g = lane / 4, q = lane % 4:
//   A 16x16: a[0] = (g,   2q..2q+1)  a[1] = (g+8, 2q..)  a[2] = (g, 2q+8..)  a[3] = (g+8, 2q+8..)
//   B 16x8 : b[0] = (k = 2q..2q+1, n = g)                b[1] = (k = 2q+8.., n = g)
//   C 16x8 : c[0], c[1] = (g, 2q), (g, 2q+1)             c[2], c[3] = (g+8, 2q), (g+8, 2q+1)
// The header needs no CUDA include, so it compiles the same under NVRTC and nvcc.
#pragma once

typedef unsigned short bf16_t;   // raw bf16 bits; the kernels convert explicitly

__device__ __forceinline__ float bf16_to_f32(bf16_t x) {
    return __uint_as_float(((unsigned)x) << 16);
}

// Two floats -> packed bf16x2 (round to nearest even); `lo` lands in the low half.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float2 unpack_bf16x2(unsigned v) {
    return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// ---- asynchronous global -> shared copies (16 bytes per thread) --------------------
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// Copy a ROWS x COLS bf16 tile (global row stride gstride elements) into shared memory
// with row stride sstride, spread over NTHREADS threads in 16-byte pieces.
template <int ROWS, int COLS, int NTHREADS>
__device__ __forceinline__ void tile_cp_async(bf16_t* s, int sstride, const bf16_t* g, long gstride, int tid) {
    constexpr int PIECES_PER_ROW = COLS / 8;
    constexpr int PIECES = ROWS * PIECES_PER_ROW;
#pragma unroll
    for (int p = tid; p < PIECES; p += NTHREADS) {
        int r = p / PIECES_PER_ROW, c = (p % PIECES_PER_ROW) * 8;
        cp_async16(s + r * sstride + c, g + r * gstride + c);
    }
}

// ---- ldmatrix fragment loads -------------------------------------------------------
__device__ __forceinline__ void ldsm_x4(unsigned r[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned r[4], const bf16_t* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// A fragment of the 16x16 block at (m0, k0) of a row-major [M][K] tile.
__device__ __forceinline__ void load_a(unsigned a[4], const bf16_t* s, int stride, int m0, int k0, int lane) {
    ldsm_x4(a, s + (m0 + (lane & 15)) * stride + k0 + ((lane >> 4) << 3));
}
// A fragment of A = X^T where X is stored row-major [K][M]; block at (m0, k0) of A.
__device__ __forceinline__ void load_a_trans(unsigned a[4], const bf16_t* s, int stride, int m0, int k0, int lane) {
    ldsm_x4_trans(a, s + (k0 + (lane & 7) + ((lane >> 4) << 3)) * stride + m0 + (((lane >> 3) & 1) << 3));
}
// B fragments of two adjacent n-tiles (n0, n0+8) for the k-block k0 of B stored
// row-major as [K][N]: b[0..1] belong to n-tile n0, b[2..3] to n0+8.
__device__ __forceinline__ void load_b_kn(unsigned b[4], const bf16_t* s, int stride, int k0, int n0, int lane) {
    ldsm_x4_trans(b, s + (k0 + (lane & 15)) * stride + n0 + ((lane >> 4) << 3));
}
// Same for B stored as [N][K] (B = X^T of a row-major X).
__device__ __forceinline__ void load_b_nk(unsigned b[4], const bf16_t* s, int stride, int k0, int n0, int lane) {
    ldsm_x4(b, s + (n0 + (lane & 7) + ((lane >> 4) << 3)) * stride + k0 + (((lane >> 3) & 1) << 3));
}

// ---- tensor-core MMA ---------------------------------------------------------------
__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// acc[NT][4] += A(16 x 16*KSTEPS at rows m0) * B(16*KSTEPS x 8*NT at cols n0), both from
// shared memory; B is [K][N] row-major. NT must be even.
template <int NT, int KSTEPS>
__device__ __forceinline__ void warp_mma_kn(float (*acc)[4], const bf16_t* sa, int sa_stride, int m0, int ka0,
                                            const bf16_t* sb, int sb_stride, int kb0, int n0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
        unsigned a[4];
        load_a(a, sa, sa_stride, m0, ka0 + ks * 16, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            unsigned b[4];
            load_b_kn(b, sb, sb_stride, kb0 + ks * 16, n0 + nt * 8, lane);
            mma_bf16(acc[nt], a, b[0], b[1]);
            mma_bf16(acc[nt + 1], a, b[2], b[3]);
        }
    }
}

template <int NT>
__device__ __forceinline__ void zero_acc(float (*acc)[4]) {
#pragma unroll
    for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
}

// ---- math --------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ __forceinline__ float fast_exp(float x) { return exp2f(x * 1.4426950408889634f); }
__device__ __forceinline__ float sigmoidf_(float x) { return 1.f / (1.f + fast_exp(-x)); }

// Two products that share B: acc1 += A1 * B and acc2 += A2 * B (A1, A2 row-major with
// one stride, rows m0; B [K][N] row-major at cols n0), loading each B fragment once.
template <int NT, int KSTEPS>
__device__ __forceinline__ void warp_mma_kn_pair(float (*acc1)[4], const bf16_t* sa1, float (*acc2)[4],
                                                 const bf16_t* sa2, int sa_stride, int m0,
                                                 const bf16_t* sb, int sb_stride, int n0, int lane) {
#pragma unroll
    for (int ks = 0; ks < KSTEPS; ++ks) {
        unsigned a1[4], a2[4];
        load_a(a1, sa1, sa_stride, m0, ks * 16, lane);
        load_a(a2, sa2, sa_stride, m0, ks * 16, lane);
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
            unsigned b[4];
            load_b_kn(b, sb, sb_stride, ks * 16, n0 + nt * 8, lane);
            mma_bf16(acc1[nt], a1, b[0], b[1]);
            mma_bf16(acc1[nt + 1], a1, b[2], b[3]);
            mma_bf16(acc2[nt], a2, b[0], b[1]);
            mma_bf16(acc2[nt + 1], a2, b[2], b[3]);
        }
    }
}
