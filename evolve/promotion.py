"""Confirmation and promotion: a bench that beats the confirmed best is re-run before the
candidate may take its place.

A challenger gets `confirm_runs` fresh official runs with the current best timed in the
baseline slot of the same run (`run_bench(..., against=best_dir)`), so each run's
speedup is challenger-over-best measured side by side. It is promoted only if every run
passes, every run shows it faster, and the mean speedup over the best exceeds the largest
measured spread plus the configured margin. The first correct candidate of a workload
becomes the best after its confirmations against the workload's baseline.
"""
from __future__ import annotations

import logging
import statistics
import threading

from pydantic import BaseModel, Field

from evolve.config import PromotionConfig
from evolve.pipeline import bench as bench_stage
from evolve.pipeline.context import StageContext
from evolve.pipeline.runner import run_stage, running_copy
from evolve.population import Candidate, StageResult
from evolve.vocabulary import EvaluationStatus, Stage

log = logging.getLogger(__name__)


class Decision(BaseModel):
    candidate_id: int
    promoted: bool
    reason: str
    previous_best_id: int | None = None
    speedup_over_best: float | None = None
    spread: float | None = None
    confirmation_eval_ids: list[int] = Field(default_factory=list)


def relative_spread(result: StageResult) -> float:
    """The run's spread as a fraction of its kernel time (the bench reports it relative)."""
    return float(result.spread or 0.0)


def decide(runs: list[StageResult], has_best: bool, margin: float) -> tuple[bool, str, float | None, float | None]:
    """(promote?, why, mean speedup, largest spread) from the confirmation runs."""
    failed = [r for r in runs if r.status != EvaluationStatus.PASSED]
    if failed:
        return False, f"confirmation run failed: {failed[0].failure_kind}: {failed[0].message[:200]}", None, None
    speedups = [r.speedup for r in runs if r.speedup is not None]
    if len(speedups) != len(runs):
        return False, "a confirmation run reported no speedup", None, None
    mean = statistics.fmean(speedups)
    spread = max(relative_spread(r) for r in runs)
    if not has_best:
        return True, f"first correct candidate, confirmed {len(runs)}x at {mean:.3f}x over the baseline", mean, spread
    if min(speedups) <= 1.0:
        return False, f"not faster than the best in every run (speedups {[round(s, 4) for s in speedups]})", mean, spread
    if mean - 1.0 <= spread + margin:
        return False, (f"gain {mean - 1.0:.2%} does not exceed spread {spread:.2%} + margin {margin:.2%}"), mean, spread
    return True, f"{mean:.3f}x over the best (spread {spread:.2%}, margin {margin:.2%})", mean, spread


class Promoter:
    """Runs confirmations and records promotions; one at a time per process."""

    def __init__(self, ctx: StageContext, policy: PromotionConfig):
        self.ctx = ctx
        self.policy = policy
        self._lock = threading.Lock()

    def consider(self, cand: Candidate, bench: StageResult, retry_of: int | None = None) -> Decision | None:
        """Confirm `cand` if its bench beats the confirmed best; None when it does not."""
        if bench.status != EvaluationStatus.PASSED or bench.speedup is None or self.ctx.cancel.is_set():
            return None
        with self._lock:
            pop = self.ctx.pop
            best = pop.best(self.ctx.workload_id)
            best_cand: Candidate | None = None
            if best is not None:
                if best.candidate_id == cand.id:
                    return None
                best_speedup = self.ctx.pop.bench_speedup(best.candidate_id)
                if best_speedup is not None and bench.speedup <= best_speedup:
                    return None
                best_cand = pop.candidate(best.candidate_id)
                assert best_cand is not None

            def confirm_run(copy: Candidate) -> StageResult:
                if best_cand is None:
                    return bench_stage.run(self.ctx, copy, against=None)
                with running_copy(self.ctx, best_cand) as best_copy:  # the best's sources run too
                    return bench_stage.run(self.ctx, copy, against=self.ctx.candidate_dir(best_copy))

            runs: list[StageResult] = []
            eids: list[int] = []
            for i in range(self.policy.confirm_runs):
                # The first run carries the lineage of a confirmation a dead process left.
                eid, result = run_stage(self.ctx, Stage.CONFIRM, cand, retry_of=retry_of if i == 0 else None,
                                        fn=confirm_run)
                assert eid is not None and result is not None  # confirm is repeatable
                eids.append(eid)
                runs.append(result)
                if result.status != EvaluationStatus.PASSED:
                    break
                if best is not None and (result.speedup or 0.0) <= 1.0:
                    break  # already lost to the best side by side: more runs cannot promote it
            ok, why, mean, spread = decide(runs, best is not None, self.policy.margin)
            decision = Decision(candidate_id=cand.id, promoted=False, reason=why,
                                previous_best_id=best.candidate_id if best else None,
                                speedup_over_best=mean if best else None, spread=spread,
                                confirmation_eval_ids=eids)
            if ok:
                promo = pop.promote(cand.id, decision.previous_best_id, eids,
                                    self.policy.margin if best else None, decision.speedup_over_best)
                if promo is None:
                    decision.reason = "the best changed while confirming (another process promoted)"
                else:
                    decision.promoted = True
            log.info("candidate %s %s: %s", cand.id, "promoted" if decision.promoted else "not promoted",
                     decision.reason)
            return decision
