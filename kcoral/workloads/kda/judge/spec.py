"""The workload spec (workload.json) as typed data."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REGIMES = ("saturated", "strong", "mixed_depth", "switch", "boundary", "correlated", "random_depth")


class SpecError(ValueError):
    """workload.json is missing a field or holds a value the judge cannot use."""


@dataclass(frozen=True)
class Tolerance:
    abs_rms: float  # an element is off if |x-y| > abs_rms * RMS(ref) ...
    rel: float  # ... and |x-y| / (|y| + 1e-8) > rel
    rms_ratio: float  # per output: RMS(x-y) / (RMS(y) + 1e-8) must stay below this


@dataclass(frozen=True)
class Holdout:
    count: int
    t_min: int
    t_max: int


@dataclass(frozen=True)
class Timing:
    trials: int
    calls: int
    warmup: int
    flush_bytes: int
    # The judge's own clock against the host's call times, per batch: the host's times
    # stand if the judge saw at most (1 + rel) x their sum + ms beyond a no-op batch.
    clock_slack_rel: float
    clock_slack_ms: float  # per batch (the CPU clock's weighing)
    # per call (the GPU's per-call weighing, beyond the relative slack and the calibration): on the
    # H200 an honest kernel's extra per call came within +0.036 ms of fla's in six trials
    clock_slack_call_ms: float = 0.05
    # GPU: the judge keeps the GPU busy this long before each call, and the host's stream
    # waits for it, so a call's kernels are launched while the GPU is busy, as in a model's
    # stream, and its CUDA events time the GPU's work rather than the launch path.
    preroll_ms: float = 0.0


# Speedups are only comparable against one baseline, so a workload names its own and a
# judge that cannot load it stops rather than timing against another.
BASELINES = ("fla", "reference")


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    device: str  # "cuda" or "cpu"
    B: int
    T: int
    H: int
    K: int
    V: int
    scale: float
    gate_floor: float
    norm_eps: float
    seed: int
    tolerance: Tolerance
    loose_tolerance: Tolerance
    regimes: tuple[str, ...]
    probe_lengths: tuple[int, ...]
    holdout: Holdout
    calls_before_timing: int
    calls_after_timing: int
    timing: Timing
    chunk: int = 64  # chunk length of the judge's fp32 reference
    baseline: str = "reference"  # what speedups are against: "fla" (GPU only) or "reference"
    extra: dict = field(default_factory=dict)


def _get(d: dict, key: str, where: str) -> Any:
    if key not in d:
        raise SpecError(f"workload.json: missing {where}{key}")
    return d[key]


def _positive_int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"workload.json: {what} must be a positive integer, got {value!r}")
    return value


def _tolerance(d: dict, where: str) -> Tolerance:
    return Tolerance(
        abs_rms=float(_get(d, "abs_rms", where)),
        rel=float(_get(d, "rel", where)),
        rms_ratio=float(_get(d, "rms_ratio", where)),
    )


def parse_spec(raw: dict) -> WorkloadSpec:
    shape = _get(raw, "shape", "")
    dims = {k: _positive_int(_get(shape, k, "shape."), f"shape.{k}") for k in ("B", "T", "H", "K", "V")}
    device = _get(raw, "device", "")
    if device not in ("cuda", "cpu"):
        raise SpecError(f"workload.json: device must be 'cuda' or 'cpu', got {device!r}")
    regimes = tuple(_get(raw, "regimes", ""))
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown:
        raise SpecError(f"workload.json: unknown regimes {unknown}; known: {list(REGIMES)}")
    probes = tuple(_positive_int(t, "probe_lengths[]") for t in _get(raw, "probe_lengths", ""))
    hd = _get(raw, "holdout", "")
    holdout = Holdout(
        count=_positive_int(_get(hd, "count", "holdout."), "holdout.count"),
        t_min=_positive_int(_get(hd, "t_min", "holdout."), "holdout.t_min"),
        t_max=_positive_int(_get(hd, "t_max", "holdout."), "holdout.t_max"),
    )
    if holdout.t_min > holdout.t_max:
        raise SpecError("workload.json: holdout.t_min exceeds holdout.t_max")
    td = _get(raw, "timing", "")
    timing = Timing(
        trials=_positive_int(_get(td, "trials", "timing."), "timing.trials"),
        calls=_positive_int(_get(td, "calls", "timing."), "timing.calls"),
        warmup=int(_get(td, "warmup", "timing.")),
        flush_bytes=int(_get(td, "flush_bytes", "timing.")),
        clock_slack_rel=float(td.get("clock_slack_rel", 0.05)),
        clock_slack_ms=float(td.get("clock_slack_ms", 2.0)),
        clock_slack_call_ms=float(td.get("clock_slack_call_ms", 0.05)),
        preroll_ms=max(0.0, float(td.get("preroll_ms", 0.0))),
    )
    checks = _get(raw, "checks", "")
    baseline = raw.get("baseline", "fla" if device == "cuda" else "reference")
    if baseline not in BASELINES or (baseline == "fla" and device != "cuda"):
        raise SpecError(f"workload.json: baseline must be one of {list(BASELINES)} ('fla' on cuda only), got {baseline!r}")
    scale = float(raw.get("scale", 1.0 / math.sqrt(dims["K"])))
    chunk = _positive_int(raw.get("chunk", 64), "chunk")
    if chunk & (chunk - 1):
        raise SpecError("workload.json: chunk must be a power of two")
    return WorkloadSpec(
        name=str(_get(raw, "name", "")),
        device=device,
        scale=scale,
        gate_floor=float(_get(raw, "gate_floor", "")),
        norm_eps=float(_get(raw, "norm_eps", "")),
        seed=int(_get(raw, "seed", "")),
        tolerance=_tolerance(_get(raw, "tolerance", ""), "tolerance."),
        loose_tolerance=_tolerance(_get(raw, "loose_tolerance", ""), "loose_tolerance."),
        regimes=regimes,
        probe_lengths=probes,
        holdout=holdout,
        calls_before_timing=_positive_int(_get(checks, "calls_before_timing", "checks."), "checks.calls_before_timing"),
        calls_after_timing=int(_get(checks, "calls_after_timing", "checks.")),
        timing=timing,
        chunk=chunk,
        baseline=baseline,
        extra={k: v for k, v in raw.items() if k.startswith("x_")},
        **dims,
    )


def load_spec(path: str | Path) -> WorkloadSpec:
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError(f"cannot read {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a JSON object")
    return parse_spec(raw)
