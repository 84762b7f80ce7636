"""The gputest stage: the workload's small correctness cases across regimes."""
from __future__ import annotations

from evolve.pipeline.context import StageContext
from evolve.pipeline.crash import exception_line, last_traceback
from evolve.pipeline.errors import TRANSIENT_KINDS, TransportTrouble, normalise_kind
from evolve.pipeline.timings import jsonable, node_metric, outcome_fields
from evolve.population import Candidate, StageLogs, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage


def run(ctx: StageContext, cand: Candidate) -> StageResult:
    from kcoral.bench import run_gputest  # the workload client; imported when a GPU stage runs

    cfg = ctx.stages[Stage.GPUTEST]
    with ctx.gate.slot(ctx.cancel):
        rep = run_gputest(ctx.client, ctx.workload_dir, ctx.candidate_dir(cand), cases=cfg.cases,
                          timeout=cfg.timeout, quick_calls=cfg.quick_calls)
    if not rep.passed and not rep.regimes and rep.message.split(":")[0] in TRANSIENT_KINDS:
        raise TransportTrouble(rep.message)
    regimes = jsonable(getattr(rep, "regimes", {}) or {})
    timing = outcome_fields(getattr(rep, "outcome", None))
    where = node_metric(getattr(rep, "outcome", None))
    crash = last_traceback(rep.stderr or "")
    logs = StageLogs(stdout=rep.stdout or "", stderr=rep.stderr or "", traceback=crash or "")
    if rep.passed:
        quick = ({"quick_ms": rep.quick_ms} if rep.quick_ms is not None
                 else {"quick_note": rep.message} if rep.message else {})   # e.g. the timing ran out of time
        return StageResult(status=EvaluationStatus.PASSED, metrics={"regimes": regimes, **quick, **where},
                           logs=logs, **timing)
    bad = {k: v for k, v in regimes.items() if v}
    if rep.timed_out or rep.message.startswith("timeout"):
        kind, message = FailureKind.TIMEOUT, rep.message or f"gputest ran past {cfg.timeout:.0f} s"
    elif not regimes:
        # Nothing judged: the test script or the candidate's import broke.
        kind = FailureKind(normalise_kind(rep.message.split(":")[0], "runtime")) if rep.message else FailureKind.RUNTIME
        message = f"{rep.message}\n{(rep.stderr or rep.stdout)[-3000:]}"
        if crash is not None:
            message = f"{exception_line(crash)}\n{message}"
    elif crash is not None:
        # The candidate raised: a crash, not a wrong answer; its exception leads the message.
        kind = FailureKind.RUNTIME
        message = f"{exception_line(crash)}\n(raised in {len(bad)} of {len(regimes)} regimes)\n{crash[-2500:]}"
    else:
        kind = FailureKind.CORRECTNESS
        message = f"bad regimes: {bad}" if bad else f"exit {rep.exit_code}: {rep.stderr[-2000:]}"
    return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind, message=message.strip()[:4000],
                       metrics={"regimes": regimes, "exit_code": rep.exit_code, **where}, logs=logs, **timing)
