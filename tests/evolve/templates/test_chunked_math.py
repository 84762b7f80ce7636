"""The chunked form the KDA kernels compute, with their reference points and block
structure, matches the token-by-token recurrence in float64 (README "The math")."""
from __future__ import annotations

import numpy as np
import pytest

K = 128


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _inputs(rng, T, H, regime="scored"):
    q, k, v, g = (rng.normal(size=(T, H, K)) * 0.5 for _ in range(4))
    beta = rng.normal(size=(T, H)) * 0.5
    A_log = np.log(rng.uniform(1, 16, H))
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), H * K))
    dt_bias = dt + np.log(-np.expm1(-dt))
    if regime == "saturated":            # every token at the -5 floor
        A_log[:], dt_bias[:], g[:] = np.log(16.0), 0.0, 3.0
    elif regime == "switch":             # alternating bands of deep decay
        g[(np.arange(T) // 16) % 2 == 1] = 10.0
    S0 = rng.normal(size=(H, K, K)) * 0.25   # V-first
    return q, k, v, g, beta, A_log, dt_bias, S0


def _gates(q, k, g, beta, A_log, dt_bias, h):
    qh = q / np.sqrt((q ** 2).sum(-1, keepdims=True) + 1e-6)
    kh = k / np.sqrt((k ** 2).sum(-1, keepdims=True) + 1e-6)
    a = -5.0 * _sigmoid(np.exp(A_log[h]) * (g + dt_bias[h * K:(h + 1) * K]))
    return qh, kh, a, _sigmoid(beta)


def recurrence(q, k, v, g, beta, A_log, dt_bias, S0, scale):
    T, H, _ = q.shape
    out, S_out = np.zeros((T, H, K)), np.zeros_like(S0)
    for h in range(H):
        qh, kh, a, b = _gates(q[:, h], k[:, h], g[:, h], beta[:, h], A_log, dt_bias, h)
        S = S0[h].T.copy()
        for t in range(T):
            S *= np.exp(a[t])[:, None]
            r = v[t, h] - S.T @ kh[t]
            S += b[t] * np.outer(kh[t], r)
            out[t, h] = scale * (S.T @ qh[t])
        S_out[h] = S.T
    return out, S_out


def chunked(q, k, v, g, beta, A_log, dt_bias, S0, scale, C=64):
    """64-token chunks, 16-token blocks: the reference points of the prep kernel."""
    T, H, _ = q.shape
    NC = -(-T // C)
    out, S_out = np.zeros((T, H, K)), np.zeros_like(S0)
    for h in range(H):
        S = S0[h].T.copy()
        for c in range(NC):
            n = min(C, T - c * C)
            rows = slice(c * C, c * C + n)
            pad = lambda x, n=n: np.concatenate([x, np.zeros((C - n,) + x.shape[1:])])
            qh, kh, a, b = (pad(x) for x in _gates(q[rows, h], k[rows, h], g[rows, h], beta[rows, h],
                                                   A_log, dt_bias, h))
            V = pad(v[rows, h])
            gam = np.cumsum(a, 0)                      # pads: a = 0, b = 0, q = k = v = 0
            M, P = np.zeros((C, C)), np.zeros((C, C))
            for tb in range(C // 16):
                rb = slice(16 * tb, 16 * tb + 16)
                m = gam[16 * tb + 7]                   # diagonal block: middle token
                assert np.abs(gam[rb] - m).max() <= 40 + 1e-9
                Ek, Eq, Ei = kh[rb] * np.exp(gam[rb] - m), qh[rb] * np.exp(gam[rb] - m), kh[rb] * np.exp(m - gam[rb])
                M[rb, rb], P[rb, rb] = Ek @ Ei.T, Eq @ Ei.T
                if tb:
                    r = gam[16 * tb - 1]               # earlier blocks: last token before tb
                    prev = slice(0, 16 * tb)
                    assert (gam[rb] - r).max() <= 0 and (r - gam[prev]).max() <= 0
                    Ei = kh[prev] * np.exp(r - gam[prev])
                    M[rb, prev] = (kh[rb] * np.exp(gam[rb] - r)) @ Ei.T
                    P[rb, prev] = (qh[rb] * np.exp(gam[rb] - r)) @ Ei.T
            M, P = np.tril(M, -1) * b, np.tril(P) * b
            Tinv = np.linalg.inv(np.eye(C) + M)
            G = np.exp(gam)
            W, Ut = Tinv @ (kh * G), Tinv @ V
            U = Ut - W @ S
            O = scale * ((qh * G) @ S + P @ U)
            S = np.exp(gam[-1])[:, None] * S + (kh * np.exp(gam[-1] - gam) * b[:, None]).T @ U
            out[rows, h] = O[:n]
        S_out[h] = S.T
    return out, S_out


@pytest.mark.parametrize("T", [1, 17, 63, 64, 65, 130])
@pytest.mark.parametrize("regime", ["scored", "saturated", "switch"])
def test_chunked_form_matches_recurrence(T, regime):
    rng = np.random.default_rng(T * 7 + len(regime))
    args = _inputs(rng, T, 2, regime)
    ref_o, ref_s = recurrence(*args, scale=K ** -0.5)
    o, s = chunked(*args, scale=K ** -0.5)
    assert np.all(np.isfinite(o)) and np.all(np.isfinite(s))
    np.testing.assert_allclose(o, ref_o, rtol=0, atol=1e-10 * max(1.0, np.abs(ref_o).max()))
    np.testing.assert_allclose(s, ref_s, rtol=0, atol=1e-10 * max(1.0, np.abs(ref_s).max()))


def test_unit_triangular_inverse_by_blocks():
    """The prep kernel's inverse: diagonal blocks by forward substitution, then
    T_ij = -T_ii sum_{m=j}^{i-1} M_im T_mj by increasing block distance."""
    rng = np.random.default_rng(3)
    M = np.tril(rng.normal(size=(64, 64)) * 0.3, -1)
    T = np.zeros((64, 64))
    blk = lambda i: slice(16 * i, 16 * i + 16)
    for j in range(4):
        Mj = M[blk(j), blk(j)]
        for c in range(16):
            x = np.zeros(16)
            for r in range(16):
                x[r] = (r == c) - Mj[r, :r] @ x[:r]
            T[blk(j), 16 * j + c] = x
    for d in range(1, 4):
        for j in range(4 - d):
            i = j + d
            Y = sum(M[blk(i), blk(m)] @ T[blk(m), blk(j)] for m in range(j, i))
            T[blk(i), blk(j)] = -T[blk(i), blk(i)] @ Y
    np.testing.assert_allclose(T @ (np.eye(64) + M), np.eye(64), atol=1e-9)
