"""Immutable snapshots (evolve.db.records) built from database rows.

Lists are read with plain Core queries and validated from dicts: the search and the
report read tens of thousands of rows, where ORM objects would cost more than the SQL.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from evolve.db.models import CandidateModel, CandidateParentModel, EvaluationModel, PromotionModel
from evolve.db.records import Candidate, Evaluation, Promotion


def candidate_snapshot(row: CandidateModel) -> Candidate:
    """Snapshot of an ORM row (single-row paths: inserts and lookups)."""
    return Candidate(
        id=row.id,
        workload_id=row.workload_id,
        name=row.name,
        origin=row.origin,
        family=row.family,
        params=dict(row.params or {}),
        digest=row.digest,
        directory=row.directory,
        parents=[link.parent_id for link in row.parent_links],
        generation=row.generation,
        operator=row.operator,
        author=row.author,
        notes=row.notes,
        run_id=row.run_id,
        created_at=row.created_at,
        best_speedup=row.best_speedup,
    )


CANDIDATE_COLUMNS = tuple(CandidateModel.__table__.c)
IN_CHUNK = 5000  # stay well under SQLite's limit on bound parameters


def load_candidates(s: Session, query: Select[Any]) -> list[Candidate]:
    """Candidates selected by `query` (over CANDIDATE_COLUMNS), in its order."""
    return with_parents(s, plain_rows(s, query))


def with_parents(s: Session, rows: list[dict[str, Any]]) -> list[Candidate]:
    """Candidate snapshots from column mappings, parents fetched in bulk. Bypasses ORM
    objects, since lists can hold tens of thousands of candidates."""
    parents: dict[int, list[int]] = {}
    ids = [r["id"] for r in rows]
    for start in range(0, len(ids), IN_CHUNK):
        links = s.execute(
            select(CandidateParentModel.child_id, CandidateParentModel.parent_id)
            .where(CandidateParentModel.child_id.in_(ids[start : start + IN_CHUNK]))
            .order_by(CandidateParentModel.child_id, CandidateParentModel.position)
        )
        for child, parent in links:
            parents.setdefault(child, []).append(parent)
    for r in rows:
        r["parents"] = parents.get(r["id"], [])
    return [Candidate.model_validate(r) for r in rows]


EVALUATION_COLUMNS = tuple(EvaluationModel.__table__.c)


def plain_rows(s: Session, query: Select[Any]) -> list[dict[str, Any]]:
    """Plain dicts from a Core query, skipping ORM and row-mapping overhead (reports and
    searches read tens of thousands of rows)."""
    result = s.connection().execute(query)
    keys = list(result.keys())
    return [dict(zip(keys, row)) for row in result]


def load_evaluations(s: Session, query: Select[Any]) -> list[Evaluation]:
    return [Evaluation.model_validate(r) for r in plain_rows(s, query)]


def select_candidates() -> Select[Any]:
    return select(*CANDIDATE_COLUMNS)


def promotion_snapshot(row: PromotionModel) -> Promotion:
    return Promotion(
        id=row.id,
        workload_id=row.workload_id,
        candidate_id=row.candidate_id,
        previous_best_id=row.previous_best_id,
        confirmation_eval_ids=[link.evaluation_id for link in row.confirmation_links],
        margin=row.margin,
        speedup_over_best=row.speedup_over_best,
        promoted_at=row.promoted_at,
    )
