// The m16n8k8 tf32 tensor-core MMA (fp32 accumulate) on fp32 tiles in shared memory: the
// operands keep fp32's exponent and 10 of its 23 mantissa bits (the hardware ignores the
// rest), three more than bf16.
//
// Fragment layouts (PTX ISA, mma.m16n8k8 .tf32), g = lane / 4, q = lane % 4:
//   A 16x8: a[0] = (g, q)  a[1] = (g+8, q)  a[2] = (g, q+4)  a[3] = (g+8, q+4)
//   B 8x8 : b[0] = (k = q, n = g)            b[1] = (k = q+4, n = g)
//   C 16x8: as for m16n8k16: c[0], c[1] = (g, 2q), (g, 2q+1); c[2], c[3] = (g+8, 2q), (g+8, 2q+1)
#pragma once

__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
