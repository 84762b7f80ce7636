// Registers between the warpgroups of a warp-specialised CTA (Hopper, sm_90a). A kernel
// launched at R registers a thread may, once every warp of a warpgroup has reached the same
// point, give some back (setmaxnreg.dec) or take more (setmaxnreg.inc, which waits until the
// pool has them): a role with little state runs on fewer so that one holding a large
// accumulator runs on more. ptxas allocates the code after each at the count it names.
#pragma once

template <int REGS>
__device__ __forceinline__ void registers_release() {
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void registers_claim() {
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(REGS));
}
