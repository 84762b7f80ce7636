"""Lane-level checks of the fragment plumbing the fused kernel adds on top of two_pass.

The state warps of `kda_fused.cu.j2` use `load_b_nk` (which two_pass never calls),
repack accumulators into A operands (`acc_to_a`), and store the output through a
swizzled per-warp staging tile with a lane-pair shuffle. This module emulates ldmatrix
and mma.m16n8k16 lane by lane (register layouts from the PTX ISA, as documented at the
top of kda_tiles.cuh), with the address formulas of kda_tiles.cuh / kda_fused.cu.j2
transcribed, and checks that each product and the store compute what the kernel's
comments say.
"""
from __future__ import annotations

import numpy as np
import pytest

LANES = np.arange(32)


def ldsm_x4(smem, row_addr, trans=False):
    """ldmatrix .x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i. -> [32][4][2]."""
    regs = np.zeros((32, 4, 2))
    for i in range(4):
        mat = np.array([smem[row_addr[8 * i + r]: row_addr[8 * i + r] + 8] for r in range(8)])
        if trans:
            mat = mat.T
        for lane in LANES:
            regs[lane, i] = mat[lane // 4, 2 * (lane % 4): 2 * (lane % 4) + 2]
    return regs


def a_matrix(a):
    """[32][4][2] A fragment -> the 16 x 16 matrix."""
    m = np.full((16, 16), np.nan)
    for lane in LANES:
        g, q = lane // 4, lane % 4
        for j, (r, c) in enumerate([(g, 2 * q), (g + 8, 2 * q), (g, 2 * q + 8), (g + 8, 2 * q + 8)]):
            m[r, c:c + 2] = a[lane, j]
    return m


def b_matrix(b0, b1):
    """[32][2] registers b0, b1 of one n-tile -> the 16 x 8 matrix (k x n)."""
    m = np.full((16, 8), np.nan)
    for lane in LANES:
        g, q = lane // 4, lane % 4
        m[2 * q:2 * q + 2, g] = b0[lane]
        m[2 * q + 8:2 * q + 10, g] = b1[lane]
    return m


def c_frag(cm):
    """16 x 8 matrix -> [32][4] accumulator fragment."""
    out = np.zeros((32, 4))
    for lane in LANES:
        g, q = lane // 4, lane % 4
        out[lane] = [cm[g, 2 * q], cm[g, 2 * q + 1], cm[g + 8, 2 * q], cm[g + 8, 2 * q + 1]]
    return out


def load_b_nk(smem, stride, k0, n0):
    addr = [(n0 + (l & 7) + ((l >> 4) << 3)) * stride + k0 + (((l >> 3) & 1) << 3) for l in LANES]
    return ldsm_x4(smem, addr)


def load_b_kn(smem, stride, k0, n0):
    addr = [(k0 + (l & 15)) * stride + n0 + ((l >> 4) << 3) for l in LANES]
    return ldsm_x4(smem, addr, trans=True)


def acc_to_a(c0, c1):
    a = np.zeros((32, 4, 2))
    a[:, 0], a[:, 1], a[:, 2], a[:, 3] = c0[:, 0:2], c0[:, 2:4], c1[:, 0:2], c1[:, 2:4]
    return a


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_load_b_nk_reads_the_transpose(rng):
    """B[k][n] = X[n0 + n][k0 + k] for X stored [N][K] (the w, qg and p tiles)."""
    stride, N = 136, 64
    X = rng.normal(size=(N, stride))
    flat = X.reshape(-1)
    for k0, n0 in [(0, 0), (48, 16), (112, 48)]:
        b = load_b_nk(flat, stride, k0, n0)
        np.testing.assert_array_equal(b_matrix(b[:, 0], b[:, 1]), X[n0:n0 + 8, k0:k0 + 16].T)
        np.testing.assert_array_equal(b_matrix(b[:, 2], b[:, 3]), X[n0 + 8:n0 + 16, k0:k0 + 16].T)


def test_load_b_kn_reads_the_tile(rng):
    """B[k][n] = X[k0 + k][n0 + n] for X stored [K][N] (the kd tile in the update)."""
    stride = 136
    X = rng.normal(size=(64, stride))
    b = load_b_kn(X.reshape(-1), stride, 32, 24)
    np.testing.assert_array_equal(b_matrix(b[:, 0], b[:, 1]), X[32:48, 24:32])
    np.testing.assert_array_equal(b_matrix(b[:, 2], b[:, 3]), X[32:48, 32:40])


def test_accumulators_repack_into_a_fragment(rng):
    M = rng.normal(size=(16, 16))
    a = acc_to_a(c_frag(M[:, :8]), c_frag(M[:, 8:]))
    np.testing.assert_array_equal(a_matrix(a), M)


def test_state_step_products(rng):
    """One state warp's chunk step, fragment by fragment, against the matrix formulas:
    U^T = ut^T - S0^T w^T, O^T = S0^T qg^T + U^T p^T (causal blocks), S^T = S0^T diag(gc) + U^T kd."""
    C, K, KS, PS, VS = 64, 128, 136, 72, 72
    St = rng.normal(size=(16, K))                       # this warp's 16 value rows
    w, qg, kd = (rng.normal(size=(C, KS)) for _ in range(3))
    ut = rng.normal(size=(C, VS))
    p = np.tril(rng.normal(size=(C, PS)))
    gc = rng.uniform(size=K)
    v0 = 16                                             # the warp's rows within the v block
    S = [c_frag(St[:, 8 * nt:8 * nt + 8]) for nt in range(K // 8)]
    ua, O = [], np.zeros((16, C))
    for tb in range(4):
        acc_u = [np.zeros((32, 4)), np.zeros((32, 4))]
        acc_o = [np.zeros((32, 4)), np.zeros((32, 4))]
        for ks in range(K // 16):
            A = a_matrix(acc_to_a(S[2 * ks], S[2 * ks + 1]))
            for src, acc in ((w, acc_u), (qg, acc_o)):
                b = load_b_nk(src.reshape(-1), KS, ks * 16, tb * 16)
                for j in range(2):
                    acc[j] += c_frag(A @ b_matrix(b[:, 2 * j], b[:, 2 * j + 1]))
        for nt in range(2):                             # U^T = ut^T - acc (the kernel's scalar reads)
            for lane in LANES:
                g, q = lane // 4, lane % 4
                t, vr = tb * 16 + nt * 8 + 2 * q, v0 + g
                acc_u[nt][lane] = [ut[t, vr], ut[t + 1, vr], ut[t, vr + 8], ut[t + 1, vr + 8]] - acc_u[nt][lane]
        ua.append(acc_to_a(acc_u[0], acc_u[1]))
        for i in range(tb + 1):
            b = load_b_nk(p.reshape(-1), PS, i * 16, tb * 16)
            for j in range(2):
                acc_o[j] += c_frag(a_matrix(ua[i]) @ b_matrix(b[:, 2 * j], b[:, 2 * j + 1]))
        for j in range(2):
            for lane in LANES:
                g, q = lane // 4, lane % 4
                t = tb * 16 + j * 8 + 2 * q
                O[g, t:t + 2], O[g + 8, t:t + 2] = acc_o[j][lane, 0:2], acc_o[j][lane, 2:4]
    U = ut[:, v0:v0 + 16].T - St @ w[:, :K].T          # [16 v][C t]
    np.testing.assert_allclose(np.hstack([a_matrix(x) for x in ua]), U, atol=1e-12)
    np.testing.assert_allclose(O, St @ qg[:, :K].T + U @ p[:, :C].T, atol=1e-12)
    # update
    for nt in range(K // 8):                            # decay: columns 2q, 2q + 1 of each n-tile
        col = 8 * nt + 2 * (LANES % 4)
        S[nt] = S[nt] * np.stack([gc[col], gc[col + 1], gc[col], gc[col + 1]], 1)
    for ks in range(4):
        A = a_matrix(ua[ks])
        for nt in range(0, K // 8, 2):
            b = load_b_kn(kd.reshape(-1), KS, ks * 16, nt * 8)
            S[nt] += c_frag(A @ b_matrix(b[:, 0], b[:, 1]))
            S[nt + 1] += c_frag(A @ b_matrix(b[:, 2], b[:, 3]))
    S_new = np.zeros((16, K))
    for nt in range(K // 8):
        for lane in LANES:
            g, q = lane // 4, lane % 4
            S_new[g, 8 * nt + 2 * q: 8 * nt + 2 * q + 2] = S[nt][lane, 0:2]
            S_new[g + 8, 8 * nt + 2 * q: 8 * nt + 2 * q + 2] = S[nt][lane, 2:4]
    np.testing.assert_allclose(S_new, St * gc[None, :] + U @ kd[:, :K], atol=1e-12)


def stage_word(t, w):
    return t * 8 + (w ^ (((t >> 2) & 1) << 2))


def test_output_staging_store(rng):
    """store_out_block: the lane-pair shuffle and the swizzled 16 x 16 staging tile write
    every (token, value) of the block once, with the right value, and neither the word
    writes nor the 16-byte reads conflict on banks."""
    O = rng.normal(size=(16, 16))                       # O^T [v][t] of one block
    o = [c_frag(O[:, :8]), c_frag(O[:, 8:])]
    stage = np.full((128, 2), np.nan)                   # 128 words of two bf16 values
    for nt in range(2):
        for h8 in range(2):
            e0, e1 = o[nt][:, 2 * h8], o[nt][:, 2 * h8 + 1]
            odd = (LANES >> 2) & 1
            sent = np.where(odd == 1, e0, e1)
            x = sent[LANES ^ 4]                         # __shfl_xor_sync(.., 4)
            banks = []
            for lane in LANES:
                g, q = lane >> 2, lane & 3
                t = nt * 8 + 2 * q + odd[lane]
                w = (h8 * 8 + g - odd[lane]) >> 1
                word = stage_word(t, w)
                stage[word] = (x[lane], e1[lane]) if odd[lane] else (e0[lane], x[lane])
                banks.append(word % 32)
            assert len(set(banks)) == 32                # one word per bank
    out = np.full((16, 16), np.nan)                     # out[t][v]
    for lane in LANES:
        t, half = lane >> 1, lane & 1
        first = stage_word(t, half * 4)
        out[t, half * 8: half * 8 + 8] = stage[first:first + 4].reshape(-1)
    np.testing.assert_array_equal(out, O.T)
    for quarter in range(4):                            # 16-byte reads: 8 lanes per phase
        words = [stage_word(l >> 1, (l & 1) * 4) + i for l in range(8 * quarter, 8 * quarter + 8) for i in range(4)]
        assert len({wd % 32 for wd in words}) == 32
