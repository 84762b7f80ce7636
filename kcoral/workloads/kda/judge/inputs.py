"""Seeded inputs: the scored recipe, the seven stress regimes and the salted holdout.

Everything here is a pure function of (spec, T, seed, regime): the same seed gives the
same bits, so any failure can be replayed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import Backend, to_bf16
from .spec import WorkloadSpec

BF16_INPUTS = ("q", "k", "v", "g", "beta")
F32_INPUTS = ("A_log", "dt_bias", "initial_state")
INPUT_NAMES = BF16_INPUTS + F32_INPUTS

LOOSE_REGIMES = frozenset({"correlated"})
SWITCH_BAND = 128  # tokens per band in the `switch` regime

DISTRIBUTIONS = ("normal", "uniform", "rademacher", "laplace", "clamped")
GATE_MODES = ("none", "channels", "bands", "all", "random")


def _device_rs(be: Backend, seed: int) -> Any:
    return be.xp.random.RandomState(seed % (2**32 - 1))


def _normal(be: Backend, rs: Any, shape: Any) -> Any:
    if be.device == "cuda":
        return rs.standard_normal(size=shape, dtype=be.xp.float32)
    return rs.standard_normal(size=shape).astype(np.float32)


def _draw(be: Backend, rs: Any, shape: Any, dist: str) -> Any:
    """Unit-ish samples of one named distribution, fp32."""
    xp = be.xp
    if dist == "normal":
        return _normal(be, rs, shape)
    if dist == "uniform":
        return (rs.uniform(-math.sqrt(3.0), math.sqrt(3.0), size=shape)).astype(xp.float32)
    if dist == "rademacher":
        return xp.where(rs.uniform(0.0, 1.0, size=shape) < 0.5, -1.0, 1.0).astype(xp.float32)
    if dist == "laplace":
        return rs.laplace(0.0, 1.0 / math.sqrt(2.0), size=shape).astype(xp.float32)
    if dist == "clamped":
        return xp.clip(_normal(be, rs, shape) * 1.5, -3.0, 3.0).astype(xp.float32)
    raise ValueError(f"unknown distribution {dist!r}")


def _head_params(spec: WorkloadSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A_log = log U(1,16); dt log-uniform on [1e-3, 0.1] (>= 1e-4), dt_bias = softplus^-1(dt)."""
    rng = np.random.default_rng([seed, 7])
    a_log = np.log(rng.uniform(1.0, 16.0, size=spec.H)).astype(np.float32)
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(0.1), size=spec.H * spec.K))
    dt = np.maximum(dt, 1e-4)
    dt_bias = (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    return a_log, dt_bias


def _finish(be: Backend, f32: dict) -> dict:
    """bf16-round the bf16 tensors; every tensor dense on the backend's device."""
    xp = be.xp
    out = {}
    for name in BF16_INPUTS:
        out[name] = to_bf16(xp, f32[name])
    for name in F32_INPUTS:
        arr = f32[name]
        arr = be.asarray(arr) if isinstance(arr, np.ndarray) else arr
        out[name] = xp.ascontiguousarray(arr, dtype=xp.float32)
    return out


def scored_f32(be: Backend, spec: WorkloadSpec, T: int, seed: int) -> dict:
    B, H, K, V = spec.B, spec.H, spec.K, spec.V
    rs = _device_rs(be, seed)
    a_log, dt_bias = _head_params(spec, seed)
    return {
        "q": _normal(be, rs, (B, T, H, K)) * 0.5,
        "k": _normal(be, rs, (B, T, H, K)) * 0.5,
        "v": _normal(be, rs, (B, T, H, V)) * 0.5,
        "g": _normal(be, rs, (B, T, H, K)) * 0.5,
        "beta": _normal(be, rs, (B, T, H)) * 0.5,
        "A_log": be.asarray(a_log),
        "dt_bias": be.asarray(dt_bias),
        "initial_state": _normal(be, rs, (B, H, V, K)) * 0.25,
    }


def regime_inputs(be: Backend, spec: WorkloadSpec, T: int, seed: int, regime: str = "scored") -> dict:
    """The scored recipe, then the regime's overrides (see the workload README)."""
    xp = be.xp
    d = scored_f32(be, spec, T, seed)
    H, K = spec.H, spec.K
    if regime == "scored":
        pass
    elif regime == "saturated":
        d["A_log"] = xp.full((H,), math.log(16.0), dtype=xp.float32)
        d["dt_bias"] = xp.zeros((H * K,), dtype=xp.float32)
        d["g"] = xp.full_like(d["g"], 3.0)
    elif regime == "strong":
        d["A_log"] = xp.zeros((H,), dtype=xp.float32)
        d["dt_bias"] = xp.zeros((H * K,), dtype=xp.float32)
    elif regime == "mixed_depth":
        half = K // 2  # a fixed half of the channels: the first K/2
        d["g"][..., :half] = 3.0
        d["dt_bias"] = d["dt_bias"].reshape(H, K).copy()
        d["dt_bias"][:, :half] = 0.0
        d["dt_bias"] = d["dt_bias"].reshape(H * K)
    elif regime == "switch":
        band = ((xp.arange(T) // SWITCH_BAND) % 2 == 1).reshape(1, T, 1, 1)
        d["g"] = xp.where(band, xp.float32(10.0), d["g"])
    elif regime == "boundary":
        d["A_log"] = xp.zeros((H,), dtype=xp.float32)
        d["dt_bias"] = xp.zeros((H * K,), dtype=xp.float32)
        d["g"] = xp.full_like(d["g"], -0.5)
    elif regime == "correlated":
        unit = xp.zeros_like(d["q"])
        unit[..., 0] = 1.0
        d["q"] = unit
        d["k"] = unit.copy()
        d["beta"] = xp.full_like(d["beta"], 3.0)
        d["g"] = xp.full_like(d["g"], -3.0)
        d["A_log"] = xp.full((H,), math.log(16.0), dtype=xp.float32)
        d["dt_bias"] = xp.zeros((H * K,), dtype=xp.float32)
    elif regime == "random_depth":
        rs = _device_rs(be, seed + 1)
        d["A_log"] = _normal(be, rs, (H,))
        d["dt_bias"] = _normal(be, rs, (H * K,))
        d["g"] = _normal(be, rs, d["g"].shape)
        d["beta"] = _normal(be, rs, d["beta"].shape)
    else:
        raise ValueError(f"unknown regime {regime!r}")
    return _finish(be, d)


@dataclass(frozen=True)
class HoldoutCase:
    """What one holdout seed decides. Never printed: the report names only the index."""

    seed: int
    T: int
    dist: str
    loc: float
    spread: float
    mode: str
    loose: bool


def holdout_cases(seeds: list[int], spec: WorkloadSpec) -> list[HoldoutCase]:
    """One case per seed; the deep-gate modes rotate from a seed-drawn offset so that a
    holdout of >= 5 cases covers every mode."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        return []
    offset = int(np.random.default_rng([seeds[0] % 2**63, 1]).integers(len(GATE_MODES)))
    cases = []
    for i, seed in enumerate(seeds):
        rng = np.random.default_rng([seed % 2**63, 2])
        mode = GATE_MODES[(offset + i) % len(GATE_MODES)]
        cases.append(HoldoutCase(
            seed=int(seed),
            T=int(rng.integers(spec.holdout.t_min, spec.holdout.t_max + 1)),
            dist=DISTRIBUTIONS[int(rng.integers(len(DISTRIBUTIONS)))],
            loc=float(rng.uniform(-0.3, 0.3)),
            spread=float(rng.uniform(0.25, 1.0)),
            mode=mode,
            loose=(mode == "none"),  # repeated keys are ill-conditioned
        ))
    return cases


def holdout_inputs(be: Backend, spec: WorkloadSpec, case: HoldoutCase) -> dict:
    xp = be.xp
    B, T, H, K, V = spec.B, case.T, spec.H, spec.K, spec.V
    rs = _device_rs(be, case.seed)
    rng = np.random.default_rng([case.seed % 2**63, 3])

    def sample(shape):
        return _draw(be, rs, shape, case.dist) * case.spread + case.loc

    a_log, dt_bias = _head_params(spec, case.seed)
    d = {
        "q": sample((B, T, H, K)),
        "k": sample((B, T, H, K)),
        "v": sample((B, T, H, V)),
        "g": sample((B, T, H, K)),
        "beta": sample((B, T, H)),
        "A_log": be.asarray(a_log),
        "dt_bias": be.asarray(dt_bias),
        "initial_state": sample((B, H, V, K)) * 0.25,
    }
    if case.mode == "none":
        n_keys = int(rng.integers(1, 9))
        pick = be.asarray(rng.integers(0, n_keys, size=T))
        d["k"] = d["k"][:, :n_keys][:, pick]
    elif case.mode == "channels":
        frac = rng.uniform(0.2, 0.8)
        chosen = be.asarray(rng.random(K) < frac)
        d["g"] = xp.where(chosen, 3.0 + xp.abs(d["g"]), d["g"]).astype(xp.float32)
        d["dt_bias"] = xp.where(chosen[None, :], xp.float32(0.0), d["dt_bias"].reshape(H, K)).reshape(H * K)
    elif case.mode == "bands":
        width = int(rng.integers(8, 129))
        band = ((xp.arange(T) // width) % 2 == 1).reshape(1, T, 1, 1)
        d["g"] = xp.where(band, xp.float32(10.0), d["g"])
    elif case.mode == "all":
        d["A_log"] = xp.full((H,), math.log(16.0), dtype=xp.float32)
        d["dt_bias"] = xp.zeros((H * K,), dtype=xp.float32)
        d["g"] = 3.0 + xp.abs(d["g"])
    elif case.mode == "random":
        d["A_log"] = be.asarray(rng.standard_normal(H).astype(np.float32))
        d["dt_bias"] = be.asarray(rng.standard_normal(H * K).astype(np.float32))
    else:
        raise ValueError(f"unknown gate mode {case.mode!r}")
    d = {n: (xp.ascontiguousarray(a) if hasattr(a, "shape") else a) for n, a in d.items()}
    return _finish(be, d)
