"""The gputest stage: the workload's small correctness cases across regimes."""
from __future__ import annotations

from evolve.pipeline.context import StageContext
from evolve.pipeline.crash import exception_line, last_traceback
from evolve.pipeline.errors import TRANSIENT_KINDS, TransportTrouble, normalise_kind
from evolve.pipeline.timings import node_metric, outcome_fields
from evolve.population import Candidate, StageLogs, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage

# The candidate shares test_small.py's stdout (4 MiB of it): it can print any number of
# `regime=NAME bad=X` lines, so the row stores a bounded number of regimes, bad ones first.
MAX_REGIMES = 64
MAX_REGIME_CHARS = 80


def stored_regimes(regimes: dict[str, float]) -> tuple[dict[str, float], int]:
    """At most MAX_REGIMES regimes, the worst first (ties in their order), names cut to
    MAX_REGIME_CHARS (two cut alike keep the worse value); and how many were left out."""
    kept = sorted(regimes.items(), key=lambda kv: -kv[1])[:MAX_REGIMES]
    out: dict[str, float] = {}
    for name, frac in kept:
        short = name[:MAX_REGIME_CHARS]
        out[short] = max(frac, out.get(short, frac))
    return out, len(regimes) - len(kept)


def nonfinite_regimes(stdout: str) -> list[str]:
    """The regimes whose bad line is not a finite number (parse_bad_lines counts them as 1.0)."""
    from kcoral.bench.run import bad_line_values

    return sorted({name[:MAX_REGIME_CHARS] for name, frac in bad_line_values(stdout) if frac is None})


def run(ctx: StageContext, cand: Candidate) -> StageResult:
    from kcoral.bench import run_gputest  # the workload client; imported when a GPU stage runs

    cfg = ctx.stages[Stage.GPUTEST]
    with ctx.gate.slot(ctx.cancel):
        rep = run_gputest(ctx.client, ctx.workload_dir, ctx.candidate_dir(cand), cases=cfg.cases,
                          timeout=cfg.timeout, quick_calls=cfg.quick_calls)
    if not rep.passed and not rep.regimes and rep.message.split(":")[0] in TRANSIENT_KINDS:
        raise TransportTrouble(rep.message)
    # Non-finite is all bad here too: NaN would pass no check and break the row's json.
    all_regimes = {str(k): float(v) for k, v in (getattr(rep, "regimes", {}) or {}).items()}  # finite: parse_bad_lines
    regimes, left_out = stored_regimes(all_regimes)
    capped = {"regimes_left_out": left_out} if left_out else {}
    odd = nonfinite_regimes(rep.stdout or "")
    odd_note = (f"{len(odd)} regime(s) printed a bad fraction that is not a finite number, counted as 1.0 "
                f"(all bad): {', '.join(odd[:10])}{' ...' if len(odd) > 10 else ''}\n") if odd else ""
    timing = outcome_fields(getattr(rep, "outcome", None))
    where = node_metric(getattr(rep, "outcome", None))
    crash = last_traceback(rep.stderr or "")
    logs = StageLogs(stdout=rep.stdout or "", stderr=rep.stderr or "", traceback=crash or "")
    if rep.passed:
        quick = ({"quick_ms": rep.quick_ms} if rep.quick_ms is not None
                 else {"quick_note": rep.message} if rep.message else {})   # e.g. the timing ran out of time
        return StageResult(status=EvaluationStatus.PASSED, metrics={"regimes": regimes, **capped, **quick, **where},
                           logs=logs, **timing)
    bad = {k: v for k, v in regimes.items() if v}
    bad_count = sum(1 for v in all_regimes.values() if v)
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
        message = f"{exception_line(crash)}\n(raised in {bad_count} of {len(all_regimes)} regimes)\n{crash[-2500:]}"
    else:
        kind = FailureKind.CORRECTNESS
        more = f" (and {bad_count - len(bad)} more)" if bad_count > len(bad) else ""
        message = f"bad regimes: {bad}{more}" if bad else f"exit {rep.exit_code}: {rep.stderr[-2000:]}"
    return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind, message=(odd_note + message).strip()[:4000],
                       metrics={"regimes": regimes, **capped, "exit_code": rep.exit_code, **where}, logs=logs,
                       **timing)
