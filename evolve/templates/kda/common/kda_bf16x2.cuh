// Packed bf16 arithmetic (sm_90): two bf16 products in one instruction.
#pragma once

// a * b for each bf16 half, rounded to nearest even once (the product of two bf16 values is
// exact in fp32, so this equals the fp32 product rounded to bf16).
__device__ __forceinline__ unsigned mul_bf16x2(unsigned a, unsigned b) {
    unsigned r;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
