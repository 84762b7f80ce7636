"""fused family: every admitted point renders and compiles for sm_90a without spills
within the register budget of its launch bounds, inadmissible points are rejected
before rendering, and IKET costs nothing when off."""
from __future__ import annotations

import pytest

from .conftest import TEMPLATES, compile_cubin, compile_ptx, needs_nvcc, parse_ptxas


def _family():
    from evolve.families import load_family

    return load_family(TEMPLATES / "fused")


def test_family_loads_and_defaults_are_admitted():
    fam = _family()
    assert fam.check(fam.defaults) == []
    assert set(fam.defaults) == {"chunk", "v_block", "prep_warps", "stages", "prefetch"}
    env = fam.environment(fam.defaults)
    assert env["state_warps"] == 8 and env["threads"] == 384


@pytest.mark.parametrize("overrides, message", [
    ({"v_block": 128, "prep_warps": 8}, "too many threads"),
    ({"chunk": 32}, "chunk"),
    ({"stages": 1, "prefetch": 1}, "two ring slots"),
])
def test_constraints_reject(overrides, message):
    fam = _family()
    problems = fam.check({**fam.defaults, **overrides})
    assert problems, f"{overrides} should be rejected"
    assert any(message in p for p in problems), problems


def test_admitted_points_fit_the_sm():
    points = list(_family().points())
    assert len(points) >= 5
    for p in points:
        env = _family().environment(p)
        assert env["smem_bytes"] <= 227 * 1024
        assert env["threads"] <= 384


@needs_nvcc
@pytest.mark.parametrize("point", list(_family().points()), ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_points_compile_without_spills(render_point, tmp_path, point):
    cand, fam = render_point("fused", **point)
    env = fam.environment(point)
    r = parse_ptxas(compile_cubin(cand / "kda_fused.cu", tmp_path), "kda_fused_kernel")
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_bytes == 0, r
    assert r.static_smem == 0   # the ring and the workspace live in dynamic shared memory
    assert r.registers <= env["reg_limit"], r


@needs_nvcc
def test_iket_is_free_when_off(render_point, tmp_path):
    cand, _ = render_point("fused")
    off = compile_ptx(cand / "kda_fused.cu")
    on = compile_ptx(cand / "kda_fused.cu", ("IKET=1",))
    assert "globaltimer" not in off and "iket_buffer" not in off
    assert "globaltimer" in on and "iket_buffer" in on
    compile_cubin(cand / "kda_fused.cu", tmp_path, ("IKET=1",))   # the traced build compiles too
