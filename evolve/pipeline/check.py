"""The check stage: the candidate is whole, every file obeys the static rules, it imports
and defines `setup` (probed on the server: evolve never imports or runs candidate code),
and its CUDA sources compile for the server's target with nvcc, with registers, spills
and shared memory recorded. nvcc runs locally: it compiles the sources, it runs nothing
of the candidate's."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from evolve.families import ParamsError
from evolve.pipeline import nvcc
from evolve.pipeline.context import StageContext
from evolve.pipeline.import_probe import ENTRY, probe
from evolve.pipeline.static_rules import directory_violations
from evolve.population import Candidate, StageResult
from evolve.render import PARAMS_FILE
from evolve.vocabulary import EvaluationStatus, FailureKind, Stage

DEFAULT_ARCH = "sm_90a"


def _failed(kind: FailureKind, message: str, **metrics: Any) -> StageResult:
    return StageResult(status=EvaluationStatus.FAILED, failure_kind=kind, message=message[:4000], metrics=metrics)


def _cuda_sources(ctx: StageContext, cand: Candidate, directory: Path) -> tuple[list[Path], list[str]]:
    family = ctx.families.get(cand.family or "")
    if family is not None:
        return [directory / s for s in family.spec.cuda_sources], list(family.spec.nvcc_flags)
    return sorted(directory.glob("*.cu")), []


def _workload_device(ctx: StageContext) -> str:
    try:
        return str(json.loads((ctx.workload_dir / "workload.json").read_text()).get("device", "cuda"))
    except (OSError, ValueError):
        return "cuda"


def run(ctx: StageContext, cand: Candidate) -> StageResult:
    cfg = ctx.stages[Stage.CHECK]
    directory = ctx.candidate_dir(cand)
    if not (directory / ENTRY).is_file():
        return _failed(FailureKind.CHECK, f"{directory} has no {ENTRY}")
    # Render: a template candidate's point must still be admitted by its family.
    family = ctx.families.get(cand.family or "")
    if family is not None and (directory / PARAMS_FILE).is_file():
        try:
            family.validate(json.loads((directory / PARAMS_FILE).read_text())["params"])
        except (ParamsError, KeyError, ValueError) as exc:
            return _failed(FailureKind.CHECK, f"render: {exc}")
    problems = directory_violations(directory)
    if problems:
        syntax = any("syntax error" in p for p in problems)
        return _failed(FailureKind.IMPORT if syntax else FailureKind.CHECK, "; ".join(problems), rules=problems)
    imported = probe(ctx.client, directory, min(cfg.timeout, 120.0))
    if imported.error:
        return StageResult(status=EvaluationStatus.FAILED, failure_kind=FailureKind.IMPORT,
                           message=imported.error[:4000], **imported.timing)
    metrics, timing = imported.metrics, imported.timing

    sources, flags = _cuda_sources(ctx, cand, directory)
    missing = [s.name for s in sources if not s.is_file()]
    if missing:
        return _failed(FailureKind.CHECK, f"CUDA sources missing: {missing}")
    if sources and _workload_device(ctx) == "cpu":
        metrics["nvcc"] = "skipped: the workload runs on the CPU"
    elif sources and nvcc.nvcc_path() is None:
        metrics["nvcc"] = "skipped: nvcc not found"
    elif sources:
        arch = ctx.target().get("arch") or DEFAULT_ARCH
        compiled: dict[str, dict] = {}
        registers: list[int] = []
        spills = 0
        for src in sources:
            try:
                report = nvcc.compile_cuda(src, arch, flags, timeout=cfg.timeout)
            except subprocess.TimeoutExpired:
                return _failed(FailureKind.TIMEOUT, f"nvcc {src.name}: longer than {cfg.timeout:.0f} s")
            except nvcc.NvccRefused as exc:  # an include out of the folder
                return _failed(FailureKind.CHECK, f"nvcc {src.name}: not run: {exc}")
            except nvcc.NvccUnavailable as exc:  # no sandbox for nvcc here: not the candidate's failure
                return _failed(FailureKind.UNAVAILABLE, f"nvcc {src.name}: not run: {exc}")
            if not report.ok:
                return _failed(FailureKind.COMPILE, f"nvcc {src.name} for {arch}:\n{report.log}")
            compiled[src.name] = {k: v.model_dump() for k, v in report.kernels.items()}
            if report.max_registers is not None:
                registers.append(report.max_registers)
            spills += report.total_spills or 0
        metrics.update(arch=arch, kernels=compiled)
        smem = [k["smem_bytes"] for ks in compiled.values() for k in ks.values()]
        metrics["smem_bytes"] = max(smem, default=0)
        # every kernel's machine code together: SMs fetch instructions through a level they share
        metrics["code_bytes"] = sum(k["code_bytes"] for ks in compiled.values() for k in ks.values())
        return StageResult(status=EvaluationStatus.PASSED, metrics=metrics,
                           registers=max(registers) if registers else None, spills=spills, **timing)
    return StageResult(status=EvaluationStatus.PASSED, metrics=metrics, **timing)
