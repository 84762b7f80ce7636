"""Every distinct point of the NumPy family computes the workload's math (own float64
recurrence and tolerance rule, independent of the workload's judge)."""
from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

from evolve.families import load_family
from evolve.render import render_candidate
from tests.evolve.search.conftest import NUMPY_FAMILY
from tests.evolve.search.kda_reference import judge_errors, make_inputs, reference


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    fam = load_family(NUMPY_FAMILY)
    root = tmp_path_factory.mktemp("numpy_gen")
    dirs: dict = {}
    for point in fam.points():
        dirs.setdefault(render_candidate(fam, point, root), point)
    return dirs


def _load(path):
    spec = importlib.util.spec_from_file_location(f"sol_{path.name[:12]}", path / "solution.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_irrelevant_parameters_dedup_to_one_source(rendered):
    recurrent = [p for p in rendered.values() if p["algorithm"] == "recurrent"]
    assert len(recurrent) == 4      # only dtype x contract matter to the token loop


@pytest.mark.parametrize("T", [200, 65, 17, 1])
def test_every_point_matches_the_float64_recurrence(rendered, T):
    """Lengths that are not multiples of any chunk; at 200 every chunk size sees a tail."""
    data = make_inputs(T=T, seed=T)
    ref_out, ref_state = reference(data)
    failures = []
    for path, point in rendered.items():
        data["output"][...] = np.nan
        data["final_state"][...] = np.nan
        fn = _load(path).setup(data, 1, T, 4)
        data["output"][...] = np.nan      # fn() must overwrite everything, every call
        data["final_state"][...] = np.nan
        fn()
        errs = judge_errors(data["output"], ref_out) + judge_errors(data["final_state"], ref_state)
        if errs:
            failures.append((point, errs))
    assert not failures, failures[:3]


def test_saturated_gate_stays_finite(rendered):
    """-5 nats per token on every channel: the regime that overflows naive factorisations."""
    T = 100
    data = make_inputs(T=T, seed=3)
    data["A_log"][...] = np.log(16.0)
    data["dt_bias"][...] = 0.0
    data["g"][...] = 3.0
    ref_out, ref_state = reference(data)
    for path, point in rendered.items():
        _load(path).setup(data, 1, T, 4)()
        errs = judge_errors(data["output"], ref_out) + judge_errors(data["final_state"], ref_state)
        assert not errs, (point, errs)


def test_the_space_has_slow_and_fast_points(rendered):
    """The README's main job must be able to find something: the defaults are slower than the
    CPU twin's baseline (the judge's fp32 chunked reference) and the best-known point is
    clearly faster, on the same inputs, best of several calls each."""
    import sys

    from tests.evolve.search.conftest import REPO
    sys.path.insert(0, str(REPO / "kcoral" / "workloads" / "kda"))
    try:
        from judge.reference import chunked_f32
    finally:
        sys.path.remove(str(REPO / "kcoral" / "workloads" / "kda"))

    data = make_inputs(T=512, seed=1)
    fam = load_family(NUMPY_FAMILY)
    by_point = {tuple(sorted(p.items())): d for d, p in rendered.items()}

    def kernel(point):
        return _load(by_point[tuple(sorted(point.items()))]).setup(data, 1, 512, 4)

    def best_of_interleaved(fns, rounds=11):
        # Interleaved, so that a burst of load on a shared CI machine slows every side alike
        # (measured one after the other, a burst once made the fast point 1.19x, not 2x).
        best = [float("inf")] * len(fns)
        for _ in range(rounds):
            for i, fn in enumerate(fns):
                t0 = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t0)
        return best

    baseline, seed, fast = best_of_interleaved([
        lambda: chunked_f32(np, data, float(data["scale"]), chunk=64),
        kernel(fam.defaults),
        kernel(dict(fam.defaults, chunk=16, batching="all_chunks", decay_form="factored", contract="matmul",
                    solve="substitution", dtype="float32"))])
    assert seed > baseline, (seed, baseline)
    # About 2x on an idle machine; 1.48x was seen on a loaded 2-core CI machine. What matters
    # is a winner the search can confirm beyond the CPU timings' spread.
    assert fast * 1.3 < baseline, (fast, baseline)
