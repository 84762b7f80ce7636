"""The two references of the KDA forward.

`recurrence_f64`: the definition, token by token in float64 (vectorised over heads). The
oracle of the exact probes and the holdout.

`chunked_f32`: the workload's readable fp32 chunked algorithm, written once for any array
module `xp` (NumPy or CuPy). The oracle of the scored and stress cases, and the baseline
when fla is absent. It is safe at the -5 nats/token gate floor: every exponential it forms
has a non-positive argument. Within a chunk, the decay between token s and a later token t
is split at a reference point r between them (exp(G_t - G_r) * exp(G_r - G_s)), on a binary
hierarchy of sub-chunks, so pairwise products are plain matrix products.
"""
from __future__ import annotations

from typing import Any
from .backend import as_f32, sigmoid


def _prepare(xp: Any, inp: dict, gate_floor: float, eps: float, dtype: Any) -> Any:
    """Normalised q/k, per-channel log decay and beta, in `dtype`, layout [B*H, T, D]."""
    q = as_f32(xp, inp["q"]).astype(dtype)
    k = as_f32(xp, inp["k"]).astype(dtype)
    v = as_f32(xp, inp["v"]).astype(dtype)
    g = as_f32(xp, inp["g"]).astype(dtype)
    beta = as_f32(xp, inp["beta"]).astype(dtype)
    B, T, H, K = q.shape
    V = v.shape[-1]
    a = xp.exp(inp["A_log"].astype(dtype)).reshape(1, 1, H, 1)
    bias = inp["dt_bias"].astype(dtype).reshape(1, 1, H, K)
    log_decay = gate_floor * sigmoid(xp, a * (g + bias))
    qh = q / xp.sqrt((q * q).sum(-1, keepdims=True) + eps)
    kh = k / xp.sqrt((k * k).sum(-1, keepdims=True) + eps)
    b = sigmoid(xp, beta)

    def heads_first(x):  # [B, T, H, D] -> [B*H, T, D]
        return xp.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(B * H, T, x.shape[-1]))

    bh = xp.ascontiguousarray(b.transpose(0, 2, 1).reshape(B * H, T))
    return heads_first(qh), heads_first(kh), heads_first(v), heads_first(log_decay), bh, (B, T, H, K, V)


def recurrence_f64(xp: Any, inp: dict, scale: float, gate_floor: float = -5.0, eps: float = 1e-6) -> tuple[Any, Any]:
    """Token-by-token float64 recurrence. Returns (output [B,T,H,V], final_state [B,H,V,K]), float64."""
    f64 = xp.float64
    qh, kh, v, ld, b, (B, T, H, K, V) = _prepare(xp, inp, gate_floor, eps, f64)
    # S[h, k, v]: the math's layout; the V-first state is its transpose.
    S = xp.ascontiguousarray(inp["initial_state"].astype(f64).reshape(B * H, V, K).transpose(0, 2, 1))
    decay = xp.exp(ld)
    out = xp.empty((B * H, T, V), dtype=f64)
    for t in range(T):
        S *= decay[:, t, :, None]
        kt = kh[:, t, None, :]  # [BH, 1, K]
        r = v[:, t, None, :] - kt @ S  # [BH, 1, V]
        S += (b[:, t, None, None] * kt.transpose(0, 2, 1)) @ r
        out[:, t] = scale * (qh[:, t, None, :] @ S)[:, 0]
    output = out.reshape(B, H, T, V).transpose(0, 2, 1, 3)
    final = S.transpose(0, 2, 1).reshape(B, H, V, K)
    return xp.ascontiguousarray(output), xp.ascontiguousarray(final)


def _intra_chunk(xp, qh, kh, G):
    """Pairwise decayed products inside each chunk, [..., C, K] -> two [..., C, C]:
    A[t, s] = sum_k kh_t kh_s exp(G_t - G_s) for s < t, and Qk[t, s] likewise with qh_t for
    s <= t. Level by level, a block of 2h tokens pairs its right half (rows) with its left
    half (columns) through the left half's last token r: both factors exp(G_t - G_r) and
    exp(G_r - G_s) have non-positive arguments."""
    *lead, C, K = kh.shape
    A = xp.zeros((*lead, C, C), dtype=kh.dtype)
    Qk = (qh * kh).sum(-1)[..., :, None] * xp.eye(C, dtype=kh.dtype)  # the diagonal, s = t
    h = 1
    while h < C:
        nb = C // (2 * h)
        G6 = G.reshape(*lead, nb, 2, h, K)
        k6 = kh.reshape(*lead, nb, 2, h, K)
        q6 = qh.reshape(*lead, nb, 2, h, K)
        ref = G6[..., 0, h - 1 : h, :]  # [..., nb, 1, K]
        right = xp.exp(G6[..., 1, :, :] - ref)  # t after r: <= 1
        left = xp.exp(ref - G6[..., 0, :, :])  # s up to r: <= 1
        cols = (k6[..., 0, :, :] * left).swapaxes(-1, -2)  # [..., nb, K, h]
        blk_a = (k6[..., 1, :, :] * right) @ cols  # [..., nb, h, h]
        blk_q = (q6[..., 1, :, :] * right) @ cols
        eye = xp.eye(nb, dtype=kh.dtype)[:, None, :, None]  # keep block i paired with block i
        A.reshape(*lead, nb, 2, h, nb, 2, h)[..., :, 1, :, :, 0, :] += blk_a[..., :, :, None, :] * eye
        Qk.reshape(*lead, nb, 2, h, nb, 2, h)[..., :, 1, :, :, 0, :] += blk_q[..., :, :, None, :] * eye
        h *= 2
    return A, Qk


def _forward_substitute(xp, A, b, X):
    """Y = (I + diag(b) A)^-1 diag(b) X for strictly lower-triangular A, row by row."""
    C = A.shape[-1]
    Y = xp.empty_like(X)
    for t in range(C):
        acc = X[..., t, :]
        if t:
            acc = acc - (A[..., t : t + 1, :t] @ Y[..., :t, :])[..., 0, :]
        Y[..., t, :] = b[..., t, None] * acc
    return Y


def chunked_f32(xp: Any, inp: dict, scale: float, gate_floor: float = -5.0, eps: float = 1e-6,
                chunk: int = 64) -> tuple[Any, Any]:
    """fp32 chunked forward. Returns (output bf16 [B,T,H,V], final_state fp32 [B,H,V,K])."""
    from .backend import to_bf16

    f32 = xp.float32
    qh, kh, v, ld, b, (B, T, H, K, V) = _prepare(xp, inp, gate_floor, eps, f32)
    BH, C = B * H, chunk
    N = -(-T // C)
    pad = N * C - T
    if pad:
        # Padding tokens have no key, no value, no decay and beta 0: they leave the state alone.
        def padded(x):
            return xp.concatenate([x, xp.zeros((BH, pad) + x.shape[2:], dtype=f32)], axis=1)

        qh, kh, v, ld, b = (padded(x) for x in (qh, kh, v, ld, b))
    qh, kh, v, ld = (x.reshape(BH, N, C, x.shape[-1]) for x in (qh, kh, v, ld))
    b = b.reshape(BH, N, C)
    G = xp.cumsum(ld, axis=2)  # cumulative log decay inside each chunk, <= 0
    G_end = G[:, :, C - 1 : C, :]
    A, Qk = _intra_chunk(xp, qh, kh, G)
    Kd = kh * xp.exp(G)  # key as seen from the chunk start
    Qd = qh * xp.exp(G)
    Kr = kh * xp.exp(G_end - G)  # key decayed to the chunk end
    decay_end = xp.exp(G_end[:, :, 0, :])  # [BH, N, K]
    Y = _forward_substitute(xp, A, b, xp.concatenate([v, Kd], axis=-1))
    U0, W = Y[..., :V], Y[..., V:]
    # Sequential part: S[h, k, v] from chunk to chunk.
    S = xp.ascontiguousarray(inp["initial_state"].astype(f32).reshape(BH, V, K).transpose(0, 2, 1))
    out = xp.empty((BH, N, C, V), dtype=f32)
    for n in range(N):
        U = U0[:, n] - W[:, n] @ S  # beta-weighted residuals of the chunk
        out[:, n] = scale * (Qd[:, n] @ S + Qk[:, n] @ U)
        S = decay_end[:, n, :, None] * S + Kr[:, n].swapaxes(-1, -2) @ U
    output = out.reshape(BH, N * C, V)[:, :T].reshape(B, H, T, V).transpose(0, 2, 1, 3)
    final = S.transpose(0, 2, 1).reshape(B, H, V, K)
    return to_bf16(xp, xp.ascontiguousarray(output)), xp.ascontiguousarray(final)
