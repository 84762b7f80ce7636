"""The search's progress as numbers: the confirmed best over evaluations and over time,
and what each stage cost."""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from evolve.db.records import EvaluationSummary, Promotion
from evolve.report.plots import Point
from evolve.vocabulary import VERDICTS, EvaluationStatus, FailureKind, Stage

_STAGE_ORDER = {str(s): n for n, s in enumerate(Stage)}


def stage_rank(stage: str) -> tuple[int, str]:
    # Pipeline order, then any stage an older version recorded, by name.
    return (_STAGE_ORDER.get(stage, len(_STAGE_ORDER)), stage)


def best_so_far(evaluations: Sequence[EvaluationSummary], promotions: Sequence[Promotion],
                ranked_stage: Stage = Stage.BENCH) -> tuple[list[Point], list[Point]]:
    """The confirmed best as the search went: (by finished evaluation count, by hours).

    One point per promotion, at its last confirmation run, valued at the promoted
    candidate's best bench speedup: an unconfirmed bench (one lucky run) never moves it."""
    # (end, evaluation): the end kept beside it, so it is known to be set.
    finished = sorted(
        ((e.ended_at, e) for e in evaluations if e.ended_at is not None and e.status in VERDICTS),
        key=lambda pair: (pair[0], pair[1].id),
    )
    if not finished:
        return [], []
    order = {e.id: n for n, (_, e) in enumerate(finished, start=1)}
    ended = {e.id: end for end, e in finished}
    speed: dict[int, float] = {}
    for _, e in finished:
        if e.stage == ranked_stage and e.status == EvaluationStatus.PASSED and e.speedup is not None:
            speed[e.candidate_id] = max(e.speedup, speed.get(e.candidate_id, e.speedup))
    origin = min(e.started_at for e in evaluations)
    by_count: list[Point] = []
    by_time: list[Point] = []
    for p in sorted(promotions, key=lambda p: p.id):
        value = speed.get(p.candidate_id)
        if value is None:
            continue
        confirmations = [i for i in p.confirmation_eval_ids if i in order]
        last = max(confirmations, key=lambda i: order[i]) if confirmations else None
        n = order[last] if last is not None else sum(1 for end, _ in finished if end <= p.promoted_at)
        at = ended[last] if last is not None else p.promoted_at
        by_count.append((float(n), value))
        by_time.append(((at - origin).total_seconds() / 3600, value))
    return by_count, by_time


@dataclass(frozen=True)
class StageTiming:
    stage: str
    count: int
    passed: int
    failed: int
    other: int              # running or interrupted
    median_s: float | None
    p90_s: float | None
    total_s: float
    queue_ms: float | None
    lease_ms: float | None


def stage_timing(evaluations: Sequence[EvaluationSummary]) -> list[StageTiming]:
    groups: dict[str, list[EvaluationSummary]] = defaultdict(list)
    for ev in evaluations:
        groups[ev.stage].append(ev)
    rows = []
    for stage, evs in groups.items():
        # A screened bench never ran: its instant would pull the bench's times down.
        durations = sorted(d for d in (e.duration_s for e in evs if e.failure_kind != FailureKind.SCREENED)
                           if d is not None)
        queue = [e.queue_ms for e in evs if e.queue_ms is not None]
        lease = [e.lease_held_ms for e in evs if e.lease_held_ms is not None]
        statuses = Counter(e.status for e in evs)
        rows.append(StageTiming(
            stage=stage, count=len(evs),
            passed=statuses[EvaluationStatus.PASSED], failed=statuses[EvaluationStatus.FAILED],
            other=statuses[EvaluationStatus.RUNNING] + statuses[EvaluationStatus.INTERRUPTED],
            median_s=statistics.median(durations) if durations else None,
            p90_s=durations[min(len(durations) - 1, int(0.9 * len(durations)))] if durations else None,
            total_s=sum(durations),
            queue_ms=statistics.fmean(queue) if queue else None,
            lease_ms=statistics.fmean(lease) if lease else None,
        ))
    return sorted(rows, key=lambda r: stage_rank(r.stage))


@dataclass(frozen=True)
class FailureTable:
    stages: list[str]
    rows: list[tuple[str, list[int], int]]   # (failure kind, count per stage, total)


def failure_table(evaluations: Sequence[EvaluationSummary]) -> FailureTable:
    failures = Counter((e.stage, e.failure_kind or "?") for e in evaluations if e.status == EvaluationStatus.FAILED)
    stages = sorted({s for s, _ in failures}, key=stage_rank)
    kinds = sorted({k for _, k in failures})
    return FailureTable(stages, [(k, [failures.get((s, k), 0) for s in stages],
                                  sum(failures.get((s, k), 0) for s in stages)) for k in kinds])
