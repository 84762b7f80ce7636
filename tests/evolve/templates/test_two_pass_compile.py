"""two_pass family: admissible points render and compile for sm_90a without spills,
inadmissible points are rejected before rendering, and IKET costs nothing when off."""
from __future__ import annotations

import pytest

from .conftest import NOT_BULK, NOT_TILES, TEMPLATES, compile_cubin, compile_ptx, for_prep, needs_nvcc, parse_ptxas

# (overrides, register bound for the state kernel); the prep kernel is capped at 128
# registers by its launch bounds (two CTAs of 256 threads per SM), at 80 with
# prep_smem = "lean" or "tiles" (three CTAs per SM).
CTA = {"state_step": "cta", "prep_smem": "full", "stages": 1}   # the first measured design
WL = {"state_step": "warp_local", "stages": 2, "out_store": "inline"}   # the defaults before the wgmma step
POINTS = [
    ({}, 232),   # the defaults: wgmma state step fed by bulk copies on two ring slots, tiles prep, inline stores
    (WL, 255),
    (CTA, 255),
    ({**CTA, "v_block": 64, "state_warps": 4}, 255),
    ({**CTA, "v_block": 32, "state_warps": 8}, 200),
    ({**CTA, "v_block": 64, "stages": 2}, 255),
    ({**CTA, "stages": 2}, 255),
    ({**WL, "prep_smem": "full"}, 255),
    ({"state_step": "warp_local", "prep_smem": "full", "stages": 1}, 255),
    ({"state_step": "warp_local", "v_block": 64, "state_warps": 4, "stages": 1}, 255),
    ({"state_step": "warp_local", "v_block": 64, "state_warps": 4, "stages": 2}, 255),
    ({**CTA, "prep_smem": "lean"}, 255),
    ({**WL, "prep_smem": "lean", "uo_blocks": 2}, 255),
    ({**WL, "uo_blocks": 1}, 255),
    ({**WL, "v_block": 64, "state_warps": 4, "stages": 1, "uo_blocks": 1}, 255),
    ({"state_step": "wgmma", "stages": 1, "prep_smem": "lean"}, 232),
    ({"state_step": "wgmma", "v_block": 64, "state_warps": 4}, 232),
    ({"state_step": "wgmma", "stages": 3, "out_store": "inline"}, 232),   # three slots fit only here
    ({**NOT_BULK, "stages": 3}, 232),   # the defaults before bulk loads: cp.async copies, three slots
    ({**NOT_BULK, "stages": 2}, 232),
    ({**NOT_BULK, "prep_schedule": "persistent"}, 232),   # the prep looping over chunks, two CTAs per SM
    ({**WL, "prep_schedule": "persistent"}, 255),
    ({"segments": 4}, 232),   # the same kernels as the defaults, launched per chunk range
    ({**NOT_BULK, "segments": 2, "out_store": "deferred"}, 232),
    # the inverse's ways (the defaults take all three new ones): fp32 products, a separate diagonal solve, exact subnormals
    ({"diag_inverse": "after_blocks", "inverse_products": "fp32", "flush_denormals": 0}, 232),
    ({"diag_inverse": "after_blocks"}, 232),
    ({"inverse_products": "fp32"}, 232),
    ({"prep_schedule": "persistent", "flush_denormals": 0}, 232),
    ({"prep_order": "by_head"}, 232),   # the prep's CTA orders (the defaults: by_chunk_descending)
    ({"prep_order": "by_chunk", "segments": 2}, 232),
    ({**NOT_BULK, "elementwise": "bf16x2"}, 232),   # the elementwise stage on packed bf16 pairs
    ({"elementwise": "bf16x2", "prep_schedule": "persistent", "row_norms": "cuda_cores", **NOT_BULK}, 232),
    ({"row_norms": "cuda_cores"}, 232),   # 1/|q| and 1/|k| summed on the CUDA cores (the defaults: tensor cores)
    # ut = T v formed by the state walk (the prep writes T and never reads v)
    ({**NOT_BULK, "ut_product": "state", "stages": 2}, 232),
    ({"ut_product": "state", "stages": 2, "out_store": "deferred"}, 232),
    ({"ut_product": "state", "stages": 2, "prep_schedule": "persistent"}, 232),
    # the walk's tiles as bulk copies, the prep writing the ring's layout (its shuffles included)
    ({"walk_loads": "bulk", "elementwise": "bf16x2"}, 232),
    ({"walk_loads": "bulk", "stages": 1, "v_block": 64, "state_warps": 4}, 232),
    ({"walk_loads": "bulk", "stages": 2, "out_store": "deferred", "segments": 2}, 232),
    ({"walk_loads": "bulk", "prep_schedule": "persistent"}, 232),
    ({"walk_loads": "bulk", "ut_product": "state", "stages": 2}, 232),
    ({"walk_loads": "bulk", "ut_product": "state", "stages": 2, "v_block": 64, "state_warps": 4, "out_store": "deferred"}, 232),
    ({"walk_loads": "bulk", "ut_product": "state", "stages": 2, "elementwise": "bf16x2"}, 232),
    # w's decay on its B fragments in registers (no pass over Ak): beside the defaults, on the
    # persistent schedule (the tighter register budget), with the other norms, inverse and
    # elementwise ways, and where only w is formed (ut by the walk)
    ({"w_gamma": "fragments"}, 232),
    ({"w_gamma": "fragments", "prep_schedule": "persistent"}, 232),
    ({"w_gamma": "fragments", "row_norms": "cuda_cores"}, 232),
    ({"w_gamma": "fragments", "inverse_products": "fp32", "diag_inverse": "after_blocks"}, 232),
    ({"w_gamma": "fragments", "elementwise": "bf16x2"}, 232),
    ({"w_gamma": "fragments", "ut_product": "state", "stages": 2}, 232),
    ({**WL, "w_gamma": "fragments"}, 255),
    # T written in bf16 by the inverse (no fp32 T, no conversion pass): with both inverse
    # engines, w's decay in registers, and the walk that copies T's whole rows (its zeros too)
    ({"t_bf16": "direct"}, 232),
    ({"t_bf16": "direct", "inverse_products": "fp32"}, 232),
    ({"t_bf16": "direct", "w_gamma": "fragments"}, 232),
    ({**NOT_BULK, "t_bf16": "direct", "ut_product": "state", "stages": 2}, 232),
    ({"t_bf16": "direct", "ut_product": "state", "stages": 2}, 232),
    # the tensor-core norms from one ldmatrix pass (four accumulators more at the 80 cap)
    ({"row_norms": "tensor_cores_once"}, 232),
    ({"row_norms": "tensor_cores_once", "w_gamma": "fragments", "t_bf16": "direct"}, 232),
    ({"row_norms": "tensor_cores_once", "prep_schedule": "persistent"}, 232),
    ({"row_norms": "tensor_cores_once", "ut_product": "state", "stages": 2}, 232),
    ({"row_norms": "tensor_cores_once", "inverse_products": "fp32", "flush_denormals": 0}, 232),
]
POINTS = [(for_prep(o), bound) for o, bound in POINTS]
# bytes of spill stores/loads the points above may have. Not every admitted point is free of
# spills: at the tiles prep's 80-register cap ptxas spills 8-44 bytes, in the gate stage, in
# 17 of 120 sampled points, 14 of them with the bf16x2 elementwise stage (docs/benchmarks.md,
# twentieth session; benchmarks/spill_scan.py). The check stage records each candidate's spills.
SPILL_BOUND = 0


def test_family_loads_and_defaults_are_admitted():
    from evolve.families import load_family

    fam = load_family(TEMPLATES / "two_pass")
    assert fam.check(fam.defaults) == []
    assert set(fam.defaults) == {"chunk", "v_block", "state_warps", "stages", "state_step", "prep_smem",
                                 "uo_blocks", "out_store", "prep_schedule", "segments", "diag_inverse",
                                 "inverse_products", "flush_denormals", "prep_order", "elementwise", "ut_product",
                                 "row_norms", "walk_loads", "w_gamma", "t_bf16"}


@pytest.mark.parametrize("overrides, message", [
    ({**CTA, "v_block": 128, "state_warps": 4}, "64 fp32 registers"),
    ({"chunk": 32}, "chunk"),
    ({"state_step": "warp_local", "stages": 3}, "227 KiB"),   # three padded slots of the warp-local step do not fit
    ({"state_step": "warp_local", "v_block": 32, "state_warps": 8}, "16 value rows"),
    ({"state_step": "warp_local", "v_block": 64, "state_warps": 8}, "16 value rows"),
    ({"prep_smem": "lean", "prep_schedule": "persistent"}, "persistent schedule"),
    ({"segments": 2, "prep_schedule": "persistent"}, "chunk range"),
    ({"segments": 4, "state_step": "cta", "stages": 1}, "chunk range"),
    ({"segments": 8, "prep_smem": "lean"}, "chunk range"),
    ({"prep_smem": "lean"}, "ways of the tiles prep"),
    ({"prep_schedule": "persistent"}, "way of the tiles prep's grid schedule"),   # the defaults' CTA order   # the defaults' tf32 inverse exists only in the tiles prep
    ({"prep_smem": "full", "inverse_products": "fp32", "flush_denormals": 0}, "ways of the tiles prep"),
    ({"prep_smem": "lean", "diag_inverse": "after_blocks", "inverse_products": "fp32"}, "ways of the tiles prep"),
    ({"prep_smem": "full", **NOT_TILES, "elementwise": "bf16x2"}, "ways of the tiles prep"),
    ({"ut_product": "state", "stages": 3}, "227 KiB"),   # T beside p: three slots no longer fit
    ({"ut_product": "state", "stages": 2, "state_step": "warp_local"}, "forms ut"),
    ({"ut_product": "state", "stages": 1}, "two ring slots"),
    ({"ut_product": "state", "stages": 1, "prep_smem": "lean", **NOT_TILES}, "writes T"),
    ({"prep_smem": "lean", **NOT_TILES, "row_norms": "tensor_cores"}, "ways of the tiles prep"),
    ({"elementwise": "bf16x2", "prep_schedule": "persistent"}, "norms' fragments spill"),
    ({"elementwise": "bf16x2", "prep_schedule": "persistent", "row_norms": "tensor_cores_once"}, "norms' fragments spill"),
    # bulk copies need the scratch in the ring's layout: written by the tiles prep, read by the wgmma walk, ut included
    ({"walk_loads": "bulk", "state_step": "warp_local", "stages": 2}, "ring's image"),
    ({"prep_smem": "lean", **NOT_TILES, "walk_loads": "bulk"}, "ring's image"),
    ({"walk_loads": "bulk", "prep_schedule": "persistent", "row_norms": "cuda_cores"}, "CUDA-core norms"),
    ({"prep_smem": "lean", **NOT_TILES, "w_gamma": "fragments"}, "w_gamma = 'fragments'"),
    ({"t_bf16": "direct", "diag_inverse": "after_blocks"}, "diag_inverse = 'in_blocks'"),
    ({"prep_smem": "lean", **NOT_TILES, "t_bf16": "direct"}, "diag_inverse = 'in_blocks'"),
    ({"t_bf16": "direct", "prep_schedule": "persistent", "prep_order": "by_head"}, "way of the grid schedule"),
])
def test_constraints_reject(overrides, message):
    from evolve.families import load_family

    fam = load_family(TEMPLATES / "two_pass")
    problems = fam.check({**fam.defaults, **overrides})
    assert problems, f"{overrides} should be rejected"
    assert any(message in p for p in problems), problems


@needs_nvcc
@pytest.mark.parametrize("overrides, state_reg_bound", POINTS)
def test_points_compile_without_spills(render_point, tmp_path, overrides, state_reg_bound):
    cand, fam = render_point("two_pass", **overrides)
    env = fam.environment({**fam.defaults, **overrides})
    reports = {}
    for src, kernel in (("kda_prep.cu", "kda_prep_kernel"), ("kda_state.cu", "kda_state_kernel")):
        text = compile_cubin(cand / src, tmp_path)
        # ptxas waits for a wgmma group itself (C7517) where the threads touch registers it
        # may still write, or it cannot tell: correct, but the overlap of the groups is gone
        assert "warpgroup.wait is injected" not in text, text
        reports[kernel] = parse_ptxas(text, kernel)
    prep, state = reports["kda_prep_kernel"], reports["kda_state_kernel"]
    for r in reports.values():
        assert r.spill_stores <= SPILL_BOUND and r.spill_loads <= SPILL_BOUND, reports
        assert r.stack_bytes == 0, reports
        assert r.static_smem == 0   # all tiles live in dynamic shared memory
    assert prep.registers <= 128
    assert state.registers <= state_reg_bound
    # the shared memory the host asks for fits the SM and the occupancy the design assumes
    assert env["state_smem_bytes"] <= 227 * 1024
    assert 2 * env["prep_smem_bytes"] <= 227 * 1024
    # the prep's CTAs per SM: registers (rounded up to 8 per thread) and shared memory
    # (plus the 1 KiB the SM reserves per CTA) both allow what the launch bounds promise
    per_sm = env["prep_ctas_per_sm"]
    assert per_sm * 256 * ((prep.registers + 7) // 8 * 8) <= 65536, (per_sm, prep.registers)
    assert per_sm * (env["prep_smem_bytes"] + 1024) <= 228 * 1024


@needs_nvcc
def test_iket_is_free_when_off(render_point):
    cand, _ = render_point("two_pass")
    for src in ("kda_prep.cu", "kda_state.cu"):
        off = compile_ptx(cand / src)
        on = compile_ptx(cand / src, ("IKET=1",))
        assert "globaltimer" not in off and "iket_buffer" not in off
        assert "globaltimer" in on and "iket_buffer" in on
