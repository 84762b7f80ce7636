"""Run the rendered fused_tiles kernel on the CPU, thread by thread.

Same method as the two_pass emulation (whose CPU primitives it reuses): the real
`kda_fused_tiles.cu` is compiled with g++, with only ldmatrix, mma, wgmma, cp.async, bf16
packing, named barriers and setmaxnreg replaced by CPU versions of their PTX semantics. Each
of the 512 CUDA threads is a fiber and warps drift at random, one far behind, so the prep's
warps run ahead of the walk's or fall behind it; shared memory starts as NaN, the outputs are
NaN-poisoned, every buffer has a canary tail and the inputs must come back bit for bit. A
slot refilled before the walk is done with it, or read before the prep has filled it, shows
up as a wrong result; a barrier left with arrivals or a deadlock fails the run. The result is
checked against the float64 recurrence with the judge's bounds, and against the two_pass
point with the same prep ways bit for bit: the same sources, handed over in shared memory
instead of global memory, must compute the same bits. It cannot check timing, races the
cooperative schedule hides, or register limits (test_fused_tiles_compile.py).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from .conftest import FUSED_TILES_BEYOND
from .test_fused_cpu_emulation import DRIVER, GXX, READ_CASE, _bits, _strip_functions, check_case, compile_harness, write_case
from .test_two_pass_cpu_emulation import build as build_two_pass
from .test_two_pass_cpu_emulation import write_cpu_headers

pytestmark = pytest.mark.skipif(GXX is None, reason="g++ not installed")
K = 128

# kda_roles.cuh and kda_prefetch.cuh: which registers a role holds, and what L2 holds, are no
# matter to a CPU
ROLES = r"""
#pragma once
template <int REGS> __device__ __forceinline__ void registers_release() {}
template <int REGS> __device__ __forceinline__ void registers_claim() {}
"""
PREFETCH = r"""
#pragma once
__device__ __forceinline__ void prefetch_l2(const void*) {}
"""
# kda_side.cuh's hand-over: the side grid runs to its end before the fused grid starts, so a
# flag that does not hold the epoch when a walk reads it is a chunk never prepared (or flagged
# under the wrong index), not a race: the run fails
SIDE = r"""
inline void __threadfence() {}
__device__ __forceinline__ void flag_release(unsigned* flag, unsigned value) { *flag = value; }
__device__ __forceinline__ void flag_wait(const unsigned* flag, unsigned value) {
    if (*flag != value) { std::fprintf(stderr, "a walk found a side chunk's flag at %u, not %u\n", *flag, value); std::abort(); }
}
// side_poll's test reports every other flag unset, so the walk's late copy (after its step) runs too
static unsigned flag_tests = 0;
__device__ __forceinline__ bool flag_test(const unsigned* flag, unsigned value) {
    if (++flag_tests & 1) return false;
    flag_wait(flag, value);
    return true;
}
"""

HARNESS = r"""
#include "kda_side_prep.cu"
#include "kda_fused_tiles.cu"
#include <vector>
alignas(1024) unsigned char smem[fused::SMEM_BYTES];
alignas(1024) unsigned char side_smem[side_team::TEAMS * side_team::SMEM_BYTES];
constexpr int K = 128;
""" + DRIVER + r"""
int main(int argc, char** argv) {
""" + READ_CASE + r"""    if (argc > 7) { g_laggard = std::atoi(argv[6]); g_lag_period = std::atoi(argv[7]); }   // (warp, period)
    const auto q0 = q, k0 = k, v0 = v, g0 = g, beta0 = beta;
    const auto alog0 = alog, dt0 = dt, init0 = init;
    const size_t nq = guard(q), nk = guard(k), nv = guard(v), ng = guard(g), nbeta = guard(beta);
    const size_t nalog = guard(alog), ndt = guard(dt), ninit = guard(init), nout = guard(out), nfin = guard(fin);
    const float scale = 1.f / std::sqrt((float)K);
    std::mt19937 rng(seed);
    // The side kernel's scratch, a block for each side chunk only (NaN: a tile it never wrote
    // poisons the walk's result), and flags, each with a canary tail (a block past the side
    // chunks' breaks it); three side CTAs, so the teams take turns over the chunks.
    const int NC = (T + 63) / 64;
    const size_t blocks = (size_t)B * H * (NC * SIDE_N / 16);
    std::vector<bf16_t> sqg(blocks * 64 * K, 0xffff), sw(blocks * 64 * K, 0xffff), sut(blocks * 64 * K, 0xffff);
    std::vector<bf16_t> skd(blocks * 64 * K, 0xffff), sp(blocks * 2560, 0xffff);
    std::vector<float> sgc(blocks * K, NAN);
    std::vector<unsigned> flags(blocks, 0u);
    const size_t nsqg = guard(sqg), nsw = guard(sw), nsut = guard(sut), nskd = guard(skd), nsp = guard(sp);
    const size_t nsgc = guard(sgc), nflags = guard(flags);
    const unsigned epoch = 7;
    if (SIDE_N) {
        g_body = [&] {
            kda_side_prep_kernel(q.data(), k.data(), v.data(), g.data(), beta.data(), alog.data(), dt.data(), T, H, B,
                                 NC, SIDE_N, sqg.data(), sw.data(), sut.data(), sp.data(), skd.data(), sgc.data(),
                                 flags.data(), epoch, scale);
        };
        g_wg_smem = side_smem;
        g_wg_smem_bytes = sizeof side_smem;
        int rc = run_grid({3u, 1u, 1u}, side_team::TEAMS * side_team::TEAM_THREADS, side_smem, sizeof side_smem, rng);
        if (rc) return rc;
    }
    if (!(guard_intact(sqg, nsqg, "side qg") & guard_intact(sw, nsw, "side w") & guard_intact(sut, nsut, "side ut")
          & guard_intact(skd, nskd, "side kd") & guard_intact(sp, nsp, "side p") & guard_intact(sgc, nsgc, "side gc")
          & guard_intact(flags, nflags, "flags")))
        return 6;
    g_body = [&] {
        kda_fused_kernel(q.data(), k.data(), v.data(), g.data(), beta.data(), alog.data(), dt.data(), init.data(),
                         out.data(), fin.data(), T, H, scale, sqg.data(), sw.data(), sut.data(), sp.data(), skd.data(),
                         sgc.data(), flags.data(), SIDE_N, epoch);
    };
    g_wg_smem = smem;
    g_wg_smem_bytes = sizeof smem;
    int rc = run_grid({(unsigned)H, (unsigned)B, 1u}, fused::NTH, smem, sizeof smem, rng);
    if (rc) return rc;
    bool intact = guard_intact(q, nq, "q") & guard_intact(k, nk, "k") & guard_intact(v, nv, "v")
        & guard_intact(g, ng, "g") & guard_intact(beta, nbeta, "beta") & guard_intact(alog, nalog, "A_log")
        & guard_intact(dt, ndt, "dt_bias") & guard_intact(init, ninit, "initial_state")
        & guard_intact(out, nout, "output") & guard_intact(fin, nfin, "final_state");
    if (!intact) return 6;
    q.resize(nq); k.resize(nk); v.resize(nv); g.resize(ng); beta.resize(nbeta);
    alog.resize(nalog); dt.resize(ndt); init.resize(ninit);
    if (!(q == q0 && k == k0 && v == v0 && g == g0 && beta == beta0 && alog == alog0 && dt == dt0 && init == init0)) {
        std::fprintf(stderr, "the kernel changed its inputs\n");
        return 7;
    }
    out.resize(nout); fin.resize(nfin);
    save(dir, "out.bin", out);
    save(dir, "final.bin", fin);
    return 0;
}
"""


def build(cand: Path, work: Path) -> Path:
    """The CPU build of a rendered fused_tiles candidate; returns the executable."""
    write_cpu_headers(cand, work)
    warpspec = _strip_functions((cand / "kda_warpspec.cuh").read_text(),
                                ["named_bar_sync", "named_bar_arrive", "opaque_ptr", "opaque_int"])
    roles = (cand / "kda_roles.cuh").read_text()
    assert "asm" not in re.sub(r"//.*", "", warpspec), "a PTX primitive was left in kda_warpspec.cuh"
    assert "registers_release" in roles and "registers_claim" in roles
    (work / "kda_warpspec.cuh").write_text(warpspec)
    (work / "kda_roles.cuh").write_text(ROLES)
    prefetch = _strip_functions((cand / "kda_prefetch.cuh").read_text(), ["prefetch_l2"])
    assert "asm" not in re.sub(r"//.*", "", prefetch), "a PTX primitive was left in kda_prefetch.cuh"
    (work / "kda_prefetch.cuh").write_text(prefetch.replace("#pragma once", PREFETCH, 1))
    side = _strip_functions((cand / "kda_side.cuh").read_text(), ["flag_release", "flag_test", "flag_wait"])
    assert "asm" not in re.sub(r"//.*", "", side), "a PTX primitive was left in kda_side.cuh"
    (work / "kda_side.cuh").write_text(side.replace("#pragma once", "#pragma once\n" + SIDE, 1))
    for src in ("kda_fused_tiles.cu", "kda_side_prep.cu"):
        text = (cand / src).read_text()
        assert "asm" not in re.sub(r"//.*", "", text), f"{src}: a PTX primitive outside the headers"
        shutil.copy(cand / src, work / src)
    side_n = int(re.search(r"^SIDE = (\d+)", (cand / "solution.py").read_text(), re.M).group(1))
    return compile_harness(work, f"constexpr int SIDE_N = {side_n};\n" + HARNESS, "kda_fused_tiles_cpu")


def run(exe: Path, work: Path, B, T, H, seed, lag: tuple[int, int] | None = None) -> None:
    """One case; `lag` = (warp, period) pins the lagging warp (else one drawn per CTA)."""
    res = subprocess.run([str(exe), str(work), str(B), str(T), str(H), str(seed), *map(str, lag or ())],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"rc={res.returncode}: {res.stderr[-2000:]}"


# T = 1 (one chunk, cut short), 65 and 129 (two and three slots' worth, so each slot is
# refilled), the gate at its -5 floor, two batches, two heads
CASES = [(1, 1, 1, "scored"), (1, 65, 1, "scored"), (1, 129, 1, "saturated"), (2, 70, 2, "switch")]
POINTS = [
    ({}, CASES),
    ({"stages": 1, "side_sixteenths": 0, "l2_prefetch": 0}, [(1, 129, 1, "scored"), (2, 65, 1, "switch")]),
    ({"stages": 1, "side_sixteenths": 0, "prefetch_inputs": 1, "l2_prefetch": 1, "w_u_in_slot": 0, "early_qk": 0}, [(1, 1, 1, "scored"), (1, 200, 1, "saturated"),
                                                            (2, 129, 2, "switch")]),
    ({"out_store": "deferred", "l2_prefetch": 1}, [(1, 129, 1, "scored"), (1, 1, 2, "scored"), (2, 70, 1, "switch")]),
    ({"w_gamma": "fragments", "t_bf16": "direct", "row_norms": "tensor_cores_once", "w_u_in_slot": 0, "early_qk": 0}, [(1, 200, 1, "saturated")]),
    ({"diag_inverse": "after_blocks", "inverse_products": "fp32", "flush_denormals": 0, "elementwise": "bf16x2",
      "row_norms": "cuda_cores", "walk_regs": 200}, [(2, 129, 1, "scored")]),
    # the defaults take 6 of 16 chunks from the side kernel (T = 129: chunk 2, the last); with
    # none, the fused prep takes every chunk. The side points' side chunks: 2, 5 (T = 321, cut
    # short), over two heads and two batches, so the side teams' turns cross heads and batches
    ({"side_sixteenths": 0}, [(1, 65, 1, "scored"), (1, 129, 2, "saturated"), (2, 321, 2, "switch")]),
    ({"side_sixteenths": 8, "out_store": "deferred", "l2_prefetch": 0}, [(1, 200, 1, "scored"), (2, 257, 1, "switch")]),
    ({"side_sixteenths": 4, "elementwise": "bf16x2", "w_gamma": "fragments", "t_bf16": "direct", "w_u_in_slot": 0, "early_qk": 0},
     [(1, 321, 2, "scored")]),
    # the defaults write w and ut over their operands in the slot and take the next chunk's q and
    # k early (past a side chunk, and none after the last); without early_qk; the staged way
    ({"early_qk": 0}, [(1, 129, 1, "scored"), (2, 70, 2, "switch")]),
    ({"w_u_in_slot": 0, "early_qk": 0}, CASES + [(1, 321, 1, "scored")]),
    ({"side_sixteenths": 0, "elementwise": "bf16x2", "t_bf16": "direct"}, [(1, 200, 1, "saturated"), (2, 129, 2, "switch")]),
    # sixteenths that no eighth gives: 5 (side chunks 3, 6, 9, ...) and 7 (2, 4, 6, 9, ...)
    ({"side_sixteenths": 5}, [(1, 640, 2, "scored"), (2, 200, 1, "switch")]),
    ({"side_sixteenths": 7, "w_u_in_slot": 0, "early_qk": 0}, [(1, 640, 1, "scored")]),
    # side_poll: every other side chunk's flag reads unset as the chunk before it begins, so its
    # copy is issued after that chunk's step
    ({"side_poll": 1, "side_sixteenths": 5}, [(1, 640, 1, "scored"), (2, 200, 1, "switch")]),
    # the block products' k-steps two a pass in both kernels (the defaults: one), two in the fused kernel alone
    ({"blocks_unroll": 2, "side_blocks_unroll": 2}, [(1, 129, 1, "scored"), (2, 70, 2, "switch")]),
    ({"blocks_unroll": 2, "side_sixteenths": 0}, [(1, 129, 1, "saturated")]),
    # the elementwise rows rolled, four a pass (the gate values shifting down), in both kernels
    ({"elementwise_unroll": 4}, [(1, 129, 1, "scored"), (2, 70, 2, "switch")]),
    ({"elementwise_unroll": 4, "elementwise": "bf16x2", "side_blocks_unroll": 2}, [(1, 321, 1, "saturated")]),
    # the side teams prefetching their next chunk (a no-op on the CPU: its index math compiles and runs)
    ({"side_l2_prefetch": 1, "side_sixteenths": 5}, [(2, 640, 3, "scored")]),
    # the gate inputs copied early into w_u's free tile: each chunk's as the one before it runs
    # its w_u (past a side chunk, none after the last), with T's or the inverse's ways
    ({"early_gate": 1}, [(1, 129, 1, "scored"), (2, 70, 2, "switch")]),
    ({"early_gate": 1, "side_sixteenths": 0, "t_bf16": "direct"}, [(1, 200, 1, "saturated")]),
    ({"early_gate": 1, "early_qk": 0, "side_sixteenths": 5}, [(1, 640, 1, "scored")]),
    # two side teams a CTA (at more registers), prefetching, beside the early gate
    ({"side_teams": 2, "side_l2_prefetch": 1, "early_gate": 1, "side_sixteenths": 7}, [(1, 640, 2, "scored")]),
]


@pytest.mark.parametrize("overrides, cases", POINTS,
                         ids=["defaults", "stages1_no_l2_prefetch", "stages1_prefetch", "deferred", "new_prep_ways", "other_prep_ways",
                              "no_side", "side8_deferred", "side4_prep_ways", "no_early_qk", "staged", "no_side_bf16x2_direct",
                              "side5", "side7_staged", "side5_poll", "unroll2", "blocks_unroll2_no_side",
                              "elementwise_unroll4", "elementwise_unroll4_bf16x2_side_unroll2", "side5_l2_prefetch",
                              "early_gate", "early_gate_no_side_direct", "early_gate_no_early_qk_side5",
                              "side_teams2_l2_prefetch_early_gate_side7"])
def test_kernel_source_on_cpu(render_point, tmp_path, overrides, cases):
    cand, _ = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)
    exe = build(cand, tmp_path / "cpu")
    for i, (B, T, H, regime) in enumerate(cases):
        inputs = write_case(tmp_path / "cpu", B, T, H, regime, 300 + i)
        run(exe, tmp_path / "cpu", B, T, H, 300 + i)
        check_case(tmp_path / "cpu", inputs, B, T, H, regime)


# One role far behind the other, so each hand-over is tested at its edge: a walk warp that
# runs one pass in 64 (the prep, unthrottled, would refill a slot the walk still reads), or
# a prep warp (the walk, unthrottled, would read a slot before the prep has filled it).
@pytest.mark.parametrize("overrides, lag", [({}, (9, 64)), ({}, (14, 256)), ({}, (3, 64)),
                                             ({"stages": 1, "side_sixteenths": 0, "prefetch_inputs": 1, "w_u_in_slot": 0, "early_qk": 0}, (12, 64)),
                                             ({"stages": 1, "side_sixteenths": 0, "prefetch_inputs": 1, "w_u_in_slot": 0, "early_qk": 0}, (5, 64)),
                                             ({"side_sixteenths": 0}, (9, 64)), ({"side_sixteenths": 8}, (3, 64)),
                                             ({"w_u_in_slot": 0, "early_qk": 0}, (3, 64)), ({"side_sixteenths": 0}, (5, 64)),
                                             ({"side_poll": 1}, (9, 64)), ({"side_poll": 1}, (3, 64)),
                                             ({"early_gate": 1}, (3, 64)), ({"early_gate": 1}, (9, 64))],
                         ids=["walk_warp_9", "walk_warp_14", "prep_warp_3", "one_slot_walk_warp_12",
                              "one_slot_prep_warp_5", "no_side_walk_warp_9", "side8_prep_warp_3",
                              "staged_prep_warp_3", "no_side_prep_warp_5", "side_poll_walk_warp_9", "side_poll_prep_warp_3",
                              "early_gate_prep_warp_3", "early_gate_walk_warp_9"])
def test_hand_over_with_one_role_behind(render_point, tmp_path, overrides, lag):
    cand, _ = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)
    exe = build(cand, tmp_path / "cpu")
    B, T, H, regime = 1, 321, 1, "scored"
    inputs = write_case(tmp_path / "cpu", B, T, H, regime, 400)
    run(exe, tmp_path / "cpu", B, T, H, 400, lag)
    check_case(tmp_path / "cpu", inputs, B, T, H, regime)


PREP_WAYS = ("diag_inverse", "inverse_products", "flush_denormals", "elementwise", "row_norms", "w_gamma", "t_bf16")


@pytest.mark.parametrize("overrides", [{}, {"elementwise": "bf16x2", "w_gamma": "fragments", "t_bf16": "direct", "w_u_in_slot": 0, "early_qk": 0},
                                       {"side_sixteenths": 0}, {"w_u_in_slot": 0, "early_qk": 0},
                                       {"early_qk": 0, "elementwise": "bf16x2", "t_bf16": "direct", "side_sixteenths": 0},
                                       {"side_poll": 1}, {"blocks_unroll": 2, "side_blocks_unroll": 2},
                                       {"elementwise_unroll": 4}, {"early_gate": 1}],
                         ids=["defaults", "bf16x2_fragments_direct_staged", "no_side", "staged", "no_early_qk_bf16x2_no_side",
                              "side_poll", "unroll2", "elementwise_unroll4", "early_gate"])
def test_same_bits_as_two_pass(render_point, tmp_path, overrides):
    """The fused kernel runs the two_pass prep and walk sources on the same data: its output
    and final state must be those of the two_pass point with the same ways, bit for bit (with
    side chunks too, whose tiles come through global scratch from the side kernel's prep)."""
    B, T, H, seed = 1, 150, 2, 11
    fused, fam = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)
    params = {**fam.defaults, **overrides}
    same = {k: params[k] for k in PREP_WAYS} | {"out_store": params["out_store"], "stages": 2}
    two_pass, _ = render_point("two_pass", **same)
    results = []
    for name, cand, builder in (("fused", fused, build), ("two_pass", two_pass, build_two_pass)):
        work = tmp_path / name
        exe = builder(cand, work)
        write_case(work, B, T, H, "scored", seed)
        rng = np.random.default_rng(seed)   # a decay rate per channel, as the two_pass bit tests use
        _bits(rng.normal(size=(B, T, H, K)) * 0.3).tofile(work / "g.bin")
        np.zeros(H, np.float32).tofile(work / "A_log.bin")
        np.float32(rng.uniform(-5, 0, H * K)).tofile(work / "dt_bias.bin")
        args = [str(exe), str(work), str(B), str(T), str(H), str(seed)]
        if name == "two_pass":
            args += ["128", "8", "1"]   # v_block, state_warps, segments
        res = subprocess.run(args, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"{name}: rc={res.returncode}: {res.stderr[-2000:]}"
        results.append([(work / f).read_bytes() for f in ("out.bin", "final.bin")])
    assert results[0] == results[1]
