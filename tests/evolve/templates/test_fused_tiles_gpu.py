"""fused_tiles on a GPU: short sequences against the float64 recurrence (NaN-poisoned
outputs, inputs untouched), a moderate shape against the fp32 GPU recurrence in every stress
regime, the same bits as the two_pass point with the same prep ways, and IKET dumps that
match the launch. Skipped without a GPU."""
from __future__ import annotations

import json

import numpy as np
import pytest

from .conftest import cupy_or_skip
from .test_chunked_math import recurrence

pytestmark = pytest.mark.gpu
cupy = cupy_or_skip()

# the fused family's GPU helpers, and its `bench` fixture (benchmarks/kda_kernels.py)
from .test_fused_gpu import _host, _judge, _poison_and_call, _solution, bench, iket_host, kda_launch  # noqa: E402,F401

POINTS = [{}, {"stages": 1, "prefetch_inputs": 1, "l2_prefetch": 1}, {"out_store": "deferred", "walk_regs": 200},
          {"w_gamma": "fragments", "t_bf16": "direct", "row_norms": "tensor_cores_once"},
          {"diag_inverse": "after_blocks", "inverse_products": "fp32", "elementwise": "bf16x2", "row_norms": "cuda_cores"}]
IDS = ["defaults", "stages1_prefetch", "deferred_w200", "new_prep_ways", "other_prep_ways"]
PREP_WAYS = ("diag_inverse", "inverse_products", "flush_denormals", "elementwise", "row_norms", "w_gamma", "t_bf16")


@pytest.mark.parametrize("overrides", POINTS, ids=IDS)
@pytest.mark.parametrize("B, T", [(1, 1), (1, 17), (1, 64), (1, 65), (1, 129), (1, 321), (2, 200)])
def test_matches_float64_recurrence(render_point, overrides, B, T):
    cand, _ = render_point("fused_tiles", **overrides)
    H = 2
    data = kda_launch.random_inputs(B, T, H, seed=T + 10 * B)
    before = {n: data[n].copy() for n in ("q", "k", "v", "g", "beta", "initial_state")}
    fn = _solution(cand).setup(data, B, T, H)
    for _ in range(2):   # poisoned before each call: every element must be rewritten
        out, state = _poison_and_call(fn, data)
        for bz in range(B):
            ref_o, ref_s = recurrence(_host(data, "q")[bz], _host(data, "k")[bz], _host(data, "v")[bz],
                                      _host(data, "g")[bz], _host(data, "beta")[bz],
                                      data["A_log"].get().astype(np.float64),
                                      data["dt_bias"].get().astype(np.float64),
                                      data["initial_state"][bz].get().astype(np.float64), data["scale"])
            assert _judge(out[bz], ref_o)[0], f"output mismatch B={B} T={T} batch {bz}: {_judge(out[bz], ref_o)}"
            assert _judge(state[bz], ref_s)[0], f"state mismatch B={B} T={T} batch {bz}: {_judge(state[bz], ref_s)}"
    for n, x in before.items():
        assert bool((data[n].view(cupy.uint8) == x.view(cupy.uint8)).all()), f"{n} was modified"


@pytest.mark.parametrize("regime", ["scored", "saturated", "mixed_depth", "switch", "correlated", "random_depth"])
def test_moderate_shape_against_fp32_reference(render_point, bench, regime):  # noqa: F811 (bench: the fixture)
    B, T, H = 1, 1000, 8
    data = kda_launch.random_inputs(B, T, H, seed=3)
    bench.set_regime(data, regime, 77)
    ref_o, ref_s = (x.get() for x in bench.reference_gpu(data))
    cand, _ = render_point("fused_tiles")
    fn = _solution(cand).setup(data, B, T, H)
    loose = regime == "correlated"
    for _ in range(2):
        out, state = _poison_and_call(fn, data)
        ok_o, r_o = _judge(out, ref_o, loose)
        ok_s, r_s = _judge(state, ref_s, loose)
        assert ok_o and ok_s, (regime, r_o, r_s)
        if regime == "scored":
            assert r_o < 0.01 and r_s < 0.01, (regime, r_o, r_s)


@pytest.mark.parametrize("overrides", [{}, {"w_gamma": "fragments", "t_bf16": "direct", "elementwise": "bf16x2"}],
                         ids=["defaults", "fragments_direct_bf16x2"])
def test_same_bits_as_two_pass(render_point, overrides):
    """The same prep and walk sources, handed over in shared memory instead of global memory."""
    B, T, H = 1, 777, 4
    data = kda_launch.random_inputs(B, T, H, seed=11)
    fused, fam = render_point("fused_tiles", **overrides)
    params = {**fam.defaults, **overrides}
    two, _ = render_point("two_pass", **{k: params[k] for k in PREP_WAYS}, out_store=params["out_store"], stages=2)
    o_f, s_f = _poison_and_call(_solution(fused).setup(data, B, T, H), data)
    o_t, s_t = _poison_and_call(_solution(two).setup(data, B, T, H), data)
    assert np.array_equal(o_f.view(np.uint32), o_t.view(np.uint32))
    assert np.array_equal(s_f.view(np.uint32), s_t.view(np.uint32))


def test_iket_dump_matches_launch(render_point, tmp_path, monkeypatch):
    cand, _ = render_point("fused_tiles")
    monkeypatch.setenv("IKET", "1")
    monkeypatch.setenv("IKET_OUT", str(tmp_path))
    T, H = 130, 2
    data = kda_launch.random_inputs(1, T, H, seed=5)
    _solution(cand).setup(data, 1, T, H)   # the warm-up call dumps
    chunks, ctas = 3, H
    per_chunk = 8 * 6 + 8 * 4   # the prep's warps: wait_empty and 5 stages; the walk's: wait_full, u_o, update, chunk
    meta = json.loads((tmp_path / "kda_fused_kernel.iket.json").read_text())
    rec = iket_host.read_records(tmp_path / "kda_fused_kernel.iket.bin")
    assert len(rec) == chunks * ctas * per_chunk
    assert set(np.unique(rec["stage"]).astype(str)) == set(meta["stages"])
    assert (rec["end_ns"] >= rec["start_ns"]).all()
    assert set(meta["warp_roles"].values()) == {"prep", "walk"}
    roles = {int(w): r for w, r in meta["warp_roles"].items()}
    for warp, stage in zip(rec["warp"], rec["stage"]):   # the prep's stages on its warps, the walk's on its own
        assert (roles[int(warp)] == "prep") == (int(stage) < 5 or int(stage) == 10)
