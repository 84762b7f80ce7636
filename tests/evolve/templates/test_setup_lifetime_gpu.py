"""Every family on a GPU: what setup allocates lives as long as the callable it returns.

The kernels take raw pointers, so an array that only setup referenced goes back to CuPy's
pool when setup returns and the next allocation reuses it: the kernels then write into the
caller's memory. That passed every other check and was caught by the judge's holdout
(whose copies of the inputs were overwritten). Here the pool's free blocks are all taken
by filler arrays after setup; a call must leave every filler and every input as it was."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from .conftest import TEMPLATES, cupy_or_skip, load_solution

pytestmark = pytest.mark.gpu
cupy = cupy_or_skip()

import sys  # noqa: E402

sys.path.insert(0, str(TEMPLATES / "common"))
import kda_launch  # noqa: E402

PATTERN = 0x5A5A5A5A
MAX_FILLERS = 200_000


def _take_free_blocks(pool) -> list:
    """Small arrays holding PATTERN until the pool has no free block left to hand out."""
    fillers = []
    while pool.n_free_blocks() and len(fillers) < MAX_FILLERS:
        fillers.append(cupy.full(128, PATTERN, dtype=cupy.uint32))   # 512 B: the pool's unit
    assert pool.n_free_blocks() == 0, "the pool kept free blocks the fillers could not take"
    return fillers


def _call_after_taking_the_pool(cand):
    """setup, one call, then every free pool block taken by fillers, then a second call.
    Returns (fillers the second call changed, fillers, inputs changed, outputs differ)."""
    B, T, H = 1, 321, 4
    data = kda_launch.random_inputs(B, T, H, seed=11)
    inputs = {n: data[n].copy() for n in ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "initial_state")}
    pool = cupy.get_default_memory_pool()
    gc.collect()
    pool.free_all_blocks()   # only what setup frees is left for the fillers to take
    fn = load_solution(cand).setup(data, B, T, H)
    fn()
    # host copies: a device copy could land in the freed scratch itself
    first = (data["output"].view(cupy.uint8).get(), data["final_state"].view(cupy.uint8).get())
    gc.collect()
    fillers = _take_free_blocks(pool)
    fn()
    cupy.cuda.get_current_stream().synchronize()
    overwritten = int(sum(int((f != PATTERN).any()) for f in fillers)) if fillers else 0
    changed = [n for n, x in inputs.items() if not bool((data[n].view(cupy.uint8) == x.view(cupy.uint8)).all())]
    # same inputs, same result, bit for bit: a kernel reading memory it no longer owns
    # (now the fillers' pattern) would not reproduce its first call
    differ = not (np.array_equal(data["output"].view(cupy.uint8).get(), first[0])
                  and np.array_equal(data["final_state"].view(cupy.uint8).get(), first[1]))
    return overwritten, fillers, changed, differ


@pytest.mark.parametrize("family", ["two_pass", "fused_tiles", "fused"])
def test_setup_allocations_outlive_setup(render_point, family):
    cand, _ = render_point(family)
    overwritten, fillers, changed, differ = _call_after_taking_the_pool(cand)
    if family == "two_pass":   # it allocates scratch in setup: there must be something to test
        assert fillers, "setup freed nothing: the test exercised nothing"
    assert overwritten == 0, f"{family}: a call wrote into {overwritten} array(s) allocated after setup"
    assert not changed, f"{family}: the call changed its inputs {changed}"
    assert not differ, f"{family}: the second call did not reproduce the first"


def test_a_setup_that_drops_its_scratch_is_caught(render_point):
    """The control: two_pass with the references to its scratch removed must fail above."""
    cand, _ = render_point("two_pass")
    sol = cand / "solution.py"
    text = sol.read_text()
    assert "    scratch = (qg, w, ut, kd, p, gc)\n" in text
    sol.write_text(text.replace("    scratch = (qg, w, ut, kd, p, gc)\n", "    scratch = ()\n"))
    overwritten, fillers, _, _ = _call_after_taking_the_pool(cand)
    assert fillers and overwritten > 0
