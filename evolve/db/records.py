"""The typed values that cross the population seam (pydantic, immutable snapshots).

Reads return these rather than ORM objects, so callers never hold a session or see a
lazy load fail after it closed.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.vocabulary import EvaluationStatus, FailureKind, Origin, RunState, Stage

# A finished stage attempt's status: a verdict.
FinishedStatus = Literal[EvaluationStatus.PASSED, EvaluationStatus.FAILED]


class _Snapshot(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True)


class Workload(_Snapshot):
    id: int
    name: str
    path: str
    created_at: datetime


class Run(_Snapshot):
    id: int
    workload_id: int
    config: dict[str, Any]
    strategy: str
    state: RunState
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None


class RunWorker(_Snapshot):
    """One process working on a run; its heartbeat is its lease on what it holds."""
    id: int
    run_id: int
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    ended_at: datetime | None


class NewCandidate(BaseModel):
    """What the search (or `evolve register`) knows about a candidate before it is stored."""

    model_config = ConfigDict(extra="forbid")

    workload_id: int
    origin: Origin
    digest: str = Field(min_length=1, max_length=128)
    directory: str = Field(min_length=1)
    family: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    parents: list[int] = Field(default_factory=list)
    generation: int = Field(default=0, ge=0)
    operator: str | None = None
    name: str | None = None
    author: str | None = None
    notes: str | None = None
    run_id: int | None = None

    @model_validator(mode="after")
    def _distinct_parents(self) -> NewCandidate:
        if len(set(self.parents)) != len(self.parents):
            raise ValueError(f"parents repeat an id: {self.parents}")
        return self


class Candidate(_Snapshot):
    id: int
    workload_id: int
    name: str | None
    origin: Origin
    family: str | None
    params: dict[str, Any]
    digest: str
    directory: str
    parents: list[int]
    generation: int
    operator: str | None
    author: str | None
    notes: str | None
    run_id: int | None
    created_at: datetime
    best_speedup: float | None = None  # best passed bench speedup so far

    @property
    def label(self) -> str:
        """Short human name: the given name, else family, else author, else the id."""
        return self.name or self.family or self.author or f"#{self.id}"


class StageLogs(BaseModel):
    """A stage attempt's full output (stored bounded and compressed, see evolve.db.logs)."""

    model_config = ConfigDict(extra="forbid")

    stdout: str = ""
    stderr: str = ""
    traceback: str = ""   # the exception evolve caught, or the candidate's last one

    def empty(self) -> bool:
        return not (self.stdout or self.stderr or self.traceback)


class StageResult(BaseModel):
    """The outcome of one stage attempt, written by `Population.finish_stage`."""

    model_config = ConfigDict(extra="forbid")

    status: FinishedStatus
    failure_kind: FailureKind | None = None
    message: str = ""
    metrics: dict[str, Any] = Field(default_factory=dict)
    server_instance: str | None = None
    gpu: str | None = None
    queue_ms: float | None = None
    lease_held_ms: float | None = None
    ms: float | None = None
    baseline_ms: float | None = None
    speedup: float | None = None
    spread: float | None = None
    excessive_sectors: int | None = None
    registers: int | None = None
    spills: int | None = None
    logs: StageLogs | None = None

    @model_validator(mode="after")
    def _kind_matches_status(self) -> StageResult:
        if self.status == EvaluationStatus.FAILED and self.failure_kind is None:
            raise ValueError("a failed stage needs a failure_kind")
        if self.status == EvaluationStatus.PASSED and self.failure_kind is not None:
            raise ValueError(f"a passed stage can't have failure_kind {str(self.failure_kind)!r}")
        return self


class Evaluation(_Snapshot):
    id: int
    candidate_id: int
    stage: Stage
    attempt: int
    retry_of: int | None
    run_id: int | None
    worker_id: int | None = None
    status: EvaluationStatus
    failure_kind: FailureKind | None
    message: str
    server_instance: str | None
    gpu: str | None
    queue_ms: float | None
    lease_held_ms: float | None
    started_at: datetime
    ended_at: datetime | None
    metrics: dict[str, Any]
    ms: float | None
    baseline_ms: float | None
    speedup: float | None
    spread: float | None
    excessive_sectors: int | None
    registers: int | None
    spills: int | None

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()


class Promotion(_Snapshot):
    id: int
    workload_id: int
    candidate_id: int
    previous_best_id: int | None
    confirmation_eval_ids: list[int]
    margin: float | None
    speedup_over_best: float | None
    promoted_at: datetime


class LeaderboardRow(_Snapshot):
    rank: int
    candidate_id: int
    workload_id: int
    name: str | None
    directory: str
    origin: Origin
    family: str | None
    author: str | None
    generation: int
    evaluation_id: int | None  # the bench evaluation that holds `speedup`
    ms: float | None
    baseline_ms: float | None
    speedup: float
    spread: float | None  # the widest spread its passed bench and confirmation runs measured
    excessive_sectors: int | None
    noisy: bool = False  # that spread is at least its gain over the baseline
    confirmed: bool  # promoted at some point
    best: bool  # the current confirmed best of its workload
    device: str | None = None  # the card that bench ran on (None: not recorded, before 2026-12-05)

    @property
    def source(self) -> str:
        """Where it came from, for tables: the family, else the author, else the origin."""
        return self.family or self.author or self.origin


class StatusCount(_Snapshot):
    stage: Stage
    status: EvaluationStatus
    failure_kind: FailureKind | None
    count: int


class RunThroughput(_Snapshot):
    """What one run got through: finished stages, candidates that reached a bench verdict,
    and the GPU lease its stages held, over the run's wall time so far."""
    run_id: int
    wall_s: float
    stages: int
    benched: int
    lease_held_s: float

    @property
    def benched_per_hour(self) -> float:
        return self.benched * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def stages_per_hour(self) -> float:
        return self.stages * 3600.0 / self.wall_s if self.wall_s > 0 else 0.0


class EvaluationSummary(NamedTuple):
    """The columns of an evaluation that progress plots and timing tables need, without
    metrics and messages: a tuple, so reading 100k of them stays cheap."""

    id: int
    candidate_id: int
    stage: str
    status: str
    failure_kind: str | None
    started_at: datetime
    ended_at: datetime | None
    queue_ms: float | None
    lease_held_ms: float | None
    speedup: float | None

    @property
    def duration_s(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.started_at).total_seconds()
