// Approximate exponential and reciprocal that flush subnormal inputs and results to zero:
// one MUFU instruction each. exp2f and __fdividef keep subnormals, which costs a compare and
// two predicated multiplies around every MUFU.EX2 / MUFU.RCP.
#pragma once

__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float rcp_ftz(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
