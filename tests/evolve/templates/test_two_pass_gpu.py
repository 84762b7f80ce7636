"""two_pass on a GPU: short sequences against the float64 recurrence, every output
element overwritten, inputs untouched, and IKET dumps that match the launch."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from .conftest import NOT_BULK, TEMPLATES, cupy_or_skip, for_prep, load_solution
from .test_chunked_math import recurrence

pytestmark = pytest.mark.gpu
cupy = cupy_or_skip()

sys.path.insert(0, str(TEMPLATES / "common"))
import iket_host  # noqa: E402
import kda_launch  # noqa: E402

WL = {"state_step": "warp_local", "stages": 2, "out_store": "inline"}   # the defaults before the wgmma step


def _judge(x, y):
    d = np.abs(x - y)
    rms = np.sqrt((y * y).mean())
    bad = ((d > 0.5 * rms) & (d / (np.abs(y) + 1e-8) > 0.05)).sum()
    return np.isfinite(x).all() and bad == 0 and np.sqrt((d * d).mean()) / (rms + 1e-8) < 0.03


def _host(data, name):
    return kda_launch.bf16_to_f32(data[name]).get().astype(np.float64)


@pytest.mark.parametrize("overrides", [
    {},   # the defaults: wgmma state step fed by bulk copies on two ring slots, tiles prep, inline stores
    {"state_step": "cta", "prep_smem": "full", "stages": 1},
    {"state_step": "cta", "prep_smem": "full", "stages": 1, "v_block": 64, "state_warps": 4},
    {**WL, "prep_smem": "full"},
    {"state_step": "warp_local", "v_block": 64, "state_warps": 4, "stages": 1},
    {"state_step": "cta", "prep_smem": "lean", "stages": 1},
    {**WL, "prep_smem": "lean"},
    {**WL, "uo_blocks": 1},
    WL,
    {**NOT_BULK, "stages": 3},   # the defaults before bulk loads (0.816 ms official): cp.async copies, three slots
    {**NOT_BULK, "stages": 2},
    {"stages": 1, "prep_smem": "lean", "out_store": "inline"},
    {"prep_schedule": "persistent"},
    {"segments": 4},   # chunk ranges pipelined on two streams, the state carried between walks
    {"diag_inverse": "after_blocks"},   # the inverse's other ways (the defaults: in blocks, tf32, flushed)
    {"inverse_products": "fp32"},
    {"diag_inverse": "after_blocks", "inverse_products": "fp32"},
    {"flush_denormals": 0},
    {"prep_order": "by_head"},   # a head's chunks in turn (the defaults before prep_order)
    {"prep_order": "by_chunk"},
    {"prep_order": "by_head", "segments": 4},
    {"elementwise": "bf16x2"},   # the elementwise stage on packed bf16 pairs
    {"row_norms": "cuda_cores"},   # 1/|q| and 1/|k| summed on the CUDA cores (the defaults before row_norms)
    {"prep_schedule": "persistent", "elementwise": "bf16x2", "row_norms": "cuda_cores", **NOT_BULK},
    {**NOT_BULK, "ut_product": "state", "stages": 2},   # ut = T v formed by the state walk from the inputs' v
    {"ut_product": "state", "stages": 2, "out_store": "deferred"},
    {"ut_product": "state", "stages": 2, "segments": 4},
    {"walk_loads": "bulk", "stages": 3},   # the walk's bulk copies (the defaults) on three slots
    {"walk_loads": "bulk", "stages": 1, "v_block": 64, "state_warps": 4},
    {"walk_loads": "bulk", "stages": 2, "out_store": "deferred", "segments": 4},
    {"walk_loads": "bulk", "ut_product": "state", "stages": 2},   # and the walk forms ut: v row by row
    {"walk_loads": "bulk", "ut_product": "state", "stages": 2, "v_block": 64, "state_warps": 4, "segments": 4},
    {"w_gamma": "fragments"},   # w's decay on its B fragments in registers
    {"w_gamma": "fragments", "prep_schedule": "persistent"},
    {"w_gamma": "fragments", "ut_product": "state", "stages": 2},
    {"t_bf16": "direct"},   # T written in bf16 by the inverse itself
    {"t_bf16": "direct", "w_gamma": "fragments", "inverse_products": "fp32"},
    {**NOT_BULK, "t_bf16": "direct", "ut_product": "state", "stages": 2},
    {"row_norms": "tensor_cores_once", "w_gamma": "fragments", "t_bf16": "direct"},   # the norms from one ldmatrix pass
], ids=["defaults", "cta_full_s1", "cta_vb64", "wl_full", "wl_vb64_s1", "cta_lean", "wl_lean", "wl_uo1", "warp_local",
        "cp_async_s3", "cp_async_s2", "wgmma_s1_lean", "persistent_prep", "segments_4", "diag_after_blocks",
        "inverse_fp32", "diag_after_blocks_fp32", "exact_denormals", "by_head", "by_chunk", "by_head_segments",
        "elementwise_bf16x2", "norms_cuda_cores", "persistent_bf16x2",
        "ut_state_cp_async", "ut_state_deferred", "ut_state_segments_4", "bulk_s3", "bulk_vb64_s1", "bulk_s2_deferred_segments",
        "bulk_ut_state", "bulk_ut_state_vb64_segments", "w_gamma_fragments", "w_gamma_persistent",
        "w_gamma_ut_state", "t_bf16_direct", "t_bf16_w_gamma_fp32", "t_bf16_cp_async_ut_state",
        "norms_once_w_gamma_t_bf16"])
@pytest.mark.parametrize("B, T", [(1, 1), (1, 17), (1, 64), (1, 65), (1, 200), (2, 33)])
def test_matches_float64_recurrence(render_point, overrides, B, T):
    cand, _ = render_point("two_pass", **for_prep(overrides))
    H = 2
    data = kda_launch.random_inputs(B, T, H, seed=T + 10 * B)
    before = {n: data[n].copy() for n in ("q", "k", "v", "g", "beta", "initial_state")}
    fn = load_solution(cand).setup(data, B, T, H)
    for _ in range(2):   # poisoned before each call: every element must be rewritten
        data["output"][...] = kda_launch.to_bf16(cupy.full(data["output"].shape, np.nan, cupy.float32))
        data["final_state"].fill(np.nan)
        fn()
        out = kda_launch.bf16_to_f32(data["output"]).get()
        state = data["final_state"].get()
        for bz in range(B):
            ref_o, ref_s = recurrence(_host(data, "q")[bz], _host(data, "k")[bz], _host(data, "v")[bz],
                                      _host(data, "g")[bz], _host(data, "beta")[bz],
                                      data["A_log"].get().astype(np.float64),
                                      data["dt_bias"].get().astype(np.float64),
                                      data["initial_state"][bz].get().astype(np.float64), data["scale"])
            assert _judge(out[bz], ref_o), f"output mismatch B={B} T={T} batch {bz}"
            assert _judge(state[bz], ref_s), f"state mismatch B={B} T={T} batch {bz}"
    for n, x in before.items():
        assert bool((data[n].view(cupy.uint8) == x.view(cupy.uint8)).all()), f"{n} was modified"


def test_iket_dump_matches_launch(render_point, tmp_path, monkeypatch):
    cand, _ = render_point("two_pass", **for_prep({"v_block": 64, "state_warps": 4, "state_step": "cta", "stages": 2}))
    monkeypatch.setenv("IKET", "1")
    monkeypatch.setenv("IKET_OUT", str(tmp_path))
    T, H = 130, 2
    data = kda_launch.random_inputs(1, T, H, seed=5)
    load_solution(cand).setup(data, 1, T, H)   # the warm-up call dumps
    chunks = 3
    expected = {"kda_prep_kernel": chunks * H * 8 * 5, "kda_state_kernel": (128 // 64) * H * 4 * chunks * 5}
    for kernel, count in expected.items():
        meta = json.loads((tmp_path / f"{kernel}.iket.json").read_text())
        rec = iket_host.read_records(tmp_path / f"{kernel}.iket.bin")
        assert len(rec) == count
        assert set(np.unique(rec["stage"]).astype(str)) == set(meta["stages"])
        assert (rec["end_ns"] >= rec["start_ns"]).all()
        assert meta["chunk_stage"] in meta["stages"].values()


@pytest.mark.parametrize("segments", [2, 4, 8])
def test_segments_match_one_walk_on_the_callers_stream(render_point, segments):
    """Chunk ranges on side streams give the bits of one prep and one walk (the state is
    carried in fp32, exactly), and fn's work sits on the caller's stream between what the
    caller enqueued before and after it: results copied out on that stream are whole."""
    B, T, H = 2, 1000, 4   # 16 chunks: ranges of several chunks, boundaries inside the sequence
    results = {}
    for seg in (1, segments):
        cand, _ = render_point("two_pass", segments=seg)
        data = kda_launch.random_inputs(B, T, H, seed=7)
        fn = load_solution(cand).setup(data, B, T, H)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            for _ in range(2):
                data["output"][...] = kda_launch.to_bf16(cupy.full(data["output"].shape, np.nan, cupy.float32))
                data["final_state"].fill(np.nan)
                fn()
                out, state = data["output"].view(cupy.uint16).copy(), data["final_state"].copy()
        stream.synchronize()
        results[seg] = (out.get(), state.get())
    assert np.isfinite(kda_launch.bf16_to_f32(cupy.asarray(results[segments][0])).get()).all()
    assert (results[segments][0] == results[1][0]).all(), "output differs from the one-walk launch"
    assert (results[segments][1].view(np.uint32) == results[1][1].view(np.uint32)).all(), "final state differs"
