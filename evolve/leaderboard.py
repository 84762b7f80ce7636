"""The leaderboard: confirmed candidates first (the current best on top), then the rest,
each group by its best passed bench speedup. An unconfirmed bench is one lucky run until
confirmation says otherwise, so it never outranks a confirmed one. Each row carries the
widest spread its runs measured and a noise flag: the spread is at least the gain.

Ranking walks the `candidates.best_speedup` index from the top (the column is kept by
`Population.finish_stage`); details (times, spread, sectors, confirmation marks) are
then fetched for the few rows shown. The views of these rows are in `evolve.leaderboard_view`.
"""
from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.cards import bench_card
from evolve.db.models import CandidateModel, EvaluationModel, PromotionModel
from evolve.db.records import LeaderboardRow
from evolve.vocabulary import EvaluationStatus, Stage


def is_noisy(speedup: float, spread: float | None) -> bool:
    """The measured spread is at least the gain over the baseline: the figure can't be told
    apart from no gain at all."""
    return spread is not None and spread >= abs(speedup - 1.0)


def leaderboard_rows(session: Session, *, workload_id: int | None = None, limit: int | None = 20) -> list[LeaderboardRow]:
    # Plain Core queries on the session's connection: this runs on every `evolve
    # leaderboard` and in the search loop, and ORM objects would cost more than the SQL.
    conn = session.connection()
    C = CandidateModel
    P = PromotionModel
    promoted_ids = select(P.candidate_id)
    if workload_id is not None:
        promoted_ids = promoted_ids.where(P.workload_id == workload_id)
    latest_per_workload = select(func.max(P.id)).group_by(P.workload_id).scalar_subquery()
    current_best = set(conn.execute(select(P.candidate_id).where(P.id.in_(latest_per_workload))).scalars())
    # candidates.best_speedup is kept by finish_stage, so ranking reads the top of an index.
    columns = (C.id, C.workload_id, C.name, C.directory, C.origin, C.family, C.author, C.generation,
               C.best_speedup.label("speedup"))
    base = select(*columns).where(C.best_speedup.is_not(None)).order_by(C.best_speedup.desc(), C.id)
    if workload_id is not None:
        base = base.where(C.workload_id == workload_id)
    # Promotions are few (each beat the best side by side): the confirmed group is read whole.
    confirmed = sorted(conn.execute(base.where(C.id.in_(promoted_ids))).all(),
                       key=lambda row: row.id not in current_best)   # stable: speedup order kept
    rest = base.where(C.id.not_in(promoted_ids))
    if limit is not None and limit > 0:
        confirmed = confirmed[:limit]
        room = limit - len(confirmed)
        others = conn.execute(rest.limit(room)).all() if room > 0 else []
    else:
        others = conn.execute(rest).all()
    top = [*confirmed, *others]
    if not top:
        return []
    ids = [row.id for row in top]

    # The evaluation that holds each candidate's best speedup (lowest id on ties).
    E = EvaluationModel
    bench: dict[int, tuple[int | None, float | None, float | None, float | None, int | None]] = {}
    cards: dict[int, str] = {}   # the card that bench ran on: speedups of two kinds of card do not compare
    for ev in conn.execute(
        select(E.candidate_id, E.id, E.ms, E.baseline_ms, E.spread, E.excessive_sectors, E.metrics)
        .where(E.candidate_id.in_(ids), E.stage == Stage.BENCH, E.status == EvaluationStatus.PASSED,
               E.speedup.is_not(None))
        .order_by(E.speedup.desc(), E.id)
    ):
        if ev.candidate_id in bench:
            continue
        bench[ev.candidate_id] = (ev.id, ev.ms, ev.baseline_ms, ev.spread, ev.excessive_sectors)
        if (card := bench_card(ev.metrics)) is not None:
            cards[ev.candidate_id] = card

    # Excessive sectors: from the bench row if it has them, else the latest passed profile.
    sectors: dict[int, int] = {
        cid: value
        for cid, value in conn.execute(
            select(E.candidate_id, E.excessive_sectors)
            .where(E.candidate_id.in_(ids), E.stage == Stage.NCU, E.status == EvaluationStatus.PASSED,
                   E.excessive_sectors.is_not(None))
            .order_by(E.id)
        )
        if value is not None  # the query leaves none out; the column's type still allows them
    }

    promoted = {row.id for row in confirmed}
    # The widest spread any passed bench or confirmation of the candidate measured.
    widest: dict[int, float] = {
        cid: float(value)
        for cid, value in conn.execute(
            select(E.candidate_id, func.max(E.spread))
            .where(E.candidate_id.in_(ids), E.stage.in_((Stage.BENCH, Stage.CONFIRM)),
                   E.status == EvaluationStatus.PASSED)
            .group_by(E.candidate_id)
        )
        if value is not None
    }

    rows: list[LeaderboardRow] = []
    for rank, cand in enumerate(top, start=1):
        # (None...) only if best_speedup was edited by hand; recompute_best_speedups repairs it.
        eid, ms, baseline_ms, spread, bench_sectors = bench.get(cand.id, (None, None, None, None, None))
        spread = widest.get(cand.id, spread)
        rows.append(
            LeaderboardRow(
                rank=rank,
                candidate_id=cand.id,
                workload_id=cand.workload_id,
                name=cand.name,
                directory=cand.directory,
                origin=cand.origin,
                family=cand.family,
                author=cand.author,
                generation=cand.generation,
                evaluation_id=eid,
                ms=ms,
                baseline_ms=baseline_ms,
                speedup=float(cand.speedup),
                spread=spread,
                noisy=is_noisy(float(cand.speedup), spread),
                excessive_sectors=bench_sectors if bench_sectors is not None else sectors.get(cand.id),
                confirmed=cand.id in promoted,
                best=cand.id in current_best,
                device=cards.get(cand.id),
            )
        )
    return rows
