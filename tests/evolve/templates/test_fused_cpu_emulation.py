"""Run the rendered fused kernel source itself on the CPU, thread by thread.

With no GPU at hand, this compiles the real `kda_fused.cu` (and the real load/product
helpers of kda_tiles.cuh and kda_warpspec.cuh) with g++, replacing only the lowest-level
primitives (ldmatrix, mma.sync, cp.async, bf16 packing, named barriers, shuffles) by CPU
versions that follow the PTX semantics. Each CUDA thread runs as a cooperative fiber of
one OS thread; a warp-collective primitive waits for all 32 lanes, a named barrier for
its thread count, and a scheduling pass in which no fiber can move is reported as a
deadlock, a barrier left with arrivals at the end of a CTA as an error. Fibers are
resumed in a seeded random order and random warps are held back for a pass, so warps
drift against each other; one warp per CTA is held back most passes, so it runs far behind
(a ring slot refilled before every warp is done with it is overwritten under it). Shared memory is filled with NaN before each CTA, outputs are NaN-poisoned.

What it checks: index arithmetic, fragment plumbing, the ring hand-over (no deadlock,
right slot), masking of partial chunks, cp.async group accounting (a copy lands only when
its thread waits for its group), and the result against the float64 recurrence with the
judge's bounds. What it cannot check: timing, memory-ordering races that the
cooperative schedule hides, register limits (see test_fused_compile.py).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .test_chunked_math import _inputs, recurrence
from .test_fused_schedule import _judge, bf16

GXX = shutil.which("g++")
pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")
K = 128

# -U_FORTIFY_SOURCE: the fibers switch stacks by _longjmp (PRELUDE), which a fortified build refuses
GXX_FLAGS = ["-std=c++17", "-O1", "-fno-strict-aliasing", "-U_FORTIFY_SOURCE", "-w"]

PRELUDE = r"""
// ---- CPU stand-ins for the CUDA built-ins the kernel and its headers use -------------
#include <cmath>
#include <cstring>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <vector>
#include <csetjmp>
#include <ucontext.h>
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
using std::min;
using std::max;
struct dim3_ { unsigned x, y, z; };
static dim3_ threadIdx, blockIdx, gridDim;
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }

// ---- cooperative fibers: one per CUDA thread ------------------------------------------
// A fiber starts on its own stack through makecontext/swapcontext; after that every switch
// is a _setjmp/_longjmp pair, which, unlike swapcontext, saves no signal mask (two system
// calls a switch: half the emulation's time went to them). Built without _FORTIFY_SOURCE,
// whose longjmp refuses a jump to another stack.
struct Fiber { ucontext_t ctx; jmp_buf jb; char* stack; int tid; bool started, done, progressed; };
static ucontext_t g_sched_ctx;
static jmp_buf g_sched;
static Fiber* g_cur;
static inline void fiber_block() { if (!_setjmp(g_cur->jb)) _longjmp(g_sched, 1); }
#define WAIT_UNTIL(cond) do { bool waited_ = false; while (!(cond)) { waited_ = true; fiber_block(); } \
                              if (waited_) g_cur->progressed = true; } while (0)

struct Gen { int count = 0; unsigned gen = 0; };
struct WarpX { Gen bar; const void* ptr[32]; unsigned a[32][4]; unsigned b[32][2]; float f[32]; };
static WarpX g_warp[32];
static Gen g_named[16];
static int g_named_n[16];

static inline int lane_() { return threadIdx.x & 31; }
static inline WarpX& warp_() { return g_warp[threadIdx.x >> 5]; }
static inline void gen_sync(Gen& b, int n) {
    unsigned g = b.gen;
    if (++b.count == n) { b.count = 0; b.gen++; g_cur->progressed = true; }
    else WAIT_UNTIL(b.gen != g);
}
static inline void __syncwarp(unsigned = 0xffffffffu) { gen_sync(warp_().bar, 32); }
static inline float __shfl_xor_sync(unsigned, float v, int m) {
    WarpX& w = warp_();
    w.f[lane_()] = v;
    __syncwarp();
    float r = w.f[lane_() ^ m];
    __syncwarp();
    return r;
}
"""

# CPU versions of the primitives removed from the headers (PTX semantics).
PRIMITIVES = r"""
typedef unsigned short bf16_t;
static inline unsigned short f32_to_bf16_rn(float x) {
    unsigned u = __float_as_uint(x);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    return (unsigned)f32_to_bf16_rn(lo) | ((unsigned)f32_to_bf16_rn(hi) << 16);
}
// mul.rn.bf16x2: the product of two bf16 values is exact in fp32, so one rounding, as on the GPU
__device__ __forceinline__ unsigned mul_bf16x2(unsigned a, unsigned b) {
    return pack_bf16x2(__uint_as_float(a << 16) * __uint_as_float(b << 16),
                       __uint_as_float(a & 0xffff0000u) * __uint_as_float(b & 0xffff0000u));
}
// cp.async: a copy lands either at once (the earliest a GPU may deliver it: a buffer still
// being read when it is refilled gets overwritten) or only when its thread waits for its
// group (the latest: a read not covered by the right wait sees stale data), one or the
// other at random per copy.
struct CpCopy { void* dst; unsigned char data[16]; int group; };
static std::vector<CpCopy> g_cp[1024];
static int g_cp_group[1024];
static unsigned g_cp_coin = 0x9e3779b9u;
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    g_cp_coin = g_cp_coin * 1664525u + 1013904223u;
    if (g_cp_coin >> 31) {
        std::memcpy(smem, gmem, 16);
        return;
    }
    CpCopy c;
    c.dst = smem;
    std::memcpy(c.data, gmem, 16);
    c.group = g_cp_group[threadIdx.x];
    g_cp[threadIdx.x].push_back(c);
}
__device__ __forceinline__ void cp_async_commit() { g_cp_group[threadIdx.x]++; }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    // groups committed so far: 0 .. g_cp_group - 1; all but the newest N must be complete
    std::vector<CpCopy>& q = g_cp[threadIdx.x];
    const int limit = g_cp_group[threadIdx.x] - N;
    size_t keep = 0;
    for (size_t i = 0; i < q.size(); ++i) {
        if (q[i].group < limit) std::memcpy(q[i].dst, q[i].data, 16);
        else q[keep++] = q[i];
    }
    q.resize(keep);
}
// ldmatrix .x4: lanes 8i..8i+7 give the rows of 8x8 matrix i; lane l receives row l/4,
// columns 2(l%4), 2(l%4)+1 (.trans: the transposed matrix).
static inline void ldsm_common(unsigned r[4], const bf16_t* p, bool trans) {
    WarpX& w = warp_();
    const int l = lane_();
    w.ptr[l] = p;
    __syncwarp();
    for (int i = 0; i < 4; ++i) {
        bf16_t lo, hi;
        if (!trans) {
            const bf16_t* row = (const bf16_t*)w.ptr[8 * i + l / 4];
            lo = row[2 * (l % 4)]; hi = row[2 * (l % 4) + 1];
        } else {
            lo = ((const bf16_t*)w.ptr[8 * i + 2 * (l % 4)])[l / 4];
            hi = ((const bf16_t*)w.ptr[8 * i + 2 * (l % 4) + 1])[l / 4];
        }
        r[i] = (unsigned)lo | ((unsigned)hi << 16);
    }
    __syncwarp();
}
__device__ __forceinline__ void ldsm_x4(unsigned r[4], const bf16_t* p) { ldsm_common(r, p, false); }
__device__ __forceinline__ void ldsm_x4_trans(unsigned r[4], const bf16_t* p) { ldsm_common(r, p, true); }
static inline float bf_lo(unsigned v) { return __uint_as_float(v << 16); }
static inline float bf_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }
// An MMA's operands as the warp shares them: every lane's A and B registers, visible to all.
static inline WarpX& mma_operands(const unsigned a[4], unsigned b0, unsigned b1) {
    WarpX& w = warp_();
    const int l = lane_();
    for (int j = 0; j < 4; ++j) w.a[l][j] = a[j];
    w.b[l][0] = b0; w.b[l][1] = b1;
    __syncwarp();
    return w;
}
// c += A B over KK k-steps for the lane's rows g, g + 8 (A) and columns 2q, 2q + 1 (B); then
// the warp's shared operands may be reused.
template <int KK> static inline void mma_accumulate(float c[4], const float (&A)[2][KK], const float (&B)[KK][2]) {
    for (int h = 0; h < 2; ++h)
        for (int n = 0; n < 2; ++n) {
            float acc = c[2 * h + n];
            for (int kk = 0; kk < KK; ++kk) acc += A[h][kk] * B[kk][n];
            c[2 * h + n] = acc;
        }
    __syncwarp();
}
// mma.m16n8k16 row.col bf16 -> fp32, fragment layouts as documented in kda_tiles.cuh.
__device__ __forceinline__ void mma_bf16(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    WarpX& w = mma_operands(a, b0, b1);
    const int l = lane_();
    const int g = l / 4, q = l % 4;
    float A[2][16], B[16][2];
    for (int h = 0; h < 2; ++h)          // rows g and g + 8
        for (int qq = 0; qq < 4; ++qq) {
            const unsigned* s = w.a[g * 4 + qq];
            A[h][2 * qq] = bf_lo(s[h]); A[h][2 * qq + 1] = bf_hi(s[h]);
            A[h][2 * qq + 8] = bf_lo(s[2 + h]); A[h][2 * qq + 9] = bf_hi(s[2 + h]);
        }
    for (int n = 0; n < 2; ++n)          // columns 2q and 2q + 1
        for (int qq = 0; qq < 4; ++qq) {
            const unsigned* s = w.b[(2 * q + n) * 4 + qq];
            B[2 * qq][n] = bf_lo(s[0]); B[2 * qq + 1][n] = bf_hi(s[0]);
            B[2 * qq + 8][n] = bf_lo(s[1]); B[2 * qq + 9][n] = bf_hi(s[1]);
        }
    mma_accumulate<16>(c, A, B);
}
// mma.m16n8k8 row.col bf16 -> fp32: A is a0 (row g) and a1 (row g + 8) at columns 2q, 2q + 1,
// B is b (k rows 2q, 2q + 1 of column g).
__device__ __forceinline__ void mma_bf16_k8(float c[4], unsigned a0, unsigned a1, unsigned b) {
    const unsigned a[4] = {a0, a1, 0u, 0u};
    WarpX& w = mma_operands(a, b, 0u);
    const int l = lane_();
    const int g = l / 4, q = l % 4;
    float A[2][8], B[8][2];
    for (int h = 0; h < 2; ++h)          // rows g and g + 8
        for (int qq = 0; qq < 4; ++qq) {
            const unsigned s = w.a[g * 4 + qq][h];
            A[h][2 * qq] = bf_lo(s); A[h][2 * qq + 1] = bf_hi(s);
        }
    for (int n = 0; n < 2; ++n)          // columns 2q and 2q + 1
        for (int qq = 0; qq < 4; ++qq) {
            const unsigned s = w.b[(2 * q + n) * 4 + qq][0];
            B[2 * qq][n] = bf_lo(s); B[2 * qq + 1][n] = bf_hi(s);
        }
    mma_accumulate<8>(c, A, B);
}
// named barriers: a thread's arrival counts one; sync waits for the barrier to complete
__device__ __forceinline__ void named_bar_sync(int id, int n) {
    if (g_named_n[id] && g_named_n[id] != n) { std::fprintf(stderr, "barrier %d used with %d and %d\n", id, g_named_n[id], n); std::abort(); }
    g_named_n[id] = n;
    gen_sync(g_named[id], n);
}
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
    if (g_named_n[id] && g_named_n[id] != n) { std::fprintf(stderr, "barrier %d used with %d and %d\n", id, g_named_n[id], n); std::abort(); }
    g_named_n[id] = n;
    Gen& b = g_named[id];
    if (++b.count == n) { b.count = 0; b.gen++; }
    g_cur->progressed = true;
}
template <typename P> __device__ __forceinline__ P* opaque_ptr(P* p) { return p; }
__device__ __forceinline__ int opaque_int(int x) { return x; }
static int g_nth;   // threads per CTA of the grid being run
"""

# The host side both emulation tests share (after the kernel sources): binary I/O, canary
# tails, and `run_grid`, which runs every CTA of a grid as fibers with warps drifting at
# random (one of them far behind) and reports deadlocks, barriers left with arrivals and cp.async never waited for.
DRIVER = r"""
#include <functional>
#include <random>
template <typename T> static std::vector<T> load(const char* dir, const char* name, size_t n) {
    std::vector<T> v(n);
    char path[4096]; std::snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE* f = std::fopen(path, "rb");
    if (!f || std::fread(v.data(), sizeof(T), n, f) != n) { std::fprintf(stderr, "cannot read %s\n", path); std::exit(2); }
    std::fclose(f);
    return v;
}
template <typename T> static void save(const char* dir, const char* name, const std::vector<T>& v) {
    char path[4096]; std::snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE* f = std::fopen(path, "wb");
    std::fwrite(v.data(), sizeof(T), v.size(), f);
    std::fclose(f);
}

// Every buffer gets a tail of canary elements, all bits set (NaN in bf16 and fp32): a
// kernel that writes past the end of any buffer (into whatever the allocator placed next,
// an input on a GPU) fails the run, and one that reads past it gets NaN into its result.
static const size_t GUARD = 1 << 16;
template <typename T> static size_t guard(std::vector<T>& v) {
    size_t n = v.size();
    T canary; std::memset(&canary, 0xff, sizeof canary);
    v.resize(n + GUARD, canary);
    return n;
}
template <typename T> static bool guard_intact(const std::vector<T>& v, size_t n, const char* name) {
    unsigned char canary[sizeof(T)]; std::memset(canary, 0xff, sizeof canary);
    for (size_t i = n; i < v.size(); ++i)
        if (std::memcmp(&v[i], canary, sizeof(T))) {
            std::fprintf(stderr, "write past the end of %s at element %zu (size %zu)\n", name, i, n);
            return false;
        }
    return true;
}

static std::function<void()> g_body;
static void trampoline() {
    g_body();
    g_cur->done = true;
    g_cur->progressed = true;
    _longjmp(g_sched, 1);
}

// The warp that lags (-1: one drawn at random per CTA) and how far: it runs one pass in
// g_lag_period. A harness may pin it to one role, to drive that role's hand-overs to the edge.
static int g_laggard = -1, g_lag_period = 16;
// Run every CTA of a grid, one after another, each as `nth` fibers; 0 or an error code.
static int run_grid(dim3_ grid, int nth, unsigned char* sm, size_t smem_bytes, std::mt19937& rng) {
    gridDim = grid;
    g_nth = nth;
    std::vector<Fiber> fibers(nth);
    for (auto& f : fibers) f.stack = (char*)std::malloc(1 << 18);
    for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
        blockIdx = {bx, by, bz};
        std::memset(sm, 0xff, smem_bytes);                   // NaN everywhere
        for (auto& w : g_warp) w = WarpX();
        for (auto& b : g_named) b = Gen();
        for (auto& n : g_named_n) n = 0;
        for (int t = 0; t < 1024; ++t) { g_cp[t].clear(); g_cp_group[t] = 0; }
        for (int t = 0; t < nth; ++t) {
            Fiber& f = fibers[t];
            f.tid = t; f.started = f.done = false; f.progressed = false;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = f.stack;
            f.ctx.uc_stack.ss_size = 1 << 18;
            f.ctx.uc_link = nullptr;
            makecontext(&f.ctx, trampoline, 0);
        }
        std::vector<int> order(nth);
        for (int t = 0; t < nth; ++t) order[t] = t;
        bool full_pass = true;
        // one warp of the CTA lags: held back 15 passes in 16, so it runs far behind the
        // others (a buffer refilled before every warp is done with it gets overwritten under it)
        const int laggard = g_laggard >= 0 ? g_laggard : (int)(rng() % (unsigned)(nth / 32));
        for (;;) {
            bool live = false, moved = false, skipped = false;
            std::shuffle(order.begin(), order.end(), rng);
            unsigned stalled = 0;                             // warps held back this pass
            if (!full_pass)
                for (int w = 0; w < nth / 32; ++w) {
                    const bool held = w == laggard ? rng() % g_lag_period != 0 : rng() % 4 == 0;
                    stalled |= (held ? 1u : 0u) << w;
                }
            for (int t : order) {
                Fiber& f = fibers[t];
                if (f.done) continue;
                live = true;
                if (stalled >> (t >> 5) & 1) { skipped = true; continue; }
                g_cur = &f;
                threadIdx = {(unsigned)t, 0, 0};
                f.progressed = false;
                if (!_setjmp(g_sched)) {
                    if (f.started) _longjmp(f.jb, 1);
                    f.started = true;
                    swapcontext(&g_sched_ctx, &f.ctx);   // first entry, onto the fiber's stack
                }
                moved |= f.progressed;
            }
            if (!live) break;
            full_pass = !moved && skipped;
            if (!moved && !skipped) {
                std::fprintf(stderr, "deadlock in CTA (%u, %u, %u)\n", bx, by, bz);
                for (int b = 0; b < 16; ++b)
                    if (g_named[b].count) std::fprintf(stderr, "  barrier %d: %d of %d arrived\n", b, g_named[b].count, g_named_n[b]);
                return 3;
            }
        }
        for (int t = 0; t < nth; ++t)
            if (!g_cp[t].empty()) { std::fprintf(stderr, "thread %d ends with cp.async copies never waited for\n", t); return 5; }
        for (int b = 0; b < 16; ++b)
            if (g_named[b].count) {
                std::fprintf(stderr, "barrier %d left with %d of %d arrivals\n", b, g_named[b].count, g_named_n[b]);
                return 4;
            }
    }
    for (auto& f : fibers) std::free(f.stack);
    return 0;
}
"""

# A one-kernel harness's main() opens with this: the case's arguments (dir B T H seed), its
# inputs as write_case left them, NaN-poisoned outputs.
READ_CASE = r"""    const char* dir = argv[1];
    const int B = std::atoi(argv[2]), T = std::atoi(argv[3]), H = std::atoi(argv[4]);
    const unsigned seed = (unsigned)std::atoi(argv[5]);
    const size_t ntok = (size_t)B * T * H;
    auto q = load<bf16_t>(dir, "q.bin", ntok * K), k = load<bf16_t>(dir, "k.bin", ntok * K);
    auto v = load<bf16_t>(dir, "v.bin", ntok * K), g = load<bf16_t>(dir, "g.bin", ntok * K);
    auto beta = load<bf16_t>(dir, "beta.bin", ntok);
    auto alog = load<float>(dir, "A_log.bin", H), dt = load<float>(dir, "dt_bias.bin", (size_t)H * K);
    auto init = load<float>(dir, "init.bin", (size_t)B * H * K * K);
    std::vector<bf16_t> out(ntok * K, 0x7fc0);             // NaN-poisoned
    std::vector<float> fin((size_t)B * H * K * K, NAN);
"""

HARNESS = r"""
#include "kda_fused.cu"
#include <vector>
alignas(16) unsigned char smem[SMEM_BYTES];
""" + DRIVER + r"""
int main(int argc, char** argv) {
""" + READ_CASE + r"""    const float scale = 1.f / std::sqrt((float)K);
    std::mt19937 rng(seed);
    g_body = [&] {
        kda_fused_kernel(q.data(), k.data(), v.data(), g.data(), beta.data(), alog.data(), dt.data(), init.data(),
                         out.data(), fin.data(), T, H, scale);
    };
    int rc = run_grid({(unsigned)(K / VB), (unsigned)H, (unsigned)B}, NTH, smem, sizeof smem, rng);
    if (rc) return rc;
    save(dir, "out.bin", out);
    save(dir, "final.bin", fin);
    return 0;
}
"""


def _strip_functions(src: str, names: list[str]) -> str:
    """Remove the definitions of `names` (with a preceding template line) from a header."""
    for name in names:
        m = re.search(r"(template\s*<[^>]*>\s*)?__device__ __forceinline__ [\w\s\*]+?\b" + name + r"\s*\(", src)
        assert m, name
        i = src.index("{", m.end())
        depth = 0
        for j in range(i, len(src)):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                break
        src = src[:m.start()] + src[j + 1:]
    return src


def build(cand: Path, work: Path) -> Path:
    """The CPU build of a rendered candidate's kernel; returns the executable."""
    work.mkdir(parents=True, exist_ok=True)
    tiles = _strip_functions((cand / "kda_tiles.cuh").read_text(),
                             ["pack_bf16x2", "cp_async16", "cp_async_commit", "cp_async_wait",
                              "ldsm_x4", "ldsm_x4_trans", "mma_bf16"])
    tiles = tiles.replace("typedef unsigned short bf16_t;", "")
    tiles = tiles.replace("#pragma once", "#pragma once\n" + PRELUDE + PRIMITIVES, 1)
    warpspec = _strip_functions((cand / "kda_warpspec.cuh").read_text(),
                                ["named_bar_sync", "named_bar_arrive", "opaque_ptr", "opaque_int"])
    assert "asm" not in re.sub(r"//.*", "", tiles + warpspec), "a PTX primitive was left in"
    (work / "kda_tiles.cuh").write_text(tiles)
    (work / "kda_warpspec.cuh").write_text(warpspec)
    shutil.copy(cand / "iket.cuh", work / "iket.cuh")
    shutil.copy(cand / "kda_fused.cu", work / "kda_fused.cu")
    return compile_harness(work, HARNESS, "kda_fused_cpu")


def compile_harness(work: Path, harness: str, name: str) -> Path:
    """g++ of a harness (the kernel sources and CPU headers already in `work`); the executable."""
    (work / "harness.cpp").write_text(harness)
    exe = work / name
    res = subprocess.run([GXX, *GXX_FLAGS, "-o", str(exe), str(work / "harness.cpp")],
                         capture_output=True, text=True, cwd=work)
    assert res.returncode == 0, res.stderr[-4000:]
    return exe


def _bits(x):
    return (bf16(x).view(np.uint32) >> 16).astype(np.uint16)


def write_case(work: Path, B, T, H, regime, seed) -> tuple:
    """Random inputs of one case written where the CPU build reads them; returns them."""
    rng = np.random.default_rng(seed)
    per_batch = [_inputs(rng, T, H, regime) for _ in range(B)]
    q, k, v, g, beta = (np.stack([pb[i] for pb in per_batch]) for i in range(5))
    A_log, dt_bias = per_batch[0][5], per_batch[0][6]
    S0 = np.stack([pb[7] for pb in per_batch])
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        _bits(x).tofile(work / f"{name}.bin")
    np.float32(A_log).tofile(work / "A_log.bin")
    np.float32(dt_bias).tofile(work / "dt_bias.bin")
    np.float32(S0).tofile(work / "init.bin")
    return q, k, v, g, beta, A_log, dt_bias, S0


def check_case(work: Path, inputs: tuple, B, T, H, regime) -> None:
    """The CPU build's outputs against the float64 recurrence, with the judge's bounds."""
    q, k, v, g, beta, A_log, dt_bias, S0 = inputs
    out = (np.fromfile(work / "out.bin", np.uint16).astype(np.uint32) << 16).view(np.float32)
    out = out.reshape(B, T, H, K).astype(np.float64)
    fin = np.fromfile(work / "final.bin", np.float32).reshape(B, H, K, K).astype(np.float64)
    rb = lambda x: bf16(x).astype(np.float64)
    for bz in range(B):
        ref_o, ref_s = recurrence(rb(q[bz]), rb(k[bz]), rb(v[bz]), rb(g[bz]), rb(beta[bz]),
                                  np.float32(A_log).astype(np.float64), np.float32(dt_bias).astype(np.float64),
                                  np.float32(S0[bz]).astype(np.float64), K ** -0.5)
        ok_o, r_o = _judge(out[bz], ref_o)
        ok_s, r_s = _judge(fin[bz], ref_s)
        assert ok_o and ok_s, (B, T, regime, bz, r_o, r_s)
        assert r_o < 0.01 and r_s < 0.01, (r_o, r_s)


def run_case(exe: Path, work: Path, B, T, H, regime, seed):
    inputs = write_case(work, B, T, H, regime, seed)
    res = subprocess.run([str(exe), str(work), str(B), str(T), str(H), str(seed)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"rc={res.returncode}: {res.stderr[-2000:]}"
    check_case(work, inputs, B, T, H, regime)


@pytest.mark.parametrize("overrides, cases", [
    ({}, [(1, 1, 1, "scored"), (1, 65, 1, "scored"), (1, 321, 1, "scored"), (1, 129, 1, "saturated"),
          (2, 33, 1, "scored")]),
    ({"stages": 1}, [(1, 129, 1, "switch")]),
    ({"v_block": 64, "prep_warps": 8, "stages": 2}, [(1, 200, 1, "scored")]),
    ({"v_block": 64, "prep_warps": 4, "stages": 1}, [(1, 17, 2, "scored")]),
    ({"prefetch": 1}, [(1, 1, 1, "scored"), (1, 64, 1, "scored"), (1, 200, 1, "saturated"), (2, 70, 1, "switch")]),
    ({"v_block": 64, "prep_warps": 8, "prefetch": 1}, [(1, 129, 1, "scored")]),
], ids=["defaults", "stages1", "vb64_prep8", "vb64_prep4_stages1", "prefetch", "vb64_prep8_prefetch"])
def test_kernel_source_on_cpu(render_point, tmp_path, overrides, cases):
    cand, _ = render_point("fused", **overrides)
    exe = build(cand, tmp_path / "cpu")
    for i, (B, T, H, regime) in enumerate(cases):
        run_case(exe, tmp_path / "cpu", B, T, H, regime, seed=100 + i)
