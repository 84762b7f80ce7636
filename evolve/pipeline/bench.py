"""The bench stage: the official benchmark (holdout, correctness, timing) of a candidate."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from evolve.pipeline.context import StageContext
from evolve.pipeline.crash import exception_line, last_traceback
from evolve.pipeline.errors import TransportTrouble, normalise_kind
from evolve.pipeline.screen import screened
from evolve.pipeline.timings import device_metric, jsonable, node_metric
from evolve.population import Candidate, StageLogs, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage

if TYPE_CHECKING:
    from kcoral.bench import BenchReport


def bench_result(rep: BenchReport, against: Path | None = None) -> StageResult:
    """A BenchReport as a stage result."""
    metrics = {
        "baseline_name": getattr(rep, "baseline_name", None),
        "holdout_pass": getattr(rep, "holdout_pass", None),
        "cases": jsonable(getattr(rep, "cases", None)),
        # How far the verdict can be trusted: which clock the figures came from, how the
        # candidate was isolated, and the bounds it was checked against.
        "clock": getattr(rep, "clock", None),
        "timing_flags": list(getattr(rep, "timing_flags", []) or []),
        "isolation": getattr(rep, "isolation", ""),
        "tolerance": getattr(rep, "tolerance", ""),
    }
    if against is not None:
        metrics["against"] = str(against)
    metrics["spreads"] = dict(getattr(rep, "spreads", {}) or {})
    metrics["request_id"] = getattr(rep, "request_id", "")
    metrics.update(device_metric(rep))
    metrics.update(node_metric(rep))
    gpu = getattr(rep, "gpu", None)
    fields = dict(ms=rep.kernel_ms, baseline_ms=rep.baseline_ms, speedup=rep.speedup, spread=rep.spread,
                  queue_ms=getattr(rep, "queue_ms", None), lease_held_ms=getattr(rep, "lease_held_ms", None),
                  server_instance=getattr(rep, "server_instance", None), gpu=None if gpu is None else str(gpu))
    judge_log = str(getattr(rep, "log", "") or "")
    crash = last_traceback(judge_log)
    logs = StageLogs(stderr=judge_log, traceback=crash or "")
    if rep.passed:
        return StageResult(status=EvaluationStatus.PASSED, metrics=metrics, logs=logs, **fields)
    kind = FailureKind(normalise_kind(getattr(rep, "failure_kind", None), "correctness"))
    message = str(getattr(rep, "message", None) or f"official benchmark failed ({kind})")
    if crash is not None and exception_line(crash) not in message:
        message = f"{exception_line(crash)}\n{message}"
    return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind, message=message[:4000], metrics=metrics,
                       logs=logs, **fields)


def run(ctx: StageContext, cand: Candidate, against: Path | None = None, screen: bool = False) -> StageResult:
    """The official benchmark; `screen`: the pipeline's bench, which a slow enough quick time
    skips (evolve/pipeline/screen.py). Confirmations and asked-for rebenches always run."""
    from kcoral.bench import run_bench  # the workload client; imported when a GPU stage runs

    cfg = ctx.stages[Stage.BENCH]
    if screen:
        skip = screened(ctx.pop, ctx.workload_id, cand.id, cfg.skip_slower_than)
        if skip is not None:
            return skip
    with ctx.gate.slot(ctx.cancel):
        rep = run_bench(ctx.client, ctx.workload_dir, ctx.candidate_dir(cand), timeout=cfg.timeout,
                        against=against)
    if not rep.passed and rep.failure_kind == FailureKind.TRANSPORT:
        # The server went away mid-call: wait for it and run again inside the same row.
        raise TransportTrouble(rep.message)
    return bench_result(rep, against)
