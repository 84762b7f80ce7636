"""The leaderboard: candidates ranked by their best passed bench speedup.

Ranking walks the `candidates.best_speedup` index from the top (the column is kept by
`Population.finish_stage`); details (times, spread, sectors, confirmation marks) are
then fetched for the few rows shown.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePath

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.db.models import CandidateModel, EvaluationModel, PromotionModel
from evolve.db.records import LeaderboardRow

RANKED_STAGE = "bench"
PROFILE_STAGE = "ncu"


def leaderboard_rows(session: Session, *, workload_id: int | None = None, limit: int | None = 20) -> list[LeaderboardRow]:
    # Plain Core queries on the session's connection: this runs on every `evolve
    # leaderboard` and in the search loop, and ORM objects would cost more than the SQL.
    conn = session.connection()
    C = CandidateModel
    # candidates.best_speedup is kept by finish_stage, so ranking reads the top of an index.
    ranked = (
        select(C.id, C.workload_id, C.name, C.directory, C.origin, C.family, C.author, C.generation,
               C.best_speedup.label("speedup"))
        .where(C.best_speedup.is_not(None))
        .order_by(C.best_speedup.desc(), C.id)
    )
    if workload_id is not None:
        ranked = ranked.where(C.workload_id == workload_id)
    if limit is not None and limit > 0:
        ranked = ranked.limit(limit)
    top = conn.execute(ranked).all()
    if not top:
        return []
    ids = [row.id for row in top]

    # The evaluation that holds each candidate's best speedup (lowest id on ties).
    E = EvaluationModel
    bench: dict[int, tuple[int | None, float | None, float | None, float | None, int | None]] = {}
    for ev in conn.execute(
        select(E.candidate_id, E.id, E.ms, E.baseline_ms, E.spread, E.excessive_sectors)
        .where(E.candidate_id.in_(ids), E.stage == RANKED_STAGE, E.status == "passed", E.speedup.is_not(None))
        .order_by(E.speedup.desc(), E.id)
    ):
        bench.setdefault(ev.candidate_id, (ev.id, ev.ms, ev.baseline_ms, ev.spread, ev.excessive_sectors))

    # Excessive sectors: from the bench row if it has them, else the latest passed profile.
    sectors: dict[int, int] = {
        cid: value
        for cid, value in conn.execute(
            select(E.candidate_id, E.excessive_sectors)
            .where(E.candidate_id.in_(ids), E.stage == PROFILE_STAGE, E.status == "passed",
                   E.excessive_sectors.is_not(None))
            .order_by(E.id)
        )
    }

    promoted = set(conn.execute(select(PromotionModel.candidate_id).where(PromotionModel.candidate_id.in_(ids))).scalars())
    latest_per_workload = select(func.max(PromotionModel.id)).group_by(PromotionModel.workload_id).scalar_subquery()
    current_best = set(
        conn.execute(select(PromotionModel.candidate_id).where(PromotionModel.id.in_(latest_per_workload))).scalars()
    )

    rows: list[LeaderboardRow] = []
    for rank, cand in enumerate(top, start=1):
        # (None...) only if best_speedup was edited by hand; recompute_best_speedups repairs it.
        eid, ms, baseline_ms, spread, bench_sectors = bench.get(cand.id, (None, None, None, None, None))
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
                excessive_sectors=bench_sectors if bench_sectors is not None else sectors.get(cand.id),
                confirmed=cand.id in promoted,
                best=cand.id in current_best,
            )
        )
    return rows


def _fmt(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _short_dir(directory: str | None) -> str:
    # Generated candidates live in gen/<digest>/: a short digest names them well enough.
    return PurePath(directory).name[:12] if directory else "-"


def format_table(rows: Sequence[LeaderboardRow]) -> str:
    """A plain-text table: rank, id, name, ms, baseline ms, speedup, confirmed, sectors, origin."""
    header = ["rank", "id", "name", "ms", "baseline ms", "speedup", "confirmed", "excess sectors", "origin"]
    body = [
        [
            str(r.rank),
            str(r.candidate_id),
            r.name or _short_dir(r.directory),
            _fmt(r.ms, ".4f"),
            _fmt(r.baseline_ms, ".4f"),
            f"{r.speedup:.3f}x",
            ("✓ best" if r.best else "✓") if r.confirmed else "",
            _fmt(r.excessive_sectors, ",d"),
            r.source,
        ]
        for r in rows
    ]
    widths = [max(len(h), *(len(line[i]) for line in body)) if body else len(h) for i, h in enumerate(header)]
    numeric = {0, 1, 3, 4, 5, 7}

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(b) for b in body)])


def to_json(rows: Sequence[LeaderboardRow]) -> str:
    return json.dumps([r.model_dump(mode="json") for r in rows], indent=2)
