"""The correctness rules of the workload, applied to one output against its reference."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .backend import BF16, as_f32
from .spec import Tolerance


@dataclass
class Verdict:
    ok: bool
    detail: str  # empty when ok
    bad: int  # elements failing the per-element rule (non-finite ones included)
    size: int
    rms_ratio: float


def check_output(xp: Any, name: str, x: Any, ref: Any, tol: Tolerance) -> Verdict:
    """Per element: off iff |x-y| > abs_rms*RMS(y) and |x-y|/(|y|+1e-8) > rel; zero allowed.
    Per output: RMS(x-y)/(RMS(y)+1e-8) < rms_ratio. Non-finite elements count as off."""
    y = ref.astype(xp.float64) if ref.dtype != BF16 else as_f32(xp, ref).astype(xp.float64)
    xv = as_f32(xp, x).astype(xp.float64)
    finite = xp.isfinite(xv)
    n_nonfinite = int(x.size - int(finite.sum()))
    rms_y = float(xp.sqrt(xp.mean(y * y)))
    diff = xp.abs(xp.where(finite, xv, 0.0) - y)
    off = (diff > tol.abs_rms * rms_y) & (diff / (xp.abs(y) + 1e-8) > tol.rel)
    bad = int((off & finite).sum()) + n_nonfinite
    ratio = float(xp.sqrt(xp.mean(diff * diff))) / (rms_y + 1e-8) if n_nonfinite == 0 else float("inf")
    problems = []
    if n_nonfinite:
        problems.append(f"{n_nonfinite} of {x.size} elements not finite (NaN-poisoned buffer not fully written, or overflow)")
    if bad - n_nonfinite:
        problems.append(f"{bad - n_nonfinite} of {x.size} elements out of tolerance")
    if n_nonfinite == 0 and not ratio < tol.rms_ratio:
        problems.append(f"RMS ratio {ratio:.3e} >= {tol.rms_ratio}")
    detail = f"{name}: " + "; ".join(problems) if problems else ""
    return Verdict(ok=not problems, detail=detail, bad=bad, size=int(x.size), rms_ratio=ratio)
