"""fused_tiles on a GPU: short sequences against the float64 recurrence (NaN-poisoned
outputs, inputs untouched), a moderate shape against the fp32 GPU recurrence in every stress
regime, the same bits as the two_pass point with the same prep ways, and IKET dumps that
match the launch. Skipped without a GPU."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from .conftest import FUSED_TILES_BEYOND, cupy_or_skip

pytestmark = pytest.mark.gpu
cupy = cupy_or_skip()

# the fused family's GPU helpers, and its `bench` fixture (benchmarks/kda_kernels.py)
from .test_fused_gpu import (REGIMES, _poison_and_call, _solution, bench, check_against_float64,  # noqa: E402,F401
                             check_regime, iket_host, kda_launch)

POINTS = [{}, {"stages": 1, "side_sixteenths": 0, "prefetch_inputs": 1, "l2_prefetch": 1, "w_u_in_slot": 0, "early_qk": 0}, {"out_store": "deferred", "walk_regs": 200, "l2_prefetch": 0},
          {"w_gamma": "fragments", "t_bf16": "direct", "row_norms": "tensor_cores_once", "w_u_in_slot": 0, "early_qk": 0},
          {"diag_inverse": "after_blocks", "inverse_products": "fp32", "elementwise": "bf16x2", "row_norms": "cuda_cores"},
          {"side_sixteenths": 0}, {"side_sixteenths": 8, "out_store": "deferred", "elementwise": "bf16x2"},
          {"early_qk": 0}, {"w_u_in_slot": 0, "early_qk": 0}, {"side_sixteenths": 0, "t_bf16": "direct"},
          {"side_poll": 1, "side_sixteenths": 5}, {"blocks_unroll": 2, "side_blocks_unroll": 2}, {"blocks_unroll": 2, "side_sixteenths": 0},
          {"elementwise_unroll": 4}, {"elementwise_unroll": 4, "side_blocks_unroll": 2, "elementwise": "bf16x2"},
          {"side_l2_prefetch": 1}, {"early_gate": 1}, {"early_gate": 1, "early_qk": 0, "t_bf16": "direct", "side_sixteenths": 5},
          {"side_teams": 2, "side_l2_prefetch": 1}]
IDS = ["defaults", "stages1_prefetch", "deferred_w200_no_l2_prefetch", "new_prep_ways", "other_prep_ways",
       "no_side", "side4_deferred_bf16x2", "no_early_qk", "staged", "no_side_direct", "side5_poll", "unroll2",
       "blocks_unroll2_no_side", "elementwise_unroll4", "elementwise_unroll4_side_unroll2_bf16x2",
       "side_l2_prefetch", "early_gate", "early_gate_no_early_qk_direct_side5", "side_teams2_l2_prefetch"]
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import kda_timeline  # noqa: E402

PREP_WAYS = ("diag_inverse", "inverse_products", "flush_denormals", "elementwise", "row_norms", "w_gamma", "t_bf16")


@pytest.mark.parametrize("overrides", POINTS, ids=IDS)
@pytest.mark.parametrize("B, T", [(1, 1), (1, 17), (1, 64), (1, 65), (1, 129), (1, 321), (2, 200)])
def test_matches_float64_recurrence(render_point, overrides, B, T):
    check_against_float64(render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)[0], B, T)


@pytest.mark.parametrize("overrides", [{}, {"side_sixteenths": 0}, {"w_u_in_slot": 0, "early_qk": 0}],
                         ids=["defaults", "no_side", "staged"])
@pytest.mark.parametrize("regime", REGIMES)
def test_moderate_shape_against_fp32_reference(render_point, bench, regime, overrides):  # noqa: F811 (bench: the fixture)
    check_regime(render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)[0], bench, regime)


@pytest.mark.parametrize("overrides", [{}, {"w_gamma": "fragments", "t_bf16": "direct", "elementwise": "bf16x2", "w_u_in_slot": 0, "early_qk": 0},
                                       {"side_sixteenths": 0}, {"w_u_in_slot": 0, "early_qk": 0}, {"side_poll": 1},
                                       {"blocks_unroll": 2, "side_blocks_unroll": 2}, {"elementwise_unroll": 4},
                                       {"elementwise_unroll": 4, "elementwise": "bf16x2"}, {"early_gate": 1}],
                         ids=["defaults", "fragments_direct_bf16x2_staged", "no_side", "staged", "side_poll", "unroll2",
                              "elementwise_unroll4", "elementwise_unroll4_bf16x2", "early_gate"])
def test_same_bits_as_two_pass(render_point, overrides):
    """The same prep and walk sources, handed over in shared memory instead of global memory."""
    B, T, H = 1, 777, 4
    data = kda_launch.random_inputs(B, T, H, seed=11)
    fused, fam = render_point("fused_tiles", beyond=FUSED_TILES_BEYOND, **overrides)
    params = {**fam.defaults, **overrides}
    two, _ = render_point("two_pass", **{k: params[k] for k in PREP_WAYS}, out_store=params["out_store"], stages=2)
    o_f, s_f = _poison_and_call(_solution(fused).setup(data, B, T, H), data)
    o_t, s_t = _poison_and_call(_solution(two).setup(data, B, T, H), data)
    assert np.array_equal(o_f.view(np.uint32), o_t.view(np.uint32))
    assert np.array_equal(s_f.view(np.uint32), s_t.view(np.uint32))


def test_iket_dump_matches_launch(render_point, tmp_path, monkeypatch):
    cand, _ = render_point("fused_tiles", side_sixteenths=0)   # the fused prep's records for every chunk
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
    # every record once: the counters' shares (iket.cuh) neither overlap nor lose one
    assert len(set(zip(rec["cta"], rec["warp"], rec["stage"], rec["seq"]))) == len(rec)
    assert set(np.unique(rec["stage"]).astype(str)) == set(meta["stages"])
    assert (rec["end_ns"] >= rec["start_ns"]).all()
    assert set(meta["warp_roles"].values()) == {"prep", "walk"}
    roles = {int(w): r for w, r in meta["warp_roles"].items()}
    for warp, stage in zip(rec["warp"], rec["stage"]):   # the prep's stages on its warps, the walk's on its own
        assert (roles[int(warp)] == "prep") == (int(stage) < 5 or int(stage) == 10)


def test_side_kernel_runs_beside_the_fused_one(render_point, tmp_path, monkeypatch):
    """At the scored shape's width (96 heads: 36 SMs idle) the side kernel's prep and the fused
    kernel's overlap in time (IKET's clock): the two launches are not serialised, and the
    walks get side chunks while the fused kernel's prep works."""
    cand, _ = render_point("fused_tiles", side_sixteenths=6)
    monkeypatch.setenv("IKET", "1")
    monkeypatch.setenv("IKET_OUT", str(tmp_path))
    monkeypatch.setenv("IKET_CAPACITY", str(1 << 20))
    B, T, H = 1, 2048, 96
    data = kda_launch.random_inputs(B, T, H, seed=5)
    fn = _solution(cand).setup(data, B, T, H)   # the warm-up call dumps
    assert set(fn.kernels) == {"kda_fused_kernel", "kda_side_prep_kernel"}
    fused = iket_host.read_records(tmp_path / "kda_fused_kernel.iket.bin")
    side = iket_host.read_records(tmp_path / "kda_side_prep_kernel.iket.bin")
    chunks = -(-T // 64)
    assert len(side) == B * H * (chunks * 6 // 16) * 8 * 5   # every side chunk, 8 warps a team, 5 stages
    assert set(np.unique(side["seq"])) <= {c for c in range(chunks) if (c + 1) * 6 // 16 != c * 6 // 16}
    overlap = min(fused["end_ns"].max(), side["end_ns"].max()) - max(fused["start_ns"].min(), side["start_ns"].min())
    assert overlap > 0.5 * (side["end_ns"].max() - side["start_ns"].min()), overlap
    # benchmarks/kda_timeline.py finds every side chunk's head and the walk's ask for it
    timeline = kda_timeline.analyse(tmp_path, heads=B * H)
    assert timeline["side_flag_minus_ask"]["n"] == B * H * (chunks * 6 // 16)
    assert timeline["walk_wait_side_chunks"]["n"] == B * H * (chunks * 6 // 16)


ROLES_SCRIPT = '''
import importlib.util, sys
import cupy
spec = importlib.util.spec_from_file_location("sol", sys.argv[1] + "/solution.py")
sol = importlib.util.module_from_spec(spec); spec.loader.exec_module(sol)
data = sol.launch.random_inputs(1, 2048, 96, seed=3)
for alone in (1, 2, 3, 4):
    sol.build(data, 1, 2048, 96, (f"KDA_ALONE={alone}",)).call()
    cupy.cuda.get_current_stream().synchronize()
    print("finished", alone, flush=True)
'''


def test_roles_alone_finish_beside_side_chunks(render_point):
    """benchmarks/kda_roles.py's builds with side chunks (96 heads: the side kernel runs): each
    role alone finishes. The prep alone once deadlocked here, its walk handing back no slot of
    a side chunk; a child process, so a hang fails the test instead of stopping the run."""
    cand, _ = render_point("fused_tiles", side_sixteenths=6)
    run = subprocess.run([sys.executable, "-c", ROLES_SCRIPT, str(cand)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == "finished 1 finished 2 finished 3 finished 4".split()


def test_neighbours_benchmark_runs(tmp_path):
    """benchmarks/kda_neighbours.py at a short length: every neighbour calibrated and run beside
    the candidate, the report written."""
    import kda_neighbours
    out = tmp_path / "n.json"
    assert kda_neighbours.main(["--config", "fused_tiles:side_sixteenths=0", "--T", "512", "--iters", "2",
                                "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report["neighbour_ms_alone"]) == set(kda_neighbours.NEIGHBOURS)
    ms = report["rows"][0]["ms"]
    assert set(ms) == {"alone", *kda_neighbours.NEIGHBOURS} and all(v["median_ms"] > 0 for v in ms.values())
