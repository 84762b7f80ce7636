"""The bench stage's screen: skip the official benchmark of a candidate that cannot win.

The gputest stage (with `quick_calls`) times a passing candidate at the scored shape, in
the candidate's own process: `quick_ms`. A bench costs a minute of GPU or more; when the
quick time is slower than the best's *official* figure by more than `skip_slower_than`,
the bench is not run and the stage fails with kind `screened`.

Why it is safe to trust a figure the candidate reported: it can only cost the candidate
itself its bench (a faked fast time is benched like any other), and the other side of the
comparison is the judge's own figure for the best, never the best's quick time (which the
best could fake small to have every challenger skipped).
"""
from __future__ import annotations

import statistics

from evolve.population import Population, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage


def quick_ms(pop: Population, candidate_id: int) -> float | None:
    """The candidate's quick time from its latest passed gputest, if one was taken."""
    for ev in reversed(pop.evaluations(candidate_id, Stage.GPUTEST)):
        if ev.status == EvaluationStatus.PASSED:
            value = (ev.metrics or {}).get("quick_ms")
            return float(value) if isinstance(value, (int, float)) and value > 0 else None
    return None


def official_ms(pop: Population, candidate_id: int) -> float | None:
    """The median of a candidate's passed official figures (bench, confirmations, rebenches)."""
    official = (Stage.BENCH, Stage.CONFIRM, Stage.REBENCH)
    times = [float(ev.ms) for ev in pop.evaluations(candidate_id)
             if ev.stage in official and ev.status == EvaluationStatus.PASSED and ev.ms and ev.ms > 0]
    return statistics.median(times) if times else None


def screened(pop: Population, workload_id: int, candidate_id: int, skip_slower_than: float) -> StageResult | None:
    """The failed bench result to record instead of running it, or None to run it."""
    if skip_slower_than <= 0:
        return None
    quick = quick_ms(pop, candidate_id)
    best = pop.best(workload_id)
    if quick is None or best is None or best.candidate_id == candidate_id:
        return None
    best_ms = official_ms(pop, best.candidate_id)
    if best_ms is None or quick <= skip_slower_than * best_ms:
        return None
    return StageResult(
        status=EvaluationStatus.FAILED, failure_kind=FailureKind.SCREENED,
        message=(f"bench skipped: quick time {quick:.4g} ms is {quick / best_ms:.2f}x the best's official "
                 f"{best_ms:.4g} ms (candidate {best.candidate_id}); skip_slower_than = {skip_slower_than:g}"),
        metrics={"quick_ms": quick, "best_ms": best_ms, "best_id": best.candidate_id,
                 "skip_slower_than": skip_slower_than})
