// The k = 8 shape of the bf16 tensor-core MMA (sm_80+).
#pragma once

// c += A B, A 16 x 8 (a0: row g, a1: row g + 8, each columns 2q, 2q + 1), B 8 x 8 (b: k rows
// 2q, 2q + 1 of column g), fp32 accumulate. An ldmatrix x4 of a 16 x 16 tile yields both
// k halves' A pairs and, in the same registers, the B of the tile's own rows, so X X^T
// needs no register copies (the k = 16 shape wants B's two halves in a register pair).
__device__ __forceinline__ void mma_bf16_k8(float c[4], unsigned a0, unsigned a1, unsigned b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(b));
}
