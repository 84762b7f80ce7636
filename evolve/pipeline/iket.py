"""The iket stage (optional): an in-kernel event trace of the candidate; records a
per-warp, per-stage summary of the timeline."""
from __future__ import annotations

import json

from kcoral.remote import SendSpec, run_iket

from evolve.pipeline.context import StageContext
from evolve.pipeline.crash import exception_line, last_traceback
from evolve.pipeline.timings import node_metric, outcome_fields
from evolve.population import Candidate, StageLogs, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage


def summarise(trace: bytes) -> dict:
    """Per (warp, stage name): count and mean duration (µs) from a Chrome trace."""
    doc = json.loads(trace)
    events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
    sums: dict[str, list[float]] = {}
    span = [float("inf"), float("-inf")]
    for ev in events:
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        key = f"w{ev.get('tid')}:{ev.get('name')}"
        sums.setdefault(key, []).append(float(ev.get("dur", 0)))
        span[0] = min(span[0], float(ev.get("ts", 0)))
        span[1] = max(span[1], float(ev.get("ts", 0)) + float(ev.get("dur", 0)))
    stages = {k: {"count": len(v), "mean_us": sum(v) / len(v)} for k, v in sorted(sums.items())}
    return {"stages": stages, "span_us": (span[1] - span[0]) if sums else None}


def run(ctx: StageContext, cand: Candidate) -> StageResult:
    cfg = ctx.stages[Stage.IKET]
    directory = ctx.candidate_dir(cand)
    if cfg.app and cfg.app[-1].endswith(".py") and not (directory / cfg.app[-1]).is_file():
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=FailureKind.CHECK,
                           message=f"iket stage: the candidate has no {cfg.app[-1]}")
    with ctx.gate.slot(ctx.cancel):
        res = run_iket(ctx.client, sends=[SendSpec(directory)], app=list(cfg.app), env={}, timeout=cfg.timeout)
    timing = outcome_fields(res.outcome)
    crash = last_traceback(res.stderr or "")
    logs = StageLogs(stdout=getattr(res, "stdout", "") or "", stderr=res.stderr or "", traceback=crash or "")
    if res.exit_code != 0 or not res.traces:
        why = "; ".join(f"{k}: {v}" for k, v in res.errors.items()) or res.stderr[-2000:] or "no trace returned"
        kind = FailureKind.TIMEOUT if res.timed_out else FailureKind.RUNTIME
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind,
                           message=(f"{exception_line(crash)}\n" if crash else "") + f"iket exit {res.exit_code}: {why}"[:4000],
                           logs=logs, **timing)
    summary = {name: summarise(data) for name, data in res.traces.items()}
    return StageResult(status=EvaluationStatus.PASSED, metrics={"traces": summary, **node_metric(res.outcome)},
                       logs=logs, **timing)
