"""fused on a GPU: short sequences against the float64 recurrence (NaN-poisoned outputs,
inputs untouched), a moderate shape against the fp32 GPU recurrence in several stress
regimes and against two_pass, and IKET dumps that match the launch."""
from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from .conftest import REPO, TEMPLATES, cupy_or_skip
from .test_chunked_math import recurrence

pytestmark = pytest.mark.gpu
cupy = cupy_or_skip()

sys.path.insert(0, str(TEMPLATES / "common"))
import iket_host  # noqa: E402
import kda_launch  # noqa: E402

POINTS = [{}, {"prefetch": 1}, {"v_block": 64, "prep_warps": 8, "stages": 1},
          {"v_block": 64, "prep_warps": 4, "stages": 2, "prefetch": 1}]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def _solution(cand):
    return _load(cand / "solution.py", f"_sol_{cand.name}")


def _judge(x, y, loose=False):
    d = np.abs(x - y)
    rms = np.sqrt((y * y).mean())
    bad = ((d > (1.0 if loose else 0.5) * rms) & (d / (np.abs(y) + 1e-8) > (0.2 if loose else 0.05))).sum()
    ratio = np.sqrt((d * d).mean()) / (rms + 1e-8)
    return bool(np.isfinite(x).all() and bad == 0 and ratio < (0.15 if loose else 0.03)), float(ratio)


def _host(data, name):
    return kda_launch.bf16_to_f32(data[name]).get().astype(np.float64)


def _poison_and_call(fn, data):
    data["output"][...] = kda_launch.to_bf16(cupy.full(data["output"].shape, np.nan, cupy.float32))
    data["final_state"].fill(np.nan)
    fn()
    return kda_launch.bf16_to_f32(data["output"]).get(), data["final_state"].get()


def check_against_float64(cand, B: int, T: int, H: int = 2) -> None:
    """A rendered point's outputs against the float64 recurrence, over two calls with the
    outputs NaN-poisoned before each (every element must be rewritten); the inputs untouched."""
    data = kda_launch.random_inputs(B, T, H, seed=T + 10 * B)
    before = {n: data[n].copy() for n in ("q", "k", "v", "g", "beta", "initial_state")}
    fn = _solution(cand).setup(data, B, T, H)
    for _ in range(2):
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


@pytest.mark.parametrize("overrides", POINTS)
@pytest.mark.parametrize("B, T", [(1, 1), (1, 17), (1, 63), (1, 64), (1, 65), (1, 129), (1, 321), (2, 33)])
def test_matches_float64_recurrence(render_point, overrides, B, T):
    cand, _ = render_point("fused", **overrides)
    check_against_float64(cand, B, T)


@pytest.fixture(scope="module")
def bench():
    """benchmarks/kda_kernels.py: its fp32 GPU recurrence and the judge's stress regimes."""
    return _load(REPO / "benchmarks" / "kda_kernels.py", "_kda_kernels_bench")


REGIMES = ["scored", "saturated", "mixed_depth", "switch", "correlated", "random_depth"]


def check_regime(cand, bench, regime: str) -> None:
    """A rendered point at a moderate shape against the fp32 GPU recurrence, in one of the
    judge's stress regimes (the correlated keys with the judge's looser bound)."""
    B, T, H = 1, 1000, 8
    data = kda_launch.random_inputs(B, T, H, seed=3)
    bench.set_regime(data, regime, 77)
    ref_o, ref_s = (x.get() for x in bench.reference_gpu(data))
    fn = _solution(cand).setup(data, B, T, H)
    loose = regime == "correlated"
    for _ in range(2):
        out, state = _poison_and_call(fn, data)
        ok_o, r_o = _judge(out, ref_o, loose)
        ok_s, r_s = _judge(state, ref_s, loose)
        assert ok_o and ok_s, (regime, r_o, r_s)
        if regime == "scored":
            assert r_o < 0.01 and r_s < 0.01, (regime, r_o, r_s)   # two_pass: about 0.005


@pytest.mark.parametrize("regime", REGIMES)
def test_moderate_shape_against_fp32_reference(render_point, bench, regime):
    check_regime(render_point("fused")[0], bench, regime)


def test_agrees_with_two_pass(render_point):
    B, T, H = 1, 777, 4
    data = kda_launch.random_inputs(B, T, H, seed=11)
    fused, _ = render_point("fused")
    two, _ = render_point("two_pass")
    o_f, s_f = _poison_and_call(_solution(fused).setup(data, B, T, H), data)
    o_t, s_t = _poison_and_call(_solution(two).setup(data, B, T, H), data)
    assert _judge(o_f, o_t)[1] < 0.01 and _judge(s_f, s_t)[1] < 0.01


def test_iket_dump_matches_launch(render_point, tmp_path, monkeypatch):
    cand, fam = render_point("fused")
    env = fam.environment(fam.defaults)
    monkeypatch.setenv("IKET", "1")
    monkeypatch.setenv("IKET_OUT", str(tmp_path))
    T, H = 130, 2
    data = kda_launch.random_inputs(1, T, H, seed=5)
    _solution(cand).setup(data, 1, T, H)   # the warm-up call dumps
    chunks, ctas = 3, (128 // env["v_block"]) * H
    per_chunk = env["prep_warps"] * 6 + env["state_warps"] * 4   # prep: 6 stages, state: 4
    meta = json.loads((tmp_path / "kda_fused_kernel.iket.json").read_text())
    rec = iket_host.read_records(tmp_path / "kda_fused_kernel.iket.bin")
    assert len(rec) == chunks * ctas * per_chunk
    assert set(np.unique(rec["stage"]).astype(str)) == set(meta["stages"])
    assert (rec["end_ns"] >= rec["start_ns"]).all()
    assert meta["chunk_stage"] in meta["stages"].values()
    assert set(meta["warp_roles"].values()) == {"prep", "state"}
