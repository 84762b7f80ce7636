"""Every family on a GPU: what setup allocates lives as long as the callable it returns.

The kernels take raw pointers, so an array that only setup referenced goes back to CuPy's
pool when setup returns and the next allocation reuses it: the kernels then write into the
caller's memory. That passed every other check and was caught by the judge's holdout
(whose copies of the inputs were overwritten). Here the pool's free blocks are all taken
by filler arrays after setup; a call must leave every filler and every input as it was."""
from __future__ import annotations

import gc
import importlib.util

import numpy as np
import pytest

from .conftest import TEMPLATES, cupy_or_skip

pytestmark = pytest.mark.gpu
cupy = cupy_or_skip()

import sys  # noqa: E402

sys.path.insert(0, str(TEMPLATES / "common"))
import kda_launch  # noqa: E402

PATTERN = 0x5A5A5A5A
MAX_FILLERS = 200_000


def _solution(cand):
    spec = importlib.util.spec_from_file_location(f"_sol_{cand.name}", cand / "solution.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _take_free_blocks(pool) -> list:
    """Small arrays holding PATTERN until the pool has no free block left to hand out."""
    fillers = []
    while pool.n_free_blocks() and len(fillers) < MAX_FILLERS:
        fillers.append(cupy.full(128, PATTERN, dtype=cupy.uint32))   # 512 B: the pool's unit
    assert pool.n_free_blocks() == 0, "the pool kept free blocks the fillers could not take"
    return fillers


@pytest.mark.parametrize("family", ["two_pass", "fused"])
def test_setup_allocations_outlive_setup(render_point, family):
    cand, _ = render_point(family)
    B, T, H = 1, 321, 4
    data = kda_launch.random_inputs(B, T, H, seed=11)
    inputs = {n: data[n].copy() for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")}
    pool = cupy.get_default_memory_pool()
    gc.collect()
    pool.free_all_blocks()   # only what setup frees is left for the fillers to take
    fn = _solution(cand).setup(data, B, T, H)
    cupy.cuda.get_current_stream().synchronize()
    gc.collect()
    fillers = _take_free_blocks(pool)
    fn()
    cupy.cuda.get_current_stream().synchronize()
    overwritten = sum(int((f != PATTERN).any()) for f in fillers)
    assert overwritten == 0, f"{family}: a call wrote into {overwritten} array(s) allocated after setup"
    for name, before in inputs.items():
        assert bool((data[name].view(cupy.uint8) == before.view(cupy.uint8)).all()), f"{family}: {name} was modified"
    assert np.isfinite(kda_launch.bf16_to_f32(data["output"]).get()).all()
