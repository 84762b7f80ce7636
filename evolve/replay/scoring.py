"""Scores of replayed runs against random search's exact distribution."""
from __future__ import annotations

import math
import statistics


def random_median(total: int, good: int) -> int:
    """Median number of draws, without replacement from `total` points of which `good` are
    good, until the first good one: the least t with P(T <= t) >= 1/2, where
    P(T > t) = C(total-good, t) / C(total, t) = prod_{i<t} (total-good-i) / (total-i)."""
    if not 0 < good <= total:
        raise ValueError(f"need 0 < good <= total, not good={good}, total={total}")
    survive = 1.0
    for t in range(1, total - good + 2):
        survive *= (total - good - (t - 1)) / (total - (t - 1))
        if survive <= 0.5:
            return t
    return total - good + 1   # pragma: no cover (survive reaches 0 at t = total-good+1)


def random_expected_best(total: int, times: list[float], n: int) -> float:
    """Expected best time after n random draws without replacement from `total` points
    (failures never win), for the best-so-far curve of random search."""
    ordered = sorted(times)
    # P(best is the k-th fastest) = P(k-th drawn, none faster) over the order statistics.
    exp = 0.0
    prev_none = 1.0   # P(none of the k fastest drawn)
    none_k = 1.0
    for k, t in enumerate(ordered, start=1):
        # P(none of the fastest k in n draws) = C(total-k, n) / C(total, n)
        if total - k < n:
            none_k = 0.0
        else:
            none_k = none_k * (total - k + 1 - n) / (total - k + 1)
        exp += t * (prev_none - none_k)
        prev_none = none_k
        if prev_none == 0.0:
            break
    return exp


def median_evals(counts: list[int | None]) -> float:
    """The median over seeds, a run that never got there counting as infinitely many."""
    return statistics.median([math.inf if c is None else c for c in counts])


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan
