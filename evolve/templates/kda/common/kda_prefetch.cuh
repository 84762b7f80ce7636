// L2 prefetch: asks for the 128-byte line holding an address to be brought into L2, without
// waiting and without a register to land in, so a later load of it waits for L2, not DRAM.
#pragma once

__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];\n" :: "l"(p));
}
