"""The ncu stage (optional): Nsight Compute around the candidate's capture app; records
duration, excessive and total global sectors of the family's kernels."""
from __future__ import annotations

from kcoral.remote import SendSpec, run_ncu

from evolve.pipeline.context import StageContext
from evolve.pipeline.crash import exception_line, last_traceback
from evolve.pipeline.timings import node_metric, outcome_fields
from evolve.population import Candidate, StageLogs, StageResult
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage


def run(ctx: StageContext, cand: Candidate) -> StageResult:
    cfg = ctx.stages[Stage.NCU]
    directory = ctx.candidate_dir(cand)
    if cfg.app and cfg.app[-1].endswith(".py") and not (directory / cfg.app[-1]).is_file():
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=FailureKind.CHECK,
                           message=f"ncu stage: the candidate has no {cfg.app[-1]}")
    args = list(cfg.ncu_args)
    family = ctx.families.get(cand.family or "")
    if family is not None and family.spec.kernels and "--kernel-name" not in args and "-k" not in args:
        args += ["--kernel-name", "regex:" + "|".join(family.spec.kernels)]
    with ctx.gate.slot(ctx.cancel):
        res = run_ncu(ctx.client, sends=[SendSpec(directory)], app=list(cfg.app), ncu_args=args, env={},
                      timeout=cfg.timeout)
    timing = outcome_fields(res.outcome)
    crash = last_traceback(res.stderr or "")
    logs = StageLogs(stdout=getattr(res, "stdout", "") or "", stderr=res.stderr or "", traceback=crash or "")
    kernels = [k.model_dump(exclude={"values", "units"}) for k in res.metrics.kernels]
    metrics = {"kernels": kernels, "exit_code": res.exit_code, **node_metric(res.outcome)}
    if res.exit_code != 0 or not kernels:
        why = res.metrics_error or res.stderr[-2000:] or "no kernel was profiled"
        kind = FailureKind.TIMEOUT if res.timed_out else FailureKind.RUNTIME
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind,
                           message=(f"{exception_line(crash)}\n" if crash else "") + f"ncu exit {res.exit_code}: {why}"[:4000],
                           logs=logs, metrics=metrics, **timing)
    excessive = sum(k.sectors_excessive or 0 for k in res.metrics.kernels)
    registers = max((k.registers or 0 for k in res.metrics.kernels), default=None)
    duration_ms = sum(k.duration_ns or 0 for k in res.metrics.kernels) / 1e6
    return StageResult(status=EvaluationStatus.PASSED, metrics=metrics, excessive_sectors=excessive,
                       registers=registers, ms=duration_ms or None, **timing)
