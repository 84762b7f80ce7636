"""The population: everything the search knows, and the only way it reaches the database.

Each method is one short transaction. On SQLite, writes take the write lock when they
begin (see `evolve.db.engine`), so concurrent processes queue; on PostgreSQL writers run
side by side and the few steps that must not interleave lock the row they are about:
a claim locks its candidate, a promotion its workload, joining and leaving a run the
run. State changes are compare-and-set UPDATEs on the current status, so two processes
never both finish, interrupt or claim the same evaluation: `begin_stage` is backed by a
partial unique index (one running-or-passed row per candidate and stage, except
repeatable stages such as "confirm"), `finish_stage` and `mark_interrupted` only move
rows that are "running". `claim_next` hands each process a different waiting candidate
(`FOR NO KEY UPDATE SKIP LOCKED` on PostgreSQL), the unique index still being the judge.

Several processes may work on one run (`join_run`): each is a worker whose heartbeat is
its lease on the evaluations it holds; a worker that stops beating loses them
(`interrupted`), and the run ends when its last worker leaves (`leave_run`).
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from evolve.db import Database, open_database
from evolve.db.logs import pack, unpack
from evolve.db.storable import bounded_metrics, storable
from evolve.db.models import (
    CandidateModel,
    CandidateParentModel,
    EvaluationLogModel,
    EvaluationModel,
    PromotionConfirmationModel,
    PromotionModel,
    RunModel,
    RunWorkerModel,
    WorkloadModel,
    utcnow,
)
from evolve.db.snapshots import (
    EVALUATION_COLUMNS,
    candidate_snapshot,
    load_candidates,
    load_evaluations,
    plain_rows,
    promotion_snapshot,
    select_candidates,
    with_parents,
)
from evolve.db.records import (
    Candidate,
    Evaluation,
    EvaluationSummary,
    LeaderboardRow,
    NewCandidate,
    Promotion,
    Run,
    RunThroughput,
    RunWorker,
    StageLogs,
    StageResult,
    StatusCount,
    Workload,
)
from evolve.leaderboard import leaderboard_rows
from evolve.vocabulary import LIVE, REPEATABLE_STAGES, VERDICTS, EvaluationStatus, FailureKind, RunState, Stage

__all__ = [
    "Candidate",
    "Evaluation",
    "EvaluationSummary",
    "LeaderboardRow",
    "NewCandidate",
    "Population",
    "Promotion",
    "Run",
    "RunWorker",
    "StageLogs",
    "StageResult",
    "StatusCount",
    "Workload",
]

DEFAULT_HEARTBEAT_TIMEOUT_S = 300.0
_CLAIM_RETRIES = 8
_CLAIM_SCAN = 64      # waiting candidates `claim_next` looks at before it gives up for now


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


class Population:
    """Typed access to workloads, runs, candidates, evaluations and promotions.

    `heartbeat_timeout_s`: a running run whose last heartbeat is older than this is
    considered dead (its "running" evaluations are then reported by `interrupted`).
    """

    def __init__(
        self,
        db: Database,
        *,
        heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
        host: str | None = None,
    ) -> None:
        self.db = db
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.host = host or socket.gethostname()

    @classmethod
    def open(cls, url: str | None = None, **kwargs: Any) -> Population:
        """Population over `open_database(url)` (default: $EVOLVE_DB or sqlite:///evolve.db)."""
        return cls(open_database(url), **kwargs)

    def close(self) -> None:
        """Release the database's connections (the Population is unusable afterwards)."""
        self.db.close()

    def checkpoint(self) -> None:
        """Everything written so far in the database file itself (SQLite; see Database)."""
        self.db.checkpoint()

    # ---------------------------------------------------------------- workloads
    def ensure_workload(self, name: str, path: str) -> int:
        """The id of workload `name`, created with `path` if it is new (path is kept if not)."""
        if not name:
            raise ValueError("workload name is empty")
        for _ in range(2):
            try:
                with self.db.write() as s:
                    wid = s.scalar(select(WorkloadModel.id).where(WorkloadModel.name == name))
                    if wid is not None:
                        return wid
                    row = WorkloadModel(name=name, path=path)
                    s.add(row)
                    s.flush()
                    return row.id
            except IntegrityError:  # created by another process between our read and insert
                continue
        raise RuntimeError(f"could not create or find workload {name!r}")

    def workload(self, key: int | str) -> Workload | None:
        """A workload by id or by name."""
        column = WorkloadModel.id if isinstance(key, int) else WorkloadModel.name
        with self.db.read() as s:
            row = s.scalar(select(WorkloadModel).where(column == key))
            return None if row is None else Workload.model_validate(row)

    def workloads(self) -> list[Workload]:
        with self.db.read() as s:
            return [Workload.model_validate(r) for r in s.scalars(select(WorkloadModel).order_by(WorkloadModel.id))]

    def workload_id(self, key: int | str | None) -> int | None:
        """Resolve a workload given by id or name (None stays None); unknown names raise KeyError."""
        if key is None:
            return None
        if isinstance(key, str) and key.isdigit():
            key = int(key)
        found = self.workload(key)
        if found is None:
            raise KeyError(f"no workload {key!r} in the database")
        return found.id

    # --------------------------------------------------------------------- runs
    def start_run(
        self,
        workload_id: int,
        config: dict[str, Any],
        strategy: str,
        *,
        pid: int | None = None,
        host: str | None = None,
    ) -> int:
        with self.db.write() as s:
            if s.get(WorkloadModel, workload_id) is None:
                raise KeyError(f"no workload with id {workload_id}")
            now = utcnow()
            row = RunModel(
                workload_id=workload_id,
                config=config,
                strategy=strategy,
                state=RunState.RUNNING,
                host=host or self.host,
                pid=os.getpid() if pid is None else pid,
                started_at=now,
                heartbeat_at=now,
            )
            s.add(row)
            s.flush()
            return row.id

    def heartbeat_run(self, run_id: int) -> bool:
        """Refresh a running run's heartbeat; False if the run is not running any more."""
        with self.db.write() as s:
            result = s.execute(
                update(RunModel)
                .where(RunModel.id == run_id, RunModel.state == RunState.RUNNING)
                .values(heartbeat_at=utcnow())
            )
            return result.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE gives a CursorResult

    def finish_run(self, run_id: int, state: RunState, *, dead: bool = False) -> bool:
        """running -> `state` (compare-and-set); False if the run was not running.

        `dead`: the run's process is gone (found on resume): it ended at its last
        heartbeat, not now, so its wall time does not include the time it lay dead."""
        if state == RunState.RUNNING:
            raise ValueError("finish_run needs a final state: finished, failed or interrupted")
        with self.db.write() as s:
            now = utcnow()
            values: dict[str, Any] = (
                {"state": state, "ended_at": RunModel.heartbeat_at} if dead
                else {"state": state, "ended_at": now, "heartbeat_at": now}
            )
            result = s.execute(
                update(RunModel)
                .where(RunModel.id == run_id, RunModel.state == RunState.RUNNING)
                .values(**values)
            )
            return result.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE gives a CursorResult

    def run(self, run_id: int) -> Run | None:
        with self.db.read() as s:
            row = s.get(RunModel, run_id)
            return None if row is None else Run.model_validate(row)

    def runs(self, workload_id: int | None = None) -> list[Run]:
        query = select(RunModel).order_by(RunModel.id)
        if workload_id is not None:
            query = query.where(RunModel.workload_id == workload_id)
        with self.db.read() as s:
            return [Run.model_validate(r) for r in s.scalars(query)]

    def run_alive(self, run: Run, *, heartbeat_timeout_s: float | None = None) -> bool:
        """Running, with a fresh heartbeat, and one of its workers alive (a run without
        worker rows, from before they existed: its own process still exists on this host)."""
        if run.state != RunState.RUNNING:
            return False
        timeout = self.heartbeat_timeout_s if heartbeat_timeout_s is None else heartbeat_timeout_s
        if utcnow() - run.heartbeat_at > timedelta(seconds=timeout):
            return False
        workers = self.workers(run.id)
        if workers:
            return any(self.worker_alive(w, heartbeat_timeout_s=timeout) for w in workers)
        if run.host == self.host and not pid_exists(run.pid):
            return False
        return True

    # ------------------------------------------------------------------ workers
    def join_run(self, run_id: int, *, host: str | None = None, pid: int | None = None) -> int:
        """Add a worker (this process, by default) to running run `run_id`; its id.
        KeyError for no such run, ValueError for a run that is not running."""
        with self.db.write() as s:
            # Locked against a last worker leaving (and so ending the run) meanwhile.
            run = s.scalar(select(RunModel).where(RunModel.id == run_id).with_for_update(key_share=True))
            if run is None:
                raise KeyError(f"no run with id {run_id}")
            if run.state != RunState.RUNNING:
                raise ValueError(f"run {run_id} is {run.state}, not running")
            now = utcnow()
            row = RunWorkerModel(run_id=run_id, host=host or self.host, pid=os.getpid() if pid is None else pid,
                                 started_at=now, heartbeat_at=now)
            s.add(row)
            run.heartbeat_at = now
            s.flush()
            return row.id

    def heartbeat_worker(self, worker_id: int) -> bool:
        """Renew a worker's lease (and its run's heartbeat); False if the worker has left."""
        with self.db.write() as s:
            now = utcnow()
            # The run first, then the worker: the order join_run and leave_run lock them in.
            run_id = (select(RunWorkerModel.run_id)
                      .where(RunWorkerModel.id == worker_id, RunWorkerModel.ended_at.is_(None))
                      .scalar_subquery())
            s.execute(update(RunModel).where(RunModel.id == run_id, RunModel.state == RunState.RUNNING)
                      .values(heartbeat_at=now))
            result = s.execute(update(RunWorkerModel)
                               .where(RunWorkerModel.id == worker_id, RunWorkerModel.ended_at.is_(None))
                               .values(heartbeat_at=now))
            return result.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE gives a CursorResult

    def leave_run(self, worker_id: int, state: RunState, *, still_working: bool = False) -> bool:
        """The worker leaves its run; when no other worker of the run is alive, the run
        ends in `state`. True if this call ended the run.

        `still_working`: the run may end, but the worker keeps its lease (its stages in
        flight are finishing; call again without it when they have)."""
        if state == RunState.RUNNING:
            raise ValueError("leave_run needs a final state: finished, failed or interrupted")
        with self.db.write() as s:
            worker = s.get(RunWorkerModel, worker_id)
            if worker is None:
                raise KeyError(f"no run worker with id {worker_id}")
            run = s.scalar(select(RunModel).where(RunModel.id == worker.run_id).with_for_update(key_share=True))
            assert run is not None
            now = utcnow()
            if not still_working:
                worker.heartbeat_at = now
                worker.ended_at = worker.ended_at or now
            others = s.scalars(select(RunWorkerModel).where(
                RunWorkerModel.run_id == run.id, RunWorkerModel.id != worker_id, RunWorkerModel.ended_at.is_(None)))
            if run.state != RunState.RUNNING or any(self.worker_alive(RunWorker.model_validate(w)) for w in others):
                return False
            run.state, run.ended_at, run.heartbeat_at = state, now, now
            return True

    def workers(self, run_id: int) -> list[RunWorker]:
        with self.db.read() as s:
            return [RunWorker.model_validate(w) for w in
                    s.scalars(select(RunWorkerModel).where(RunWorkerModel.run_id == run_id).order_by(RunWorkerModel.id))]

    def worker_alive(self, worker: RunWorker, *, heartbeat_timeout_s: float | None = None) -> bool:
        """Not left, its lease (heartbeat) fresh, and (on this host) its process still exists."""
        if worker.ended_at is not None:
            return False
        timeout = self.heartbeat_timeout_s if heartbeat_timeout_s is None else heartbeat_timeout_s
        if utcnow() - worker.heartbeat_at > timedelta(seconds=timeout):
            return False
        return not (worker.host == self.host and not pid_exists(worker.pid))

    # --------------------------------------------------------------- candidates
    def add_candidate(self, new: NewCandidate) -> tuple[Candidate, bool]:
        """Store a candidate; an identical source (same workload and digest) returns the
        existing row and created=False."""
        try:
            with self.db.write() as s:
                existing = self._by_digest(s, new.workload_id, new.digest)
                if existing is not None:
                    return candidate_snapshot(existing), False
                return candidate_snapshot(self._insert_candidate(s, new)), True
        except IntegrityError:
            # Lost a race on (workload_id, digest) where the backend doesn't serialise writers.
            with self.db.read() as s:
                existing = self._by_digest(s, new.workload_id, new.digest)
                if existing is None:
                    raise
                return candidate_snapshot(existing), False

    def add_and_claim(self, new: NewCandidate, stage: Stage, *, worker_id: int | None = None
                      ) -> tuple[Candidate, bool, int | None]:
        """A proposal stored and claimed in one transaction, so no other process can take it
        for a waiting registration in between: (candidate, created, its first `stage`'s
        evaluation id, or None if the candidate existed and was evaluated or taken)."""
        try:
            with self.db.write() as s:
                existing = self._by_digest(s, new.workload_id, new.digest)
                if existing is None:
                    row = self._insert_candidate(s, new)
                    return candidate_snapshot(row), True, self._start_first(s, row.id, stage, new.run_id, worker_id)
        except IntegrityError:
            pass    # the same source stored by another process meanwhile: claimed like any other
        with self.db.read() as s:
            found = self._by_digest(s, new.workload_id, new.digest)
            assert found is not None
            cand = candidate_snapshot(found)
        return cand, False, self.claim_new(cand.id, stage, run_id=new.run_id, worker_id=worker_id)

    def _insert_candidate(self, s: Session, new: NewCandidate) -> CandidateModel:
        self._check_candidate_refs(s, new)
        row = CandidateModel(
            workload_id=new.workload_id,
            name=new.name,
            origin=new.origin,
            family=new.family,
            params=new.params,
            digest=new.digest,
            directory=new.directory,
            generation=new.generation,
            operator=new.operator,
            author=new.author,
            notes=new.notes,
            run_id=new.run_id,
            created_at=utcnow(),
        )
        row.parent_links = [
            CandidateParentModel(position=i, parent_id=p) for i, p in enumerate(new.parents)
        ]
        s.add(row)
        s.flush()
        return row

    @staticmethod
    def _by_digest(s: Session, workload_id: int, digest: str) -> CandidateModel | None:
        return s.scalar(
            select(CandidateModel).where(CandidateModel.workload_id == workload_id, CandidateModel.digest == digest)
        )

    @staticmethod
    def _check_candidate_refs(s: Session, new: NewCandidate) -> None:
        if s.get(WorkloadModel, new.workload_id) is None:
            raise KeyError(f"no workload with id {new.workload_id}")
        if new.run_id is not None and s.get(RunModel, new.run_id) is None:
            raise KeyError(f"no run with id {new.run_id}")
        if new.parents:
            found = set(s.scalars(select(CandidateModel.id).where(CandidateModel.id.in_(new.parents))))
            missing = [p for p in new.parents if p not in found]
            if missing:
                raise KeyError(f"parent candidates not in the database: {missing}")

    def candidate(self, candidate_id: int) -> Candidate | None:
        with self.db.read() as s:
            row = s.get(CandidateModel, candidate_id)
            return None if row is None else candidate_snapshot(row)

    def candidate_by_directory(self, path: str) -> Candidate | None:
        """The candidate stored with exactly this directory string (newest if several)."""
        with self.db.read() as s:
            row = s.scalar(
                select(CandidateModel).where(CandidateModel.directory == path).order_by(CandidateModel.id.desc()).limit(1)
            )
            return None if row is None else candidate_snapshot(row)

    def candidate_by_digest(self, workload_id: int, digest: str) -> Candidate | None:
        with self.db.read() as s:
            row = self._by_digest(s, workload_id, digest)
            return None if row is None else candidate_snapshot(row)

    def candidates(self, workload_id: int | None = None) -> list[Candidate]:
        query = select_candidates().order_by(CandidateModel.id)
        if workload_id is not None:
            query = query.where(CandidateModel.workload_id == workload_id)
        with self.db.read() as s:
            return load_candidates(s, query)

    def children(self, candidate_id: int) -> list[Candidate]:
        query = (
            select_candidates()
            .join(CandidateParentModel, CandidateParentModel.child_id == CandidateModel.id)
            .where(CandidateParentModel.parent_id == candidate_id)
            .order_by(CandidateModel.id)
        )
        with self.db.read() as s:
            return load_candidates(s, query)

    def ancestors(self, candidate_id: int, max_depth: int = 50) -> list[tuple[int, Candidate]]:
        """Parents, their parents, ... as (depth, candidate), breadth first, each once."""
        out: list[tuple[int, Candidate]] = []
        seen = {candidate_id}
        frontier = [candidate_id]
        with self.db.read() as s:
            for depth in range(1, max_depth + 1):
                ids = list(
                    s.scalars(
                        select(CandidateParentModel.parent_id)
                        .where(CandidateParentModel.child_id.in_(frontier))
                        .order_by(CandidateParentModel.child_id, CandidateParentModel.position)
                    )
                )
                frontier = [i for i in dict.fromkeys(ids) if i not in seen]
                if not frontier:
                    break
                seen.update(frontier)
                found = {c.id: c for c in load_candidates(s, select_candidates().where(CandidateModel.id.in_(frontier)))}
                out.extend((depth, found[i]) for i in frontier)
        return out

    def unevaluated(self, workload_id: int) -> list[Candidate]:
        """Candidates with no evaluation at all (e.g. agent registrations waiting for a run)."""
        query = (
            select_candidates()
            .where(
                CandidateModel.workload_id == workload_id,
                ~exists().where(EvaluationModel.candidate_id == CandidateModel.id),
            )
            .order_by(CandidateModel.id)
        )
        with self.db.read() as s:
            return load_candidates(s, query)

    # -------------------------------------------------------------- evaluations
    def begin_stage(
        self,
        candidate_id: int,
        stage: Stage,
        run_id: int | None = None,
        retry_of: int | None = None,
        worker_id: int | None = None,
    ) -> int | None:
        """Claim (candidate, stage): a new "running" evaluation, or None if the candidate
        already has a running or passed evaluation of this stage (repeatable stages such as
        "confirm" are always granted a new attempt). `worker_id`: the process holding it."""
        if stage not in set(Stage):
            raise ValueError(f"bad stage name {str(stage)!r}; known: {', '.join(Stage)}")
        repeatable = stage in REPEATABLE_STAGES
        for _ in range(_CLAIM_RETRIES):
            try:
                with self.db.write() as s:
                    self._check_claim_refs(s, candidate_id, stage, run_id, retry_of)
                    same = and_(EvaluationModel.candidate_id == candidate_id, EvaluationModel.stage == stage)
                    if not repeatable:
                        taken = s.scalar(
                            select(EvaluationModel.id).where(same, EvaluationModel.status.in_(LIVE)).limit(1)
                        )
                        if taken is not None:
                            return None
                    last = s.scalar(select(func.max(EvaluationModel.attempt)).where(same)) or 0
                    row = EvaluationModel(
                        candidate_id=candidate_id,
                        stage=stage,
                        attempt=last + 1,
                        retry_of=retry_of,
                        run_id=run_id,
                        worker_id=worker_id,
                        status=EvaluationStatus.RUNNING,
                        message="",
                        metrics={},
                        started_at=utcnow(),
                    )
                    s.add(row)
                    s.flush()
                    if last == 0:
                        self._mark_claimed(s, candidate_id, row.started_at)
                    return row.id
            except IntegrityError:
                # Another process inserted first (claim index or attempt number); look again.
                continue
        raise RuntimeError(f"could not claim stage {str(stage)!r} of candidate {candidate_id} after {_CLAIM_RETRIES} tries")

    def claim_new(self, candidate_id: int, stage: Stage, *, run_id: int | None = None,
                  worker_id: int | None = None) -> int | None:
        """Claim a candidate that was never evaluated by starting its first `stage`: the
        new evaluation's id, or None if the candidate has any evaluation (another process
        took it first, or it was evaluated before)."""
        try:
            with self.db.write() as s:
                self._check_claim_refs(s, candidate_id, stage, run_id, None)
                return self._start_first(s, candidate_id, stage, run_id, worker_id)
        except IntegrityError:  # another process's claim won on the unique index
            return None

    def claim_next(self, workload_id: int, stage: Stage, *, run_id: int | None = None, worker_id: int | None = None,
                   skip: Sequence[int] = (),
                   usable: Callable[[Candidate], bool] | None = None) -> tuple[Candidate, int] | None:
        """Claim the oldest never-evaluated candidate of the workload (agent registrations
        waiting for a run) by starting its first `stage`: (candidate, evaluation id), or
        None when none is left. Processes calling this at once get different candidates:
        PostgreSQL skips rows another claim has locked; SQLite's write lock queues them.
        `usable`: candidates it refuses are left for others (e.g. a folder that exists
        only on another host)."""
        skipped = set(skip)
        for _ in range(_CLAIM_SCAN):
            try:
                with self.db.write() as s:
                    query = (
                        select(CandidateModel.id)
                        .where(CandidateModel.workload_id == workload_id, CandidateModel.claimed_at.is_(None))
                        .order_by(CandidateModel.id)
                        .limit(1)
                        .with_for_update(key_share=True, skip_locked=True)
                    )
                    if skipped:
                        query = query.where(CandidateModel.id.not_in(skipped))
                    cid = s.scalar(query)
                    if cid is None:
                        return None
                    row = s.get(CandidateModel, cid)
                    assert row is not None
                    found = candidate_snapshot(row)
                    if usable is None or usable(found):
                        eid = self._start_first(s, cid, stage, run_id, worker_id)
                        if eid is not None:
                            return found, eid
                    # Not for us, or claimed by a transaction that committed after our snapshot.
                    skipped.add(cid)
            except IntegrityError:
                continue
        return None

    @staticmethod
    def _start_first(s: Session, candidate_id: int, stage: Stage, run_id: int | None, worker_id: int | None) -> int | None:
        """In a transaction that holds the candidate's row lock: its first evaluation, or None
        if it has one already (this statement sees every claim committed before the lock)."""
        now = utcnow()
        if s.scalar(select(EvaluationModel.id).where(EvaluationModel.candidate_id == candidate_id).limit(1)) is not None:
            Population._mark_claimed(s, candidate_id, now)   # e.g. rows written before the column existed
            return None
        row = EvaluationModel(candidate_id=candidate_id, stage=stage, attempt=1, run_id=run_id, worker_id=worker_id,
                              status=EvaluationStatus.RUNNING, message="", metrics={}, started_at=now)
        s.add(row)
        s.flush()
        Population._mark_claimed(s, candidate_id, now)
        return row.id

    @staticmethod
    def _mark_claimed(s: Session, candidate_id: int, when: datetime) -> None:
        """The candidate no longer waits for a run (`claim_next` skips it from now on)."""
        s.execute(update(CandidateModel)
                  .where(CandidateModel.id == candidate_id, CandidateModel.claimed_at.is_(None))
                  .values(claimed_at=when))

    @staticmethod
    def _check_claim_refs(
        s: Session, candidate_id: int, stage: str, run_id: int | None, retry_of: int | None
    ) -> None:
        # The candidate's row lock orders claims on it (PostgreSQL; SQLite's write lock
        # already does), so rivals wait here instead of colliding on the unique indexes.
        locked = select(CandidateModel.id).where(CandidateModel.id == candidate_id).with_for_update(key_share=True)
        if s.scalar(locked) is None:
            raise KeyError(f"no candidate with id {candidate_id}")
        if run_id is not None and s.scalar(select(RunModel.id).where(RunModel.id == run_id)) is None:
            raise KeyError(f"no run with id {run_id}")
        if retry_of is not None:
            prior = s.get(EvaluationModel, retry_of)
            if prior is None:
                raise KeyError(f"retry_of: no evaluation with id {retry_of}")
            if prior.candidate_id != candidate_id or prior.stage != stage:
                raise ValueError(
                    f"retry_of={retry_of} is stage {str(prior.stage)!r} of candidate {prior.candidate_id}, "
                    f"not stage {str(stage)!r} of candidate {candidate_id}"
                )
            if prior.status == EvaluationStatus.RUNNING:
                raise ValueError(f"retry_of={retry_of} is still running; mark it interrupted first")

    def finish_stage(self, evaluation_id: int, result: StageResult) -> bool:
        """running -> passed/failed with the result (compare-and-set); False if the row was
        not running (finished or interrupted by someone else)."""
        values = storable(result.model_dump(exclude={"logs"}))
        values["metrics"] = bounded_metrics(values["metrics"])
        with self.db.write() as s:
            outcome = s.execute(
                update(EvaluationModel)
                .where(EvaluationModel.id == evaluation_id, EvaluationModel.status == EvaluationStatus.RUNNING)
                .values(**values, ended_at=utcnow())
            )
            if outcome.rowcount != 1:  # type: ignore[attr-defined]  # an UPDATE gives a CursorResult
                return False
            if result.logs is not None and not result.logs.empty():
                s.add(EvaluationLogModel(evaluation_id=evaluation_id, stdout=pack(result.logs.stdout),
                                         stderr=pack(result.logs.stderr), traceback=pack(result.logs.traceback)))
            if result.status == EvaluationStatus.PASSED and values["speedup"] is not None:
                self._raise_best_speedup(s, evaluation_id, values["speedup"])
            return True

    @staticmethod
    def _raise_best_speedup(s: Session, evaluation_id: int, speedup: float) -> None:
        """Keep candidates.best_speedup (the leaderboard's key) in step with a passed bench."""
        owner = (
            select(EvaluationModel.candidate_id)
            .where(EvaluationModel.id == evaluation_id, EvaluationModel.stage == Stage.BENCH)
            .scalar_subquery()
        )
        s.execute(
            update(CandidateModel)
            .where(
                CandidateModel.id == owner,
                (CandidateModel.best_speedup.is_(None)) | (CandidateModel.best_speedup < speedup),
            )
            .values(best_speedup=speedup)
        )

    def recompute_best_speedups(self) -> None:
        """Rebuild candidates.best_speedup from the evaluations (after bulk imports)."""
        best = (
            select(func.max(EvaluationModel.speedup))
            .where(
                EvaluationModel.candidate_id == CandidateModel.id,
                EvaluationModel.stage == Stage.BENCH,
                EvaluationModel.status == EvaluationStatus.PASSED,
            )
            .scalar_subquery()
        )
        with self.db.write() as s:
            s.execute(update(CandidateModel).values(best_speedup=best))

    def mark_interrupted(self, evaluation_id: int, message: str = "interrupted: its process died") -> bool:
        """running -> interrupted (compare-and-set); a retry then uses retry_of=evaluation_id."""
        with self.db.write() as s:
            outcome = s.execute(
                update(EvaluationModel)
                .where(EvaluationModel.id == evaluation_id, EvaluationModel.status == EvaluationStatus.RUNNING)
                .values(status=EvaluationStatus.INTERRUPTED, message=message, ended_at=utcnow())
            )
            return outcome.rowcount == 1  # type: ignore[attr-defined]  # an UPDATE gives a CursorResult

    def interrupted(self, run_id: int | None = None, *, heartbeat_timeout_s: float | None = None) -> list[Evaluation]:
        """Evaluations still "running" whose owner is dead: their run (finished, heartbeat
        too old, or no live process left), or, in a live run, the worker that holds them
        (left, lease expired, or its process gone from this host). `run_id=None` looks at
        every run; rows with no run count as dead once they are older than the heartbeat
        timeout."""
        timeout = self.heartbeat_timeout_s if heartbeat_timeout_s is None else heartbeat_timeout_s
        query = select(EvaluationModel).where(EvaluationModel.status == EvaluationStatus.RUNNING).order_by(EvaluationModel.id)
        if run_id is not None:
            query = query.where(EvaluationModel.run_id == run_id)
        with self.db.read() as s:
            rows = [Evaluation.model_validate(r) for r in s.scalars(query)]
            run_ids = {r.run_id for r in rows if r.run_id is not None}
            runs = {r.id: Run.model_validate(r) for r in s.scalars(select(RunModel).where(RunModel.id.in_(run_ids)))}
            worker_ids = {r.worker_id for r in rows if r.worker_id is not None}
            workers = {w.id: RunWorker.model_validate(w) for w in
                       s.scalars(select(RunWorkerModel).where(RunWorkerModel.id.in_(worker_ids)))}
        alive = {rid: self.run_alive(run, heartbeat_timeout_s=timeout) for rid, run in runs.items()}
        # A worker's lease covers what it holds: a dead worker's rows are dead in a live run.
        leased = {wid: self.worker_alive(w, heartbeat_timeout_s=timeout) for wid, w in workers.items()}
        cutoff = utcnow() - timedelta(seconds=timeout)

        def dead(r: Evaluation) -> bool:
            if r.run_id is None:
                return r.started_at < cutoff
            if not alive.get(r.run_id, False):
                return True
            return r.worker_id is not None and not leased.get(r.worker_id, False)

        return [r for r in rows if dead(r)]

    def evaluation(self, evaluation_id: int) -> Evaluation | None:
        with self.db.read() as s:
            row = s.get(EvaluationModel, evaluation_id)
            return None if row is None else Evaluation.model_validate(row)

    def evaluation_logs(self, evaluation_id: int) -> StageLogs | None:
        """The stored output of one evaluation; None when it left none."""
        with self.db.read() as s:
            row = s.get(EvaluationLogModel, evaluation_id)
            if row is None:
                return None
            return StageLogs(stdout=unpack(row.stdout), stderr=unpack(row.stderr), traceback=unpack(row.traceback))

    def evaluations(self, candidate_id: int, stage: Stage | None = None) -> list[Evaluation]:
        query = select(*EVALUATION_COLUMNS).where(EvaluationModel.candidate_id == candidate_id)
        if stage is not None:
            query = query.where(EvaluationModel.stage == stage)
        with self.db.read() as s:
            return load_evaluations(s, query.order_by(EvaluationModel.id))

    def evaluations_of(
        self,
        workload_id: int | None = None,
        *,
        stage: Stage | None = None,
        status: EvaluationStatus | None = None,
        run_id: int | None = None,
    ) -> list[Evaluation]:
        """Evaluations in id order, filtered by workload, stage, status and run."""
        query = select(*EVALUATION_COLUMNS).order_by(EvaluationModel.id)
        if workload_id is not None:
            query = query.join(CandidateModel, CandidateModel.id == EvaluationModel.candidate_id).where(
                CandidateModel.workload_id == workload_id
            )
        if stage is not None:
            query = query.where(EvaluationModel.stage == stage)
        if status is not None:
            query = query.where(EvaluationModel.status == status)
        if run_id is not None:
            query = query.where(EvaluationModel.run_id == run_id)
        with self.db.read() as s:
            return load_evaluations(s, query)

    def evaluation_summaries(self, workload_id: int | None = None) -> list[EvaluationSummary]:
        """Every evaluation (id order) without metrics and messages, for plots and tables."""
        E = EvaluationModel
        query = select(
            E.id, E.candidate_id, E.stage, E.status, E.failure_kind, E.started_at, E.ended_at,
            E.queue_ms, E.lease_held_ms, E.speedup,
        ).order_by(E.id)
        if workload_id is not None:
            query = query.join(CandidateModel, CandidateModel.id == E.candidate_id).where(
                CandidateModel.workload_id == workload_id
            )
        with self.db.read() as s:
            # _make: SQLAlchemy types a select of more than nine columns as of any length.
            return [EvaluationSummary._make(row) for row in s.connection().execute(query)]

    def run_throughputs(self, runs: Sequence[Run]) -> dict[int, RunThroughput]:
        """Per run: its finished stages (passed or failed), the candidates it brought to a bench
        verdict and the lease time they held, over its wall time (to its end, or to its last
        heartbeat while it runs or after it died). One query for all the runs."""
        E = EvaluationModel
        ids = [r.id for r in runs]
        counts: dict[int, tuple[int, int, float]] = {}
        if ids:
            query = (
                select(
                    E.run_id,
                    func.count(),
                    # a screened bench never ran (evolve/pipeline/screen.py): not a candidate benched
                    func.count(func.distinct(E.candidate_id)).filter(
                        E.stage == Stage.BENCH, E.failure_kind.is_distinct_from(FailureKind.SCREENED)),
                    func.sum(E.lease_held_ms),
                )
                .where(E.run_id.in_(ids), E.status.in_(VERDICTS))
                .group_by(E.run_id)
            )
            with self.db.read() as s:
                # The filter keeps run_id set; a sum over no lease times is NULL.
                counts = {rid: (n, b, ms or 0.0) for rid, n, b, ms in s.execute(query).all() if rid is not None}
        out = {}
        for run in runs:
            stages, benched, lease_ms = counts.get(run.id, (0, 0, 0.0))
            end = run.ended_at or run.heartbeat_at
            out[run.id] = RunThroughput(
                run_id=run.id, wall_s=max(0.0, (end - run.started_at).total_seconds()),
                stages=int(stages), benched=int(benched), lease_held_s=float(lease_ms) / 1000.0)
        return out

    def status_counts(self, workload_id: int | None = None) -> list[StatusCount]:
        """How many evaluations per (stage, status, failure kind)."""
        query = select(
            EvaluationModel.stage, EvaluationModel.status, EvaluationModel.failure_kind, func.count()
        ).group_by(EvaluationModel.stage, EvaluationModel.status, EvaluationModel.failure_kind)
        if workload_id is not None:
            query = query.join(CandidateModel, CandidateModel.id == EvaluationModel.candidate_id).where(
                CandidateModel.workload_id == workload_id
            )
        with self.db.read() as s:
            rows = s.execute(query).all()
        counts = [StatusCount(stage=Stage(a), status=EvaluationStatus(b), failure_kind=None if c is None else FailureKind(c),
                              count=n) for a, b, c, n in rows]
        return sorted(counts, key=lambda c: (c.stage, c.status, c.failure_kind or ""))

    def correct(self, workload_id: int) -> list[tuple[Candidate, float]]:
        """Candidates whose latest finished bench passed, with its speedup, fastest first."""
        latest = (
            select(EvaluationModel.candidate_id, func.max(EvaluationModel.id).label("eid"))
            .join(CandidateModel, CandidateModel.id == EvaluationModel.candidate_id)
            .where(
                CandidateModel.workload_id == workload_id,
                EvaluationModel.stage == Stage.BENCH,
                EvaluationModel.status.in_(VERDICTS),
            )
            .group_by(EvaluationModel.candidate_id)
            .subquery()
        )
        query = (
            select_candidates()
            .add_columns(EvaluationModel.speedup.label("bench_speedup"))
            .join(latest, latest.c.candidate_id == CandidateModel.id)
            .join(EvaluationModel, EvaluationModel.id == latest.c.eid)
            .where(EvaluationModel.status == EvaluationStatus.PASSED, EvaluationModel.speedup.is_not(None))
            .order_by(EvaluationModel.speedup.desc(), CandidateModel.id)
        )
        with self.db.read() as s:
            rows = plain_rows(s, query)
            speedups = [float(r.pop("bench_speedup")) for r in rows]
            return list(zip(with_parents(s, rows), speedups))

    def correct_points(self, workload_id: int) -> list[tuple[int, str | None, dict[str, Any], int, float]]:
        """What `correct` says, as bare (id, family, params, generation, speedup) rows, fastest
        first: the search reads this for every proposal, so no parents and no models."""
        C, E = CandidateModel, EvaluationModel
        latest = (
            select(E.candidate_id, func.max(E.id).label("eid"))
            .join(C, C.id == E.candidate_id)
            .where(C.workload_id == workload_id, E.stage == Stage.BENCH, E.status.in_(VERDICTS))
            .group_by(E.candidate_id)
            .subquery()
        )
        query = (
            select(C.id, C.family, C.params, C.generation, E.speedup)
            .join(latest, latest.c.candidate_id == C.id)
            .join(E, E.id == latest.c.eid)
            .where(E.status == EvaluationStatus.PASSED, E.speedup.is_not(None))
            .order_by(E.speedup.desc(), C.id)
        )
        with self.db.read() as s:
            return [(cid, family, dict(params or {}), generation or 0, float(speedup))
                    for cid, family, params, generation, speedup in s.execute(query)]

    def evaluation_rows(self, workload_id: int, after: int, ids: Sequence[int] = ()) -> list[tuple]:
        """(evaluation id, candidate id, family, params, generation, stage, status, speedup,
        failure kind) of the workload's evaluations with an id above `after` or in `ids`, in
        id order: what the search's view is brought up to date from (search_view.py)."""
        C, E = CandidateModel, EvaluationModel

        def rows(s: Session, cond: Any) -> Any:
            # `workload_id + 0` keeps SQLite off the workload's index: through it, finding the
            # few rows above `after` walked every candidate and its evaluations (about 10 ms
            # at 10 000 candidates, each proposal); by evaluation id it is a range.
            return s.connection().execute(
                select(E.id, C.id, C.family, C.params, C.generation, E.stage, E.status, E.speedup, E.failure_kind)
                .join(C, C.id == E.candidate_id)
                .where(C.workload_id + 0 == workload_id, cond)
                .order_by(E.id)
            ).all()

        with self.db.read() as s:
            found = rows(s, E.id > after)
            if ids:   # apart: an OR of the two turns the range into a scan
                found = sorted(found + rows(s, E.id.in_(list(ids)) & (E.id <= after)), key=lambda r: r[0])
            return [(eid, cid, family, dict(params or {}), generation or 0, str(stage), str(status),
                     None if speedup is None else float(speedup), None if kind is None else str(kind))
                    for eid, cid, family, params, generation, stage, status, speedup, kind in found]

    def failed_points(self, workload_id: int, kinds: Sequence[FailureKind]) -> list[tuple[int, str, dict[str, Any], str]]:
        """Family candidates with a failed evaluation of one of `kinds`, as (id, family,
        params, first such kind), in id order: what a search learns to avoid."""
        C, E = CandidateModel, EvaluationModel
        query = (
            select(C.id, C.family, C.params, E.failure_kind)
            .join(E, E.candidate_id == C.id)
            .where(C.workload_id == workload_id, C.family.is_not(None), E.status == EvaluationStatus.FAILED,
                   E.failure_kind.in_(tuple(kinds)))
            .order_by(C.id, E.id)
        )
        out: dict[int, tuple[int, str, dict[str, Any], str]] = {}
        with self.db.read() as s:
            for cid, family, params, kind in s.execute(query):
                out.setdefault(cid, (cid, family, dict(params or {}), kind))
        return list(out.values())

    def family_points(self, workload_id: int) -> list[tuple[str, dict[str, Any]]]:
        """(family, params) of every family candidate of the workload, in id order."""
        C = CandidateModel
        query = select(C.family, C.params).where(C.workload_id == workload_id, C.family.is_not(None)).order_by(C.id)
        with self.db.read() as s:
            return [(family, dict(params or {})) for family, params in s.execute(query)]

    def bench_speedup(self, candidate_id: int) -> float | None:
        """The candidate's speedup as `correct` sees it: its latest finished bench, if that
        passed (one indexed lookup instead of scanning the whole population)."""
        with self.db.read() as s:
            row = s.execute(
                select(EvaluationModel.status, EvaluationModel.speedup)
                .where(
                    EvaluationModel.candidate_id == candidate_id,
                    EvaluationModel.stage == Stage.BENCH,
                    EvaluationModel.status.in_(VERDICTS),
                )
                .order_by(EvaluationModel.id.desc())
                .limit(1)
            ).first()
        if row is None or row.status != EvaluationStatus.PASSED or row.speedup is None:
            return None
        return float(row.speedup)

    # --------------------------------------------------------------- promotions
    def best(self, workload_id: int) -> Promotion | None:
        """The confirmed global best: the workload's latest promotion."""
        with self.db.read() as s:
            row = s.scalar(
                select(PromotionModel)
                .where(PromotionModel.workload_id == workload_id)
                .order_by(PromotionModel.id.desc())
                .limit(1)
            )
            return None if row is None else promotion_snapshot(row)

    def promote(
        self,
        candidate_id: int,
        previous_best_id: int | None,
        confirmation_eval_ids: Sequence[int],
        margin: float | None,
        speedup_over_best: float | None,
    ) -> Promotion | None:
        """Make `candidate_id` the workload's best. Compare-and-set on the best: returns None
        (and changes nothing) if the current best is no longer `previous_best_id`."""
        with self.db.write() as s:
            cand = s.get(CandidateModel, candidate_id)
            if cand is None:
                raise KeyError(f"no candidate with id {candidate_id}")
            # One promotion per workload at a time, on any host: the best read below is
            # then still the best when the new one is written (PostgreSQL; SQLite's
            # write lock already orders them).
            s.execute(select(WorkloadModel.id).where(WorkloadModel.id == cand.workload_id)
                      .with_for_update(key_share=True))
            ids = list(confirmation_eval_ids)
            found = {
                e.id: e for e in s.scalars(select(EvaluationModel).where(EvaluationModel.id.in_(ids)))
            }
            missing = [i for i in ids if i not in found]
            if missing:
                raise KeyError(f"confirmation evaluations not in the database: {missing}")
            current = s.scalar(
                select(PromotionModel.candidate_id)
                .where(PromotionModel.workload_id == cand.workload_id)
                .order_by(PromotionModel.id.desc())
                .limit(1)
            )
            if current != previous_best_id:
                return None
            row = PromotionModel(
                workload_id=cand.workload_id,
                candidate_id=candidate_id,
                previous_best_id=previous_best_id,
                margin=margin,
                speedup_over_best=speedup_over_best,
                promoted_at=utcnow(),
            )
            row.confirmation_links = [
                PromotionConfirmationModel(position=i, evaluation_id=e) for i, e in enumerate(ids)
            ]
            s.add(row)
            s.flush()
            return promotion_snapshot(row)

    def promotions(self, workload_id: int | None = None) -> list[Promotion]:
        query = select(PromotionModel).order_by(PromotionModel.id)
        if workload_id is not None:
            query = query.where(PromotionModel.workload_id == workload_id)
        with self.db.read() as s:
            return [promotion_snapshot(r) for r in s.scalars(query)]

    # -------------------------------------------------------------- leaderboard
    def leaderboard(self, workload_id: int | None = None, limit: int | None = 20) -> list[LeaderboardRow]:
        """Candidates ranked by their best passed bench speedup (ties: older first)."""
        with self.db.read() as s:
            return leaderboard_rows(s, workload_id=workload_id, limit=limit)

