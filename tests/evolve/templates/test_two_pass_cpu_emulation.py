"""Run the rendered two_pass kernel sources themselves on the CPU, thread by thread.

Same method as test_fused_cpu_emulation.py (whose CPU primitives this reuses): the real
`kda_prep.cu` and `kda_state.cu` are compiled with g++ into one program, with only
ldmatrix, mma.sync, cp.async, bf16 packing, shuffles and barriers replaced by CPU
versions of their PTX semantics; every CUDA thread is a cooperative fiber, warps drift at
random, shared memory starts as NaN, the scratch between the kernels and the outputs are
NaN-poisoned, and a cp.async copy lands only when its thread waits for its group. The
prep grid runs first, then the state grid, as the candidate launches them (with segments
> 1, range by range: the prep of a chunk range, then its walk); the result is checked
against the float64 recurrence with the judge's bounds.

It covers both state steps, both prep layouts and both ring depths, with the first
design (`cta`, `full`, one slot) as a control, and checks that w's decay applied in
registers (w_gamma), T written in bf16 by the inverse (t_bf16) and the norms from one
ldmatrix pass (row_norms) change no output bit. Every buffer carries a canary tail and the
inputs are compared bit for bit afterwards: no kernel writes outside its outputs. It cannot check timing, memory-ordering
races hidden by the cooperative schedule, or register limits (test_two_pass_compile.py).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import NOT_BULK, for_prep
from .test_fused_cpu_emulation import (DRIVER, GXX, PRELUDE, PRIMITIVES, _bits, _strip_functions, check_case, compile_harness,
                                       write_case)

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")
K = 128
C = 64

# __syncthreads as a barrier over the CTA's threads (the fused kernel never uses it)
SYNCTHREADS = r"""
static inline void __syncthreads() { gen_sync(g_named[0], g_nth); }
"""

# CPU versions of the wgmma primitives (kda_wgmma.cuh). An op is recorded at issue with
# this thread's A fragment and runs (reads its B tile from shared memory through the
# descriptor's own fields, swizzle included, and accumulates) only when the thread waits
# for its group: the latest a GPU may complete it. So an accumulator read before the wait
# sees the old value, and a tile refilled before the wait feeds the product the new data.
WGMMA = r"""
#include <map>
#include <tuple>
struct WgOp { float* d; int n8; bool trans_b; int scale_a; int scale_d; unsigned long long desc; int group; long seq; };
struct WgA { unsigned a[128][4]; int count = 0; };
static std::map<std::tuple<long, int, long>, WgA> g_wg_a;   // (CTA, warpgroup, op) -> A fragments
static std::vector<WgOp> g_wg_ops[1024];
static int g_wg_group[1024];
static long g_wg_seq[1024];
static unsigned char* g_wg_smem;     // the CTA's shared memory (set by the harness)
static size_t g_wg_smem_bytes;
static inline long wg_cta() { return blockIdx.x + (long)gridDim.x * (blockIdx.y + (long)gridDim.y * blockIdx.z); }
static inline void wg_issue(float* d, int n8, bool trans_b, int scale_a, int scale_d, const unsigned a[4],
                            unsigned long long desc) {
    const int t = threadIdx.x;
    WgA& x = g_wg_a[std::make_tuple(wg_cta(), t / 128, g_wg_seq[t])];
    for (int j = 0; j < 4; ++j) x.a[t % 128][j] = a[j];
    x.count++;
    g_wg_ops[t].push_back({d, n8, trans_b, scale_a, scale_d, desc, g_wg_group[t], g_wg_seq[t]});
    g_wg_seq[t]++;
}
// B(k, n) of a 128-byte swizzled operand, as the descriptor describes it
static inline float wg_b(unsigned long long desc, bool trans_b, int k, int n) {
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4, lead = (unsigned)((desc >> 16) & 0x3FFF) << 4;
    const unsigned stride = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    const unsigned layout = (unsigned)(desc >> 62);
    if ((layout != 1 && layout != 3) || ((desc >> 49) & 7) || (layout == 3 && trans_b)) {
        std::fprintf(stderr, "wgmma: not a 128-byte swizzle nor a K-major 32-byte swizzle descriptor\n");
        std::abort();
    }
    unsigned addr;
    if (layout == 3) {   // 32-byte swizzle, K-major, one k-step: rows of 32 bytes, halves swapped on rows 4..7 of 8
        addr = start + (n / 8) * stride + (n % 8) * 32 + k * 2;
        addr ^= ((addr >> 7) & 1) << 4;
    } else {
        addr = trans_b ? start + (n / 64) * lead + (n % 64) * 2 + (k % 8) * 128 + (k / 8) * stride
                       : start + (n / 8) * stride + (n % 8) * 128 + k * 2;
        addr ^= ((addr >> 7) & 7) << 4;   // 16-byte piece ^= row within the 1024-byte period
    }
    const size_t off = (addr - ((size_t)g_wg_smem & 0x3FFFF)) & 0x3FFFF;   // 18 address bits
    if (off + 2 > g_wg_smem_bytes) { std::fprintf(stderr, "wgmma: B outside shared memory\n"); std::abort(); }
    unsigned short bits; std::memcpy(&bits, g_wg_smem + off, 2);
    return __uint_as_float((unsigned)bits << 16);
}
static inline void wg_run(const WgOp& op) {
    const int t = threadIdx.x;
    WgA& x = g_wg_a[std::make_tuple(wg_cta(), t / 128, op.seq)];
    WAIT_UNTIL(x.count == 128);   // every thread of the warpgroup has issued it
    const int w = (t % 128) / 32, l = t % 32, g = l / 4, q = l % 4;
    for (int i = 0; i < op.n8; ++i)
        for (int e = 0; e < 4; ++e) {
            const int m = 16 * w + g + 8 * (e >> 1), n = 8 * i + 2 * q + (e & 1);
            float acc = 0.f;
            for (int k = 0; k < 16; ++k) {   // A(m, k) from the lane that holds it (mma.sync A layout)
                const unsigned r = x.a[32 * (m / 16) + ((m % 16) % 8) * 4 + (k % 8) / 2][(m % 16) / 8 + 2 * (k / 8)];
                acc += ((k & 1) ? bf_hi(r) : bf_lo(r)) * wg_b(op.desc, op.trans_b, k, n);
            }
            op.d[4 * i + e] = (op.scale_d ? op.d[4 * i + e] : 0.f) + op.scale_a * acc;
        }
}
template <int SCALE_A, int SCALE_D = 1> __device__ __forceinline__ void wgmma_64x64_rs(float (&d)[8][4], const unsigned (&a)[4], unsigned long long desc) { wg_issue(&d[0][0], 8, false, SCALE_A, SCALE_D, a, desc); }
template <int SCALE_A> __device__ __forceinline__ void wgmma_64x128_rs_bt(float (&d)[16][4], const unsigned (&a)[4], unsigned long long desc) { wg_issue(&d[0][0], 16, true, SCALE_A, 1, a, desc); }
// stmatrix .x4 .trans: matrix m's row addresses from lanes 8 m .. 8 m + 7; row j of memory
// gets column j of the matrix, whose element k the lane 4 k + j / 2 holds (half j % 2 of r[m])
__device__ __forceinline__ void stsm_x4_trans(void* p, const unsigned (&r)[4]) {
    WarpX& w = warp_();
    const int l = lane_();
    w.ptr[l] = p;
    for (int j = 0; j < 4; ++j) w.a[l][j] = r[j];
    __syncwarp();
    const int m = l / 8, j = l % 8;
    bf16_t* row = (bf16_t*)w.ptr[l];
    for (int k = 0; k < 8; ++k) {
        const unsigned v = w.a[4 * k + j / 2][m];
        row[k] = (bf16_t)((j & 1) ? v >> 16 : v & 0xffffu);
    }
    __syncwarp();
}
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void fence_async_shared() {}
template <int N8> __device__ __forceinline__ void wgmma_hold(float (&)[N8][4]) {}
__device__ __forceinline__ void wgmma_commit() { g_wg_group[threadIdx.x]++; }
template <int N> __device__ __forceinline__ void wgmma_wait() {
    std::vector<WgOp>& ops = g_wg_ops[threadIdx.x];
    const int limit = g_wg_group[threadIdx.x] - N;   // all but the newest N groups complete
    size_t keep = 0;
    for (size_t i = 0; i < ops.size(); ++i) {
        if (ops[i].group < limit) wg_run(ops[i]);
        else ops[keep++] = ops[i];
    }
    ops.resize(keep);
}
"""

# CPU versions of kda_bulk.cuh. An mbarrier's phase completes when its one arrival came (the
# producer's expect_tx, which announces the phase's bytes) and every announced byte landed;
# a waiter for a phase not yet complete blocks (a phase short of bytes is a deadlock), and
# a copy past the announced bytes aborts. Each bulk copy lands either at once (the earliest a
# GPU may: a slot refilled while still read is overwritten) or when its phase completes (the
# latest: a read not covered by the wait sees stale data), at random per copy. A copy of a
# size or to an address the engine refuses aborts.
BULK = r"""
#include <map>
struct BulkPending { unsigned char* dst; std::vector<unsigned char> data; };
struct MBar { unsigned phase = 0; int count = 0, pending = 0; long announced = 0, delivered = 0;
              std::vector<BulkPending> copies; };
static std::map<const void*, MBar> g_mbar;
static inline MBar& mbar_of(const void* bar) {
    auto it = g_mbar.find(bar);
    if (it == g_mbar.end() || it->second.count == 0) { std::fprintf(stderr, "mbarrier used before mbar_init\n"); std::abort(); }
    return it->second;
}
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned count) {
    MBar& b = g_mbar[bar];
    b = MBar();
    b.count = b.pending = (int)count;
}
__device__ __forceinline__ void mbar_fence_init() {}
__device__ __forceinline__ void mbar_expect_tx(unsigned long long* bar, unsigned bytes) {
    MBar& b = mbar_of(bar);
    if (b.pending == 0) { std::fprintf(stderr, "mbarrier: an arrival more than its count\n"); std::abort(); }
    b.announced += bytes;
    b.pending--;
}
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned bytes, unsigned long long* bar) {
    MBar& b = mbar_of(bar);
    if (bytes % 16 || (size_t)smem % 16 || (size_t)gmem % 16) { std::fprintf(stderr, "bulk copy: not 16-byte aligned\n"); std::abort(); }
    if ((unsigned char*)smem < g_wg_smem || (unsigned char*)smem + bytes > g_wg_smem + g_wg_smem_bytes) {
        std::fprintf(stderr, "bulk copy: outside shared memory\n"); std::abort();
    }
    b.delivered += bytes;
    if (b.pending == 0 && b.delivered > b.announced) {
        std::fprintf(stderr, "mbarrier: %ld bytes copied, %ld announced\n", b.delivered, b.announced);
        std::abort();
    }
    g_cp_coin = g_cp_coin * 1664525u + 1013904223u;
    if (g_cp_coin >> 31) { std::memcpy(smem, gmem, bytes); return; }
    b.copies.push_back({(unsigned char*)smem, std::vector<unsigned char>((const unsigned char*)gmem, (const unsigned char*)gmem + bytes)});
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned parity) {
    MBar& b = mbar_of(bar);
    WAIT_UNTIL((b.phase & 1) != parity || (b.pending == 0 && b.delivered == b.announced));
    if ((b.phase & 1) != parity) return;   // that phase has completed
    for (BulkPending& c : b.copies) std::memcpy(c.dst, c.data.data(), c.data.size());
    b.copies.clear();
    b.phase++;
    b.pending = b.count;
    b.announced = b.delivered = 0;
}
"""

# CPU version of kda_mma_tf32.cuh's MMA: m16n8k8, operands cut to tf32 (the low 13 mantissa
# bits dropped, as the hardware ignores them), fp32 accumulate.
MMA_TF32 = r"""
#pragma once
static inline float tf32_cut(unsigned v) { return __uint_as_float(v & 0xffffe000u); }
__device__ __forceinline__ void mma_tf32(float c[4], const unsigned a[4], unsigned b0, unsigned b1) {
    WarpX& w = mma_operands(a, b0, b1);
    const int l = lane_();
    const int g = l / 4, q = l % 4;
    float A[2][8], B[8][2];
    for (int h = 0; h < 2; ++h)          // rows g and g + 8: a[h] = (row, k = lane % 4), a[2 + h] = (row, k + 4)
        for (int qq = 0; qq < 4; ++qq) {
            A[h][qq] = tf32_cut(w.a[g * 4 + qq][h]);
            A[h][qq + 4] = tf32_cut(w.a[g * 4 + qq][2 + h]);
        }
    for (int n = 0; n < 2; ++n)          // columns 2q and 2q + 1: b[0] = (k = lane % 4, n = lane / 4), b[1] = (k + 4, n)
        for (int qq = 0; qq < 4; ++qq) {
            B[qq][n] = tf32_cut(w.b[(2 * q + n) * 4 + qq][0]);
            B[qq + 4][n] = tf32_cut(w.b[(2 * q + n) * 4 + qq][1]);
        }
    mma_accumulate<8>(c, A, B);
}
"""

# CPU versions of kda_approx.cuh: subnormal results flushed to zero
APPROX = r"""
#pragma once
static inline float ftz_(float y) { return std::fabs(y) < 1.17549435e-38f ? 0.f : y; }
__device__ __forceinline__ float ex2_ftz(float x) { return ftz_(std::exp2(ftz_(x))); }
__device__ __forceinline__ float rcp_ftz(float x) { return ftz_(1.f / ftz_(x)); }
"""

HARNESS = r"""
#include "kda_tiles.cuh"
#include "kda_bulk.cuh"   // both kernels use it: outside their namespaces, once
#include "iket.cuh"
// Each kernel in its own namespace (both define C, K, NTH, ...); its dynamic shared memory
// gets a name of its own too (an extern "C" function's block-scope extern has C linkage).
#define smem prep_smem
namespace prep_k {
#include "kda_prep.cu"
alignas(16) unsigned char smem[SMEM_BYTES];
}
#undef smem
#define smem state_smem
namespace state_k {
#include "kda_state.cu"
alignas(16) unsigned char smem[SMEM_BYTES];
}
#undef smem

""" + DRIVER + r"""
int main(int argc, char** argv) {
    const char* dir = argv[1];
    const int B = std::atoi(argv[2]), T = std::atoi(argv[3]), H = std::atoi(argv[4]);
    const unsigned seed = (unsigned)std::atoi(argv[5]);
    const int VB = std::atoi(argv[6]), NW = std::atoi(argv[7]), SEG = std::atoi(argv[8]);
    const int KD = 128, C = 64, NC = (T + C - 1) / C;
    const size_t ntok = (size_t)B * T * H, blocks = (size_t)B * H * NC;
    auto q = load<bf16_t>(dir, "q.bin", ntok * KD), k = load<bf16_t>(dir, "k.bin", ntok * KD);
    auto v = load<bf16_t>(dir, "v.bin", ntok * KD), g = load<bf16_t>(dir, "g.bin", ntok * KD);
    auto beta = load<bf16_t>(dir, "beta.bin", ntok);
    auto alog = load<float>(dir, "A_log.bin", H), dt = load<float>(dir, "dt_bias.bin", (size_t)H * KD);
    auto init = load<float>(dir, "init.bin", (size_t)B * H * KD * KD);
    // scratch and outputs NaN-poisoned: an element a kernel forgets to write shows up
    std::vector<bf16_t> qg(blocks * C * KD, 0x7fc0), w(blocks * C * KD, 0x7fc0), ut(blocks * C * KD, 0x7fc0),
        kd(blocks * C * KD, 0x7fc0), p(blocks * C * C, 0x7fc0), out(ntok * KD, 0x7fc0);
    std::vector<float> gc(blocks * KD, NAN), fin((size_t)B * H * KD * KD, NAN), carry(2 * (size_t)B * H * KD * KD, NAN);
    // inputs must come back bit for bit; every buffer must keep its canary tail
    const auto q0 = q, k0 = k, v0 = v, g0 = g, beta0 = beta;
    const auto alog0 = alog, dt0 = dt, init0 = init;
    const size_t nq = guard(q), nk = guard(k), nv = guard(v), ng = guard(g), nbeta = guard(beta);
    const size_t nalog = guard(alog), ndt = guard(dt), ninit = guard(init);
    const size_t nqg = guard(qg), nw = guard(w), nut = guard(ut), nkd = guard(kd), np_ = guard(p);
    const size_t nout = guard(out), ngc = guard(gc), nfin = guard(fin), ncarry = guard(carry);
    std::mt19937 rng(seed);
    const float scale = 1.f / std::sqrt((float)KD);
    // SEG contiguous chunk ranges, empty ones dropped, as the candidate splits them; each
    // range's prep, then its state walk (so a walk that read a later range's scratch would
    // read NaN), the state carried from range to range through the two halves of `carry`
    std::set<int> bset;
    for (int s = 0; s <= SEG; ++s) bset.insert(NC * s / SEG);
    const std::vector<int> bounds(bset.begin(), bset.end());
    for (size_t i = 0; i + 1 < bounds.size(); ++i) {
        const int c0 = bounds[i], c1 = bounds[i + 1];
        const size_t half = (size_t)B * H * KD * KD;
        const float* s_in = c0 == 0 ? init.data() : carry.data() + (i - 1) % 2 * half;
        float* s_out = c1 == NC ? fin.data() : carry.data() + i % 2 * half;
        g_body = [&] {
            prep_k::kda_prep_kernel(q.data(), k.data(), v.data(), g.data(), beta.data(), alog.data(), dt.data(), T, H,
                                    qg.data(), w.data(), ut.data(), p.data(), kd.data(), gc.data() PREP_EXTRA_ARGS);
        };
        int rc = run_grid(PREP_GRID, 256, prep_k::prep_smem, sizeof prep_k::prep_smem, rng);
        if (rc) return rc;
        g_body = [&] {
            state_k::kda_state_kernel(qg.data(), w.data(), ut.data() STATE_V_ARG, p.data(), kd.data(), gc.data(), s_in,
                                      out.data(), s_out, T, H, NC STATE_EXTRA_ARGS, scale);
        };
        g_wg_smem = state_k::state_smem;
        g_wg_smem_bytes = sizeof state_k::state_smem;
        rc = run_grid({(unsigned)(KD / VB), (unsigned)H, (unsigned)B}, NW * 32, state_k::state_smem,
                      sizeof state_k::state_smem, rng);
        if (rc) return rc;
    }
    bool intact = guard_intact(q, nq, "q") & guard_intact(k, nk, "k") & guard_intact(v, nv, "v")
        & guard_intact(g, ng, "g") & guard_intact(beta, nbeta, "beta") & guard_intact(alog, nalog, "A_log")
        & guard_intact(dt, ndt, "dt_bias") & guard_intact(init, ninit, "initial_state")
        & guard_intact(qg, nqg, "qg") & guard_intact(w, nw, "w") & guard_intact(ut, nut, "ut")
        & guard_intact(kd, nkd, "kd") & guard_intact(p, np_, "p") & guard_intact(gc, ngc, "gc")
        & guard_intact(out, nout, "output") & guard_intact(fin, nfin, "final_state")
        & guard_intact(carry, ncarry, "carry");
    if (!intact) return 6;
    q.resize(nq); k.resize(nk); v.resize(nv); g.resize(ng); beta.resize(nbeta);
    alog.resize(nalog); dt.resize(ndt); init.resize(ninit);
    if (!(q == q0 && k == k0 && v == v0 && g == g0 && beta == beta0 && alog == alog0 && dt == dt0 && init == init0)) {
        std::fprintf(stderr, "the kernels changed their inputs\n");
        return 7;
    }
    out.resize(nout); fin.resize(nfin);
    save(dir, "out.bin", out);
    save(dir, "final.bin", fin);
    return 0;
}
"""


def write_cpu_headers(cand: Path, work: Path) -> None:
    """The candidate's headers with their PTX primitives replaced by CPU versions, in `work`."""
    work.mkdir(parents=True, exist_ok=True)
    tiles = _strip_functions((cand / "kda_tiles.cuh").read_text(),
                             ["pack_bf16x2", "cp_async16", "cp_async_commit", "cp_async_wait",
                              "ldsm_x4", "ldsm_x4_trans", "mma_bf16"])
    tiles = tiles.replace("typedef unsigned short bf16_t;", "")
    tiles = tiles.replace("#pragma once", "#pragma once\n" + PRELUDE + PRIMITIVES + SYNCTHREADS + WGMMA, 1)
    wgmma = _strip_functions((cand / "kda_wgmma.cuh").read_text(),
                             ["wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_async_shared", "wgmma_hold",
                              "wgmma_64x64_rs", "wgmma_64x128_rs_bt", "stsm_x4_trans"])
    assert "asm" not in re.sub(r"//.*", "", wgmma), "a PTX primitive was left in kda_wgmma.cuh"
    (work / "kda_wgmma.cuh").write_text(wgmma)
    (work / "kda_tiles.cuh").write_text(tiles)
    tf32 = _strip_functions((cand / "kda_mma_tf32.cuh").read_text(), ["mma_tf32"])
    assert "asm" not in re.sub(r"//.*", "", tf32), "a PTX primitive was left in kda_mma_tf32.cuh"
    (work / "kda_mma_tf32.cuh").write_text(tf32.replace("#pragma once", MMA_TF32, 1))
    approx = _strip_functions((cand / "kda_approx.cuh").read_text(), ["ex2_ftz", "rcp_ftz"])
    assert "asm" not in re.sub(r"//.*", "", approx), "a PTX primitive was left in kda_approx.cuh"
    (work / "kda_approx.cuh").write_text(approx.replace("#pragma once", APPROX, 1))
    packed = _strip_functions((cand / "kda_bf16x2.cuh").read_text(), ["mul_bf16x2"])   # PRIMITIVES has its CPU form
    assert "asm" not in re.sub(r"//.*", "", packed), "a PTX primitive was left in kda_bf16x2.cuh"
    (work / "kda_bf16x2.cuh").write_text(packed)
    bulk = _strip_functions((cand / "kda_bulk.cuh").read_text(),
                            ["mbar_init", "mbar_fence_init", "mbar_expect_tx", "mbar_wait", "bulk_copy"])
    assert "asm" not in re.sub(r"//.*", "", bulk), "a PTX primitive was left in kda_bulk.cuh"
    (work / "kda_bulk.cuh").write_text(bulk.replace("#pragma once", "#pragma once\n" + BULK, 1))
    k8 = _strip_functions((cand / "kda_mma_k8.cuh").read_text(), ["mma_bf16_k8"])   # PRIMITIVES has its CPU form
    assert "asm" not in re.sub(r"//.*", "", k8), "a PTX primitive was left in kda_mma_k8.cuh"
    (work / "kda_mma_k8.cuh").write_text(k8)
    shutil.copy(cand / "iket.cuh", work / "iket.cuh")


def build(cand: Path, work: Path) -> Path:
    """The CPU build of a rendered two_pass candidate (both kernels); returns the executable."""
    write_cpu_headers(cand, work)
    for src in ("kda_prep.cu", "kda_state.cu"):
        text = (cand / src).read_text()
        assert "asm" not in text, f"{src}: a PTX primitive outside the headers"
        shutil.copy(cand / src, work / src)
    # The persistent prep takes NC and B and runs on a few CTAs that loop over the chunks
    # (three here: each takes several chunks, so both tile pairs and the hand-over are used);
    # the grid tiles prep takes the first chunk of its launch and NC, the wgmma state walk
    # its chunk range. The harness launches them per range [c0, c1).
    prep_src, state_src = (cand / "kda_prep.cu").read_text(), (cand / "kda_state.cu").read_text()
    if "int NC, int B)" in prep_src:
        launch = "#define PREP_EXTRA_ARGS , NC, B\n#define PREP_GRID {3u, 1u, 1u}\n"
    elif "int c_first, int NC)" in prep_src and "h = blockIdx.x" in prep_src:   # every head of a chunk in turn
        launch = "#define PREP_EXTRA_ARGS , c0, NC\n#define PREP_GRID {(unsigned)H, (unsigned)(c1 - c0), (unsigned)B}\n"
    elif "int c_first, int NC)" in prep_src:
        launch = "#define PREP_EXTRA_ARGS , c0, NC\n#define PREP_GRID {(unsigned)(c1 - c0), (unsigned)H, (unsigned)B}\n"
    else:
        launch = "#define PREP_EXTRA_ARGS\n#define PREP_GRID {(unsigned)NC, (unsigned)H, (unsigned)B}\n"
    # the tiles prep takes the factor of 1/|q|: the attention scale where the walk leaves it out
    # of its output (as the candidate's host passes it), 1 otherwise
    if "float qscale," in prep_src:
        qscale = "scale" if "scale = 1.f;   // the tiles prep folded it" in state_src else "1.f"
        launch = launch.replace("#define PREP_EXTRA_ARGS", f"#define PREP_EXTRA_ARGS , {qscale}", 1)
    launch += ("#define STATE_EXTRA_ARGS , c0, c1\n" if "int c_begin, int c_end," in state_src
               else "#define STATE_EXTRA_ARGS\n")
    # the walk that forms ut = T v reads the inputs' v (and the prep writes T where ut goes)
    launch += ("#define STATE_V_ARG , v.data()\n" if "const bf16_t* __restrict__ v," in state_src
               else "#define STATE_V_ARG\n")
    return compile_harness(work, "#include <set>\n" + launch + HARNESS, "kda_two_pass_cpu")


def run_case(exe: Path, work: Path, B, T, H, regime, seed, v_block, state_warps, segments=1):
    inputs = write_case(work, B, T, H, regime, seed)
    res = subprocess.run([str(exe), str(work), str(B), str(T), str(H), str(seed), str(v_block), str(state_warps),
                          str(segments)],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"rc={res.returncode}: {res.stderr[-2000:]}"
    check_case(work, inputs, B, T, H, regime)


# Points at T = 1, 17, 65, 129 (H = 1) and the gate at its -5 floor; the first design (the
# one measured first on a GPU) as a control of the harness itself.
ALL_T = [(1, 1, 1, "scored"), (1, 17, 1, "scored"), (1, 65, 1, "scored"), (1, 129, 1, "scored"),
         (1, 129, 1, "saturated")]
CTA = {"state_step": "cta", "prep_smem": "full", "stages": 1}   # the first design, measured first
WL = {"state_step": "warp_local", "stages": 2, "out_store": "inline"}   # the defaults before the wgmma step
POINTS = [
    (CTA, [(1, 65, 1, "scored"), (1, 129, 1, "saturated")]),
    ({**WL, "prep_smem": "full"}, ALL_T + [(2, 33, 1, "switch")]),
    ({**WL, "prep_smem": "full", "stages": 1}, ALL_T),
    ({**WL, "v_block": 64, "state_warps": 4, "stages": 1}, ALL_T),
    ({**WL, "v_block": 64, "state_warps": 4, "stages": 2}, ALL_T),
    ({**CTA, "prep_smem": "lean"}, ALL_T + [(2, 33, 1, "switch")]),
    (WL, ALL_T + [(2, 33, 1, "switch"), (1, 129, 2, "scored"), (1, 200, 1, "saturated")]),   # tiles, uo_blocks 2
    ({**WL, "uo_blocks": 1}, ALL_T + [(2, 33, 1, "switch")]),
    ({**WL, "prep_smem": "lean", "uo_blocks": 1}, [(1, 129, 2, "scored"), (1, 200, 1, "saturated")]),   # run 5's best
    ({**NOT_BULK, "stages": 3}, ALL_T + [(2, 33, 1, "switch")]),   # the defaults before bulk loads
    # the defaults: bulk loads on two ring slots
    ({}, ALL_T + [(2, 200, 1, "switch"), (1, 200, 2, "saturated"), (1, 600, 1, "scored"), (1, 65, 2, "scored")]),
    ({**NOT_BULK, "stages": 1, "v_block": 64, "state_warps": 4}, [(1, 129, 1, "scored")]),
    ({**NOT_BULK, "prep_schedule": "persistent"}, [(1, 200, 1, "saturated"), (2, 129, 2, "scored"), (1, 17, 1, "scored")]),
    # the sequence in chunk ranges, each prepared and walked in turn (the state carried
    # between walks): ranges of one chunk and of several, boundaries inside the sequence,
    # a last chunk cut short, fewer chunks than ranges (T = 17, 129 with 4 or 8)
    ({"segments": 2}, [(2, 129, 1, "scored"), (2, 200, 1, "saturated"), (2, 257, 1, "scored"), (1, 17, 1, "scored")]),
    ({"segments": 4}, [(2, 129, 1, "scored"), (2, 200, 1, "switch"), (2, 257, 1, "scored"), (1, 17, 1, "scored")]),
    ({"segments": 4, "out_store": "deferred"}, [(2, 257, 1, "scored"), (2, 200, 1, "saturated")]),
    ({"segments": 8, "stages": 2}, [(1, 600, 1, "scored"), (2, 129, 1, "scored")]),
    ({"segments": 8, "stages": 1, "v_block": 64, "state_warps": 4}, [(2, 257, 1, "scored")]),
    # the inverse's other ways (the defaults: diagonal blocks inside the products stage, tf32
    # block products, subnormals flushed): a separate diagonal solve, fp32 products, exact
    ({"diag_inverse": "after_blocks"}, [(1, 129, 1, "scored"), (2, 33, 1, "switch")]),
    ({"inverse_products": "fp32"}, [(1, 129, 1, "scored"), (2, 33, 1, "switch")]),
    ({"diag_inverse": "after_blocks", "inverse_products": "fp32", "flush_denormals": 0},
     ALL_T + [(2, 200, 1, "switch")]),
    # the prep's CTA orders: a head's chunks in turn (the defaults before), every head of a
    # chunk in turn (H = 2: the launch's x is the head), with and without chunk ranges
    ({"prep_order": "by_head"}, [(1, 129, 2, "scored"), (2, 200, 1, "saturated")]),
    ({"prep_order": "by_chunk"}, [(1, 129, 2, "scored"), (2, 200, 1, "switch")]),
    ({"segments": 4}, [(2, 257, 2, "scored")]),
    # the elementwise stage on packed bf16 pairs
    ({**NOT_BULK, "elementwise": "bf16x2"}, ALL_T + [(2, 200, 1, "switch"), (1, 200, 1, "saturated")]),
    # ut = T v formed by the state walk from T and the inputs' v (rows past the end zeroed),
    # the next chunk's behind each update: with inline and deferred stores, in chunk ranges
    # (ranges of one chunk and more), and beside the persistent prep
    ({**NOT_BULK, "ut_product": "state", "stages": 2}, ALL_T + [(2, 200, 1, "switch"), (1, 200, 2, "saturated")]),
    ({"ut_product": "state", "stages": 2, "out_store": "deferred"}, [(1, 129, 1, "scored"), (2, 65, 1, "switch")]),
    ({**NOT_BULK, "ut_product": "state", "stages": 2, "segments": 4}, [(2, 257, 1, "scored"), (1, 17, 1, "scored")]),
    ({"ut_product": "state", "stages": 2, "prep_schedule": "persistent"}, [(2, 129, 2, "scored")]),
    # bulk loads: the prep writes the ring's image (qg, kd, w, ut swizzled; P by k-step), the
    # walk copies each tile whole on an mbarrier: every ring depth, two CTAs per head (ut's
    # second panel), deferred stores, chunk ranges, the persistent prep, packed elementwise
    ({"walk_loads": "bulk", "stages": 3}, [(1, 129, 1, "scored"), (2, 65, 1, "switch")]),
    ({"walk_loads": "bulk", "stages": 2, "out_store": "deferred"}, [(1, 129, 1, "scored"), (2, 65, 1, "switch")]),
    ({"walk_loads": "bulk", "stages": 1, "v_block": 64, "state_warps": 4}, [(1, 129, 1, "scored"), (1, 65, 2, "saturated")]),
    ({**NOT_BULK, "segments": 4}, [(2, 257, 1, "scored"), (1, 17, 1, "scored")]),
    ({"walk_loads": "bulk", "prep_schedule": "persistent"}, [(2, 129, 2, "scored")]),
    ({"walk_loads": "bulk", "elementwise": "bf16x2"}, [(2, 129, 1, "switch"), (1, 200, 1, "saturated")]),
    # and where the walk forms ut: T by k-step, v row by row (only the rows before the end)
    ({"walk_loads": "bulk", "ut_product": "state", "stages": 2}, ALL_T + [(2, 200, 1, "switch"), (1, 600, 1, "scored")]),
    ({"walk_loads": "bulk", "ut_product": "state", "stages": 2, "v_block": 64, "state_warps": 4, "out_store": "deferred"},
     [(1, 129, 1, "scored"), (2, 65, 1, "saturated")]),
    ({"walk_loads": "bulk", "ut_product": "state", "stages": 2, "segments": 4}, [(2, 257, 1, "scored"), (1, 17, 1, "scored")]),
    # w's decay applied to its B fragments in registers: the grid and persistent schedules, and
    # with ut formed by the walk (w the prep's only product)
    ({"w_gamma": "fragments"}, ALL_T + [(2, 200, 1, "switch"), (1, 65, 2, "scored")]),
    ({"w_gamma": "fragments", "prep_schedule": "persistent"}, [(2, 129, 2, "scored"), (1, 200, 1, "saturated")]),
    ({"w_gamma": "fragments", "ut_product": "state", "stages": 2}, [(1, 129, 1, "scored"), (2, 65, 1, "switch")]),
    # T written in bf16 by the inverse's own stores: both engines, with w's decay in registers,
    # and the walk that copies T's whole rows (so its zero blocks) and forms ut
    ({"t_bf16": "direct"}, ALL_T + [(2, 200, 1, "switch"), (1, 65, 2, "scored")]),
    ({"t_bf16": "direct", "inverse_products": "fp32", "w_gamma": "fragments"}, [(1, 129, 1, "scored"), (2, 65, 1, "switch")]),
    ({**NOT_BULK, "t_bf16": "direct", "ut_product": "state", "stages": 2}, [(1, 129, 1, "scored"), (2, 200, 1, "saturated")]),
    # the tensor-core norms from one ldmatrix pass, beside the persistent prep's next-chunk loads
    ({"row_norms": "tensor_cores_once", "w_gamma": "fragments", "t_bf16": "direct"}, ALL_T + [(2, 65, 1, "switch")]),
    ({"row_norms": "tensor_cores_once", "prep_schedule": "persistent"}, [(2, 129, 2, "scored")]),
]
POINTS = [(for_prep(o), cases) for o, cases in POINTS]
IDS = ["cta_full_s1", "warp_local_vb128_s2", "warp_local_vb128_s1", "warp_local_vb64_s1", "warp_local_vb64_s2",
       "cta_lean_s1", "warp_local_tiles", "uo_blocks_1", "lean_warp_local", "cp_async_s3", "defaults",
       "cp_async_vb64_s1", "cp_async_persistent", "segments_2", "segments_4", "segments_4_deferred", "segments_8_s2",
       "segments_8_vb64_s1", "diag_after_blocks", "inverse_fp32", "inverse_fp32_exact",
       "by_head", "by_chunk", "descending_segments_h2", "cp_async_bf16x2",
       "ut_state_cp_async", "ut_state_deferred", "cp_async_ut_state_segments_4", "ut_state_persistent",
       "bulk_s3", "bulk_s2_deferred", "bulk_vb64_s1", "cp_async_segments_4", "bulk_persistent", "bulk_bf16x2",
       "bulk_ut_state", "bulk_ut_state_vb64_deferred", "bulk_ut_state_segments_4",
       "w_gamma_fragments", "w_gamma_fragments_persistent", "w_gamma_fragments_ut_state",
       "t_bf16_direct", "t_bf16_direct_fp32_w_gamma", "t_bf16_direct_cp_async_ut_state",
       "norms_once_w_gamma_t_bf16", "norms_once_persistent"]


@pytest.mark.parametrize("overrides, cases", POINTS, ids=IDS)
def test_kernel_sources_on_cpu(render_point, tmp_path, overrides, cases):
    cand, fam = render_point("two_pass", **overrides)
    params = {**fam.defaults, **overrides}
    exe = build(cand, tmp_path / "cpu")
    for i, (B, T, H, regime) in enumerate(cases):
        run_case(exe, tmp_path / "cpu", B, T, H, regime, 200 + i, params["v_block"], params["state_warps"],
                 params["segments"])


# w_gamma = "fragments" forms each of w's operand values as the tile pass does (the bf16 Ak
# value times e^(B_j) in fp32, rounded once), and t_bf16 = "direct" rounds each fp32 value of
# T to bf16 once, as the conversion pass does: the outputs must match the first way's bit for
# bit. The regimes above decay every channel alike, so a factor taken from the wrong column
# would pass unseen; here each channel decays at a rate of its own.
SAME_BITS = [("w_gamma", {}), ("w_gamma", {"prep_schedule": "persistent"}),
             ("w_gamma", {"ut_product": "state", "stages": 2, "inverse_products": "fp32"}),
             ("t_bf16", {}), ("t_bf16", {"inverse_products": "fp32", "w_gamma": "fragments"}),
             ("t_bf16", {**NOT_BULK, "ut_product": "state", "stages": 2}),
             ("row_norms", {}), ("row_norms", {"prep_schedule": "persistent"})]
WAYS = {"w_gamma": ("tile", "fragments"), "t_bf16": ("converted", "direct"),
        "row_norms": ("tensor_cores", "tensor_cores_once")}


@pytest.mark.parametrize("knob, overrides", [(k, for_prep(o)) for k, o in SAME_BITS],
                         ids=["w_gamma", "w_gamma_persistent", "w_gamma_ut_state_fp32", "t_bf16", "t_bf16_fp32_w_gamma",
                              "t_bf16_cp_async_ut_state", "norms_once", "norms_once_persistent"])
def test_new_ways_change_no_output_bit(render_point, tmp_path, knob, overrides):
    B, T, H, seed = 2, 129, 2, 7
    outputs = []
    for way in WAYS[knob]:
        cand, fam = render_point("two_pass", **overrides, **{knob: way})
        params = {**fam.defaults, **overrides}
        work = tmp_path / way
        exe = build(cand, work)
        write_case(work, B, T, H, "scored", seed)
        rng = np.random.default_rng(seed)   # per-channel decays from about -0.03 to -2.5 a token
        _bits(rng.normal(size=(B, T, H, K)) * 0.3).tofile(work / "g.bin")
        np.zeros(H, np.float32).tofile(work / "A_log.bin")
        np.float32(rng.uniform(-5, 0, H * K)).tofile(work / "dt_bias.bin")
        res = subprocess.run([str(exe), str(work), str(B), str(T), str(H), str(seed), str(params["v_block"]),
                              str(params["state_warps"]), str(params["segments"])],
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"rc={res.returncode}: {res.stderr[-2000:]}"
        outputs.append([(work / name).read_bytes() for name in ("out.bin", "final.bin")])
    assert outputs[0] == outputs[1]
