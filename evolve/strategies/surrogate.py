"""A small Gaussian-process surrogate in NumPy: points encoded as vectors, a Matérn-5/2
kernel whose length scale is chosen by marginal likelihood from a short grid, expected
improvement, and a kernel-smoothed estimate of how likely a point is to fail.

Small on purpose: a few hundred observations per fit, so a proposal stays within
milliseconds however large the population grows (the training set is capped).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from evolve.families import Family, Value, value_key

LENGTH_SCALES = (0.08, 0.15, 0.3, 0.6, 1.2)   # in units of sqrt(dimensions)
NOISE = 1e-3                                   # of the standardised variance: timings are nearly exact
FAIL_PRIOR = 0.5                               # pseudo-count pulling the failure estimate towards 0


def _numeric(values: Sequence[Value]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


class Encoder:
    """Numeric parameters by rank in [0, 1] (powers of two become evenly spaced); others
    one-hot, scaled so two different values are at distance 1."""

    def __init__(self, family: Family):
        self.columns: list[tuple[str, dict]] = []
        width = 0
        for name, values in family.parameters.items():
            if len(values) < 2:
                continue
            if _numeric(values):
                ordered = sorted(values)
                self.columns.append((name, {value_key(v): (width, i / (len(ordered) - 1)) for i, v in enumerate(ordered)}))
                width += 1
            else:
                self.columns.append((name, {value_key(v): (width + i, math.sqrt(0.5)) for i, v in enumerate(values)}))
                width += len(values)
        self.width = max(width, 1)

    def encode(self, points: Sequence[dict[str, Value]]) -> np.ndarray:
        x = np.zeros((len(points), self.width))
        for row, point in enumerate(points):
            for name, table in self.columns:
                col, value = table[value_key(point[name])]
                x[row, col] = value
        return x


def distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :]
    d -= 2.0 * a @ b.T
    np.maximum(d, 0.0, out=d)
    return np.sqrt(d, out=d)


def matern52(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    r = distances(a, b)
    r *= math.sqrt(5.0) / length
    return _matern52(r)


def _matern52(r: np.ndarray) -> np.ndarray:
    """The kernel at scaled distances `r`, overwriting them: a proposal builds a 3 000 x 300
    matrix, and each temporary would cost a pass over it."""
    decay = np.exp(np.negative(r))
    square = r * r
    square /= 3.0
    r += 1.0
    r += square                                        # 1 + r + r^2 / 3
    r *= decay
    return r


class GaussianProcess:
    def __init__(self, x: np.ndarray, y: np.ndarray, lengths: Sequence[float] | None = None):
        """`lengths`: absolute length scales to choose from (default: the grid, scaled)."""
        self.x = x
        self.mean = float(y.mean())
        self.scale = float(y.std()) or 1.0
        z = (y - self.mean) / self.scale
        dims = math.sqrt(x.shape[1])
        grid = lengths or [length * dims for length in LENGTH_SCALES]
        n = len(x)
        d = distances(x, x)   # the same for every length scale
        best = None
        for length in grid:
            k = _matern52(d * (math.sqrt(5.0) / length))
            k.flat[:: n + 1] += NOISE
            if len(grid) == 1:
                best = (0.0, length, k)
                break
            # The evidence needs L^-1 z, not the inverse factor: the Cholesky factor of K
            # bordered by z ends in that row (its corner stays positive: z'K^-1 z is at most
            # |z|^2 / NOISE), so one factorisation per length scale, one inverse in all.
            bordered = np.empty((n + 1, n + 1))
            bordered[:n, :n] = k
            bordered[n, :n] = bordered[:n, n] = z
            bordered[n, n] = 2.0 * float(z @ z) / NOISE + 1.0
            try:
                chol = np.linalg.cholesky(bordered)
            except np.linalg.LinAlgError:
                continue
            w = chol[n, :n]
            evidence = -0.5 * float(w @ w) - float(np.log(np.diag(chol)[:n]).sum())
            if best is None or evidence > best[0]:
                best = (evidence, length, k)
        assert best is not None, "the kernel with the most noise is always positive definite"
        _, self.length, k = best
        # NumPy has no triangular solve: the inverse factor turns every solve into a product.
        self.inv = np.linalg.inv(np.linalg.cholesky(k))
        self.alpha = self.inv.T @ (self.inv @ z)

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ks = matern52(x, self.x, self.length)
        mu = ks @ self.alpha
        v = self.inv @ ks.T
        v *= v
        var = np.maximum(1.0 - v.sum(0), 1e-12)
        return mu * self.scale + self.mean, np.sqrt(var) * self.scale


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (error below 1.5e-7): NumPy has no erf, SciPy is not a dependency.
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


def expected_improvement(mu: np.ndarray, sigma: np.ndarray, best: float, xi: float = 0.0) -> np.ndarray:
    """For minimisation: E[max(best - xi - f, 0)] under f ~ N(mu, sigma)."""
    gain = best - xi - mu
    z = gain / sigma
    cdf = 0.5 * (1.0 + _erf(z / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return gain * cdf + sigma * pdf


def failure_probability(x: np.ndarray, seen: np.ndarray, failed: np.ndarray, length: float) -> np.ndarray:
    """Kernel-weighted share of failures among observed neighbours, shrunk towards zero
    where few are near (an unexplored region is not presumed broken)."""
    if not len(seen) or not failed.any():
        return np.zeros(len(x))
    w = matern52(x, seen, length)
    return (w @ failed) / (w.sum(1) + FAIL_PRIOR)
