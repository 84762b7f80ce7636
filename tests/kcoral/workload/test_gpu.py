"""GPU checks (skipped without CuPy and a GPU); the same functions back gpu_checks.py."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _gpu_or_skip():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except Exception as exc:  # noqa: BLE001 - a CUDA library that does not load
        pytest.skip(f"no usable GPU: {exc}")


def test_gpu_reference_matches_f64_and_numpy():
    _gpu_or_skip()
    from .gpu_checks import reference_vs_f64

    for regime, ro, rs, rn in reference_vs_f64():
        assert ro < 4e-3 and rs < 1e-4, regime
        assert rn < 4e-3, regime


def test_gpu_reference_full_shape_is_finite():
    _gpu_or_skip()
    from .gpu_checks import reference_full_shape

    _, finite = reference_full_shape(calls=1)
    assert finite


def test_fla_has_our_semantics():
    _gpu_or_skip()
    from .gpu_checks import fla_vs_reference

    res = fla_vs_reference()
    if not res["available"]:
        pytest.skip(f"fla not importable: {res['why']}")
    for regime in ("scored", "saturated", "mixed_depth", "random_depth"):
        assert res[regime]["ok"], (regime, res[regime])
