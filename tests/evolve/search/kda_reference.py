"""A float64 token-by-token KDA recurrence and the judge's tolerance rule, for the tests.

Written from the workload's math (docs: the KDA workload page) so the NumPy family can be
checked before and independently of the workload's own judge.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

BF16 = ml_dtypes.bfloat16


def make_inputs(T: int = 512, H: int = 4, K: int = 32, seed: int = 0) -> dict:
    """Inputs drawn like the scored case (B = 1), with preallocated outputs."""
    rng = np.random.default_rng(seed)
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), size=H * K))
    dt = np.maximum(dt, 1e-4)
    data = {
        "q": (rng.standard_normal((1, T, H, K)) * 0.5).astype(BF16),
        "k": (rng.standard_normal((1, T, H, K)) * 0.5).astype(BF16),
        "v": (rng.standard_normal((1, T, H, K)) * 0.5).astype(BF16),
        "g": (rng.standard_normal((1, T, H, K)) * 0.5).astype(BF16),
        "beta": (rng.standard_normal((1, T, H)) * 0.5).astype(BF16),
        "A_log": np.log(rng.uniform(1, 16, size=H)).astype(np.float32),
        "dt_bias": (dt + np.log(-np.expm1(-dt))).astype(np.float32),
        "scale": np.float32(1.0 / np.sqrt(K)),
        "initial_state": (rng.standard_normal((1, H, K, K)) * 0.25).astype(np.float32),
        "output": np.zeros((1, T, H, K), dtype=BF16),
        "final_state": np.zeros((1, H, K, K), dtype=np.float32),
    }
    return data


def reference(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """Token-by-token float64 recurrence: (output [1,T,H,V], final_state [1,H,V,K])."""
    f = lambda x: np.asarray(x, dtype=np.float64)
    q, k, v, g, beta = (f(data[n])[0] for n in ("q", "k", "v", "g", "beta"))
    T, H, K = q.shape
    A = np.exp(f(data["A_log"]))
    bias = f(data["dt_bias"]).reshape(H, K)
    scale = float(data["scale"])
    S = f(data["initial_state"])[0].copy()  # [H, V, K]
    out = np.zeros((T, H, v.shape[-1]))
    for t in range(T):
        qh = q[t] / np.sqrt((q[t] ** 2).sum(-1, keepdims=True) + 1e-6)
        kh = k[t] / np.sqrt((k[t] ** 2).sum(-1, keepdims=True) + 1e-6)
        ld = -5.0 / (1.0 + np.exp(-(A[:, None] * (g[t] + bias))))
        b = 1.0 / (1.0 + np.exp(-beta[t]))
        S *= np.exp(ld)[:, None, :]
        r = v[t] - np.einsum("hvk,hk->hv", S, kh)
        S += b[:, None, None] * r[:, :, None] * kh[:, None, :]
        out[t] = scale * np.einsum("hvk,hk->hv", S, qh)
    return out[None], S[None]


def judge_errors(x: np.ndarray, y: np.ndarray, abs_rms=0.5, rel=0.05, rms_ratio=0.03) -> list[str]:
    """The workload's per-element and per-output rules; empty when `x` passes against `y`."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    errors = []
    if x.shape != y.shape:
        return [f"shape {x.shape} != {y.shape}"]
    if not np.isfinite(x).all():
        return ["non-finite values"]
    rms = np.sqrt(np.mean(y ** 2))
    diff = np.abs(x - y)
    bad = (diff > abs_rms * rms) & (diff / (np.abs(y) + 1e-8) > rel)
    if bad.any():
        errors.append(f"{int(bad.sum())} elements out of tolerance")
    ratio = np.sqrt(np.mean((x - y) ** 2)) / (rms + 1e-8)
    if ratio >= rms_ratio:
        errors.append(f"rms ratio {ratio:.3g} >= {rms_ratio}")
    return errors
