"""Typed ORM models of evolve's database (SQLAlchemy 2.0 declarative, Mapped[] columns).

The schema is created and changed only by the Alembic migrations in `evolve/db/migrations/`;
these classes describe it for queries. Timestamps are stored as naive UTC and read back
as timezone-aware UTC (see `UTCDateTime`).
"""
from __future__ import annotations

from datetime import UTC, datetime
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    JSON,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from evolve.vocabulary import LIVE, REPEATABLE_STAGES, EvaluationStatus, Origin, RunState


# Constraint names are fixed so batch-mode migrations on SQLite can find them again.
NAMING = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Naive UTC in the database, aware UTC in Python (SQLite keeps no zone)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given; evolve stores UTC-aware datetimes only")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = NAMING


def _in(column: str, values: Iterable[str]) -> str:
    # str(): an enum member's repr is not its SQL literal.
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


class WorkloadModel(Base):
    __tablename__ = "workloads"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunModel(Base):
    __tablename__ = "runs"
    __table_args__ = (CheckConstraint(_in("state", RunState), name="state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    strategy: Mapped[str] = mapped_column(String(100))
    state: Mapped[str] = mapped_column(String(16), default=RunState.RUNNING)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class RunWorkerModel(Base):
    """One process working on a run (`evolve run`, or `evolve run --join` on any host).
    Its heartbeat is the lease on the evaluations it holds; `ended_at` is set when it leaves."""

    __tablename__ = "run_workers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class CandidateParentModel(Base):
    """Ordered parent list of a candidate (crossover has two, mutation one, seeds none)."""

    __tablename__ = "candidate_parents"

    child_id: Mapped[int] = mapped_column(ForeignKey("candidates.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"), index=True)


class CandidateModel(Base):
    __tablename__ = "candidates"
    __table_args__ = (
        UniqueConstraint("workload_id", "digest"),
        CheckConstraint(_in("origin", Origin), name="origin"),
        # The leaderboard walks these from the top: O(limit), however many evaluations.
        Index("ix_candidates_workload_best", "workload_id", "best_speedup"),
        Index("ix_candidates_best", "best_speedup"),
        # Candidates waiting for a run, for `claim_next`: a scan of the few waiting rows
        # instead of an anti-join over every evaluation.
        Index("ix_candidates_waiting", "workload_id", "id",
              sqlite_where=text("claimed_at IS NULL"), postgresql_where=text("claimed_at IS NULL")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    name: Mapped[str | None] = mapped_column(String(200))
    origin: Mapped[str] = mapped_column(String(16))
    family: Mapped[str | None] = mapped_column(String(200))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    digest: Mapped[str] = mapped_column(String(128))
    directory: Mapped[str] = mapped_column(Text, index=True)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    operator: Mapped[str | None] = mapped_column(String(50))
    author: Mapped[str | None] = mapped_column(String(200))
    notes: Mapped[str | None] = mapped_column(Text)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Best passed "bench" speedup, kept by Population.finish_stage in the same
    # transaction (derived from evaluations; `Population.recompute_best_speedups` rebuilds it).
    best_speedup: Mapped[float | None] = mapped_column(Float)
    # When its first evaluation was claimed; None while it waits for a run (an agent's
    # registration). Set in the claiming transaction (Population.claim_next, begin_stage).
    claimed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    parent_links: Mapped[list[CandidateParentModel]] = relationship(
        foreign_keys=[CandidateParentModel.child_id],
        order_by=CandidateParentModel.position,
        cascade="all, delete-orphan",
    )


class EvaluationModel(Base):
    __tablename__ = "evaluations"
    __table_args__ = (
        CheckConstraint(_in("status", EvaluationStatus), name="status"),
        # Attempts of one stage are numbered 1, 2, ...; two writers can't take one number.
        UniqueConstraint("candidate_id", "stage", "attempt"),
        # At most one live-or-passed claim per (candidate, stage): this makes begin_stage
        # race-free across processes. Repeatable stages (confirm) are left out.
        Index(
            "uq_evaluations_claim",
            "candidate_id",
            "stage",
            unique=True,
            sqlite_where=text(
                f"{_in('status', LIVE)} AND {_in('stage', REPEATABLE_STAGES).replace(' IN', ' NOT IN')}"
            ),
            postgresql_where=text(
                f"{_in('status', LIVE)} AND {_in('stage', REPEATABLE_STAGES).replace(' IN', ' NOT IN')}"
            ),
        ),
        # Leaderboard: best passed bench per candidate, answered from the index alone.
        Index("ix_evaluations_leaderboard", "stage", "status", "candidate_id", "speedup"),
        Index("ix_evaluations_status_run", "status", "run_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"))
    stage: Mapped[str] = mapped_column(String(32))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    retry_of: Mapped[int | None] = mapped_column(ForeignKey("evaluations.id"))
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    # The process holding it while it runs (its heartbeat is the lease); None before 0004.
    worker_id: Mapped[int | None] = mapped_column(ForeignKey("run_workers.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default=EvaluationStatus.RUNNING)
    failure_kind: Mapped[str | None] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    server_instance: Mapped[str | None] = mapped_column(String(255))
    gpu: Mapped[str | None] = mapped_column(String(100))
    queue_ms: Mapped[float | None] = mapped_column(Float)
    lease_held_ms: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    ms: Mapped[float | None] = mapped_column(Float)
    baseline_ms: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    spread: Mapped[float | None] = mapped_column(Float)
    excessive_sectors: Mapped[int | None] = mapped_column(Integer)
    registers: Mapped[int | None] = mapped_column(Integer)
    spills: Mapped[int | None] = mapped_column(Integer)


class EvaluationLogModel(Base):
    """One evaluation's output: stdout, stderr and traceback, each bounded and
    zlib-compressed (`evolve.db.logs`); kept apart so listing evaluations never loads them."""

    __tablename__ = "evaluation_logs"

    evaluation_id: Mapped[int] = mapped_column(
        ForeignKey("evaluations.id", ondelete="CASCADE"), primary_key=True)
    stdout: Mapped[bytes | None] = mapped_column(LargeBinary)
    stderr: Mapped[bytes | None] = mapped_column(LargeBinary)
    traceback: Mapped[bytes | None] = mapped_column(LargeBinary)


class PromotionConfirmationModel(Base):
    """The confirmation evaluations a promotion rests on, in order."""

    __tablename__ = "promotion_confirmations"

    promotion_id: Mapped[int] = mapped_column(ForeignKey("promotions.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id"))


class PromotionModel(Base):
    __tablename__ = "promotions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    candidate_id: Mapped[int] = mapped_column(ForeignKey("candidates.id"), index=True)
    previous_best_id: Mapped[int | None] = mapped_column(ForeignKey("candidates.id"))
    margin: Mapped[float | None] = mapped_column(Float)
    speedup_over_best: Mapped[float | None] = mapped_column(Float)
    promoted_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    confirmation_links: Mapped[list[PromotionConfirmationModel]] = relationship(
        order_by=PromotionConfirmationModel.position,
        cascade="all, delete-orphan",
        lazy="selectin",
    )
