"""Run a candidate through the enabled stages, cheapest first; a failure ends it.

Each stage attempt is one evaluation row: claimed with `begin_stage`, closed with
`finish_stage`. Transport trouble (the server restarting, refusing connections, 503) is
retried inside the same row, so nothing is recorded twice; only when the server stays
away longer than `transport_wait_s` does the row fail with kind `transport`.
"""
from __future__ import annotations

import contextlib
import logging
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel
from sqlalchemy.exc import DataError
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from evolve.digest import PARAMS_FILE, snapshot
from evolve.pipeline import bench, check, gputest, iket, ncu
from evolve.pipeline.context import StageContext
from evolve.pipeline.errors import failure_kind, is_outcome_unknown, is_transport_error
from evolve.population import Candidate, StageLogs, StageResult
from evolve.render import params_record
from evolve.stage_progress import StageEvent, StagePhase
from evolve.vocabulary import LOCAL_STAGES, EvaluationStatus, FailureKind, Stage

log = logging.getLogger(__name__)

STAGE_FUNCTIONS: dict[Stage, Callable[[StageContext, Candidate], StageResult]] = {
    Stage.CHECK: check.run, Stage.GPUTEST: gputest.run, Stage.IKET: iket.run, Stage.NCU: ncu.run,
    Stage.BENCH: lambda ctx, cand: bench.run(ctx, cand, screen=ctx.screen_benches),
}
# Metrics key of a row whose outcome a router lost (the stage is retried once, see run_stage).
OUTCOME_UNKNOWN = "outcome_unknown"


class PipelineOutcome(BaseModel):
    candidate_id: int
    passed: bool
    stage: Stage | None = None         # the stage that failed, or that another process holds
    failure_kind: FailureKind | None = None
    message: str = ""
    skipped: bool = False              # another process holds a stage of this candidate
    bench: StageResult | None = None


def attempt(ctx: StageContext, fn: Callable[[], StageResult]) -> StageResult:
    """Run `fn`, waiting out transport trouble; any other error becomes a failed result."""
    def not_cancelled(exc: BaseException) -> bool:
        if ctx.cancel.is_set():
            return False
        if is_transport_error(exc):
            log.warning("server unreachable, retrying: %s", exc)
            return True
        return False

    retrying = Retrying(retry=retry_if_exception(not_cancelled), stop=stop_after_delay(ctx.transport_wait_s),
                        wait=wait_exponential(multiplier=0.5, max=5.0), reraise=True)
    try:
        result = retrying(fn)
    except Exception as exc:  # noqa: BLE001 - every failure is recorded with its kind
        kind = FailureKind.TRANSPORT if is_transport_error(exc) else FailureKind(failure_kind(exc))
        metrics = {OUTCOME_UNKNOWN: True} if is_outcome_unknown(exc) else {}
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind, message=f"{type(exc).__name__}: {exc}"[:4000],
                           metrics=metrics, logs=StageLogs(traceback="".join(traceback.format_exception(exc))))
    return result


def run_stage(ctx: StageContext, stage: Stage, cand: Candidate, retry_of: int | None = None,
              fn: Callable[[Candidate], StageResult] | None = None,
              claimed: int | None = None) -> tuple[int | None, StageResult | None]:
    """Claim, run and record one stage; (None, None) when the claim is refused.
    `fn` runs the stage on the candidate it is given (its folder a private snapshot);
    `claimed`: the stage's evaluation, already claimed (`Population.claim_next`)."""
    eid = claimed if claimed is not None else ctx.pop.begin_stage(
        cand.id, stage, run_id=ctx.run_id, retry_of=retry_of, worker_id=ctx.worker_id)
    if eid is None:
        return None, None
    _tell(ctx, StageEvent(candidate_id=cand.id, stage=stage, phase=StagePhase.STARTED))
    started = time.monotonic()
    work = fn or (lambda c: STAGE_FUNCTIONS[stage](ctx, c))

    def verified() -> StageResult:
        with running_copy(ctx, cand) as copy:
            return work(copy)

    result = attempt(ctx, verified)
    # A local stage records no server instance (check touches the server only for its import probe).
    if stage not in LOCAL_STAGES and result.server_instance is None:
        result = result.model_copy(update={"server_instance": ctx.server_instance()})
    result.metrics.setdefault("wall_s", round(time.monotonic() - started, 3))
    result = _record(ctx, eid, result)
    ctx.stats.add_lease(result.lease_held_ms)
    if stage == Stage.BENCH and result.status == EvaluationStatus.PASSED:
        ctx.stats.add_bench(result.ms, result.speedup)
    if result.metrics.get(OUTCOME_UNKNOWN) and retry_of is None and not ctx.cancel.is_set():
        # A router lost the node mid-stage: this row says so (failed, transport, outcome
        # unknown) and the stage runs once more as a new row that names it; a second loss
        # stands as the stage's result.
        log.warning("evaluation %s: outcome unknown (node lost); retrying the stage once", eid)
        _tell(ctx, StageEvent(candidate_id=cand.id, stage=stage, phase=StagePhase.FINISHED, status=result.status,
                              failure_kind=result.failure_kind, seconds=time.monotonic() - started,
                              message="outcome unknown (node lost): retried"))
        return run_stage(ctx, stage, cand, retry_of=eid, fn=fn)
    first_line = next((ln.strip() for ln in result.message.splitlines() if ln.strip()), "")
    _tell(ctx, StageEvent(candidate_id=cand.id, stage=stage, phase=StagePhase.FINISHED, status=result.status,
                          failure_kind=result.failure_kind, seconds=time.monotonic() - started,
                          message=first_line[:300] if result.status == EvaluationStatus.FAILED else ""))
    return eid, result


def _record(ctx: StageContext, eid: int, result: StageResult) -> StageResult:
    """Close the row with the result. One whose values the database refuses is closed as a
    failure that says so: a row left `running` would have every `--resume` run the stage
    again. Any other database error (locked, connection lost) propagates: the row stays
    `running` for a resume to run again, as for a process that died."""
    try:
        closed = ctx.pop.finish_stage(eid, result)
    except DataError as exc:
        log.exception("evaluation %s: the result could not be recorded", eid)
        result = StageResult(status=EvaluationStatus.FAILED, failure_kind=FailureKind.RUNTIME,
                             message=f"the stage's result could not be recorded: {type(exc).__name__}: {exc}"[:4000])
        closed = ctx.pop.finish_stage(eid, result)
    if not closed:
        log.warning("evaluation %s was closed by someone else; result dropped", eid)
    return result


@contextlib.contextmanager
def running_copy(ctx: StageContext, cand: Candidate) -> Iterator[Candidate]:
    """The candidate with its folder replaced by a private copy of the sources it was
    registered with (digest.snapshot), removed afterwards: what a stage sends to the
    server is what the leaderboard credits, whatever happens to the folder meanwhile."""
    with tempfile.TemporaryDirectory(prefix="evolve-stage-") as tmp:
        copy = snapshot(ctx.restored_dir(cand), cand.digest, Path(tmp), candidate_id=cand.id)
        if cand.family and cand.params:  # the rendering record, from the database rather than the folder
            (copy / PARAMS_FILE).write_text(params_record(cand.family, cand.params), encoding="utf-8")
        yield cand.model_copy(update={"directory": str(copy)})


def _tell(ctx: StageContext, event: StageEvent) -> None:
    if ctx.listener is not None:
        try:
            ctx.listener(event)
        except Exception:  # a display problem must never fail a stage
            log.exception("stage listener failed")


def run_pipeline(ctx: StageContext, cand: Candidate, stages: list[Stage],
                 retry_of: dict[Stage, int] | None = None, claimed: dict[Stage, int] | None = None) -> PipelineOutcome:
    """`claimed`: stages whose evaluation the caller claimed already (stage -> id)."""
    retry_of = retry_of or {}
    claimed = claimed or {}
    bench_result: StageResult | None = None
    for stage in stages:
        if ctx.cancel.is_set():
            return PipelineOutcome(candidate_id=cand.id, passed=False, stage=stage, skipped=True,
                                   message="cancelled")
        eid, result = run_stage(ctx, stage, cand, retry_of.get(stage), claimed=claimed.get(stage))
        if eid is None:
            done = [e for e in ctx.pop.evaluations(cand.id, stage) if e.status == EvaluationStatus.PASSED]
            if not done:
                return PipelineOutcome(candidate_id=cand.id, passed=False, stage=stage, skipped=True,
                                       message=f"stage {stage} is running elsewhere")
            if stage == Stage.BENCH:  # passed earlier (e.g. before a restart): reuse it
                last = done[-1]
                bench_result = StageResult(status=EvaluationStatus.PASSED, ms=last.ms, baseline_ms=last.baseline_ms,
                                           speedup=last.speedup, spread=last.spread, metrics=last.metrics)
            continue
        assert result is not None
        if result.status == EvaluationStatus.FAILED:
            return PipelineOutcome(candidate_id=cand.id, passed=False, stage=stage,
                                   failure_kind=result.failure_kind, message=result.message)
        if stage == Stage.BENCH:
            bench_result = result
    return PipelineOutcome(candidate_id=cand.id, passed=True, bench=bench_result)
