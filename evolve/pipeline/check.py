"""The check stage (local, CPU): the candidate is whole, its solution obeys the static
rules and imports, and its CUDA sources compile for the server's target with nvcc, with
registers, spills and shared memory recorded."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from evolve.families import ParamsError
from evolve.pipeline import nvcc
from evolve.pipeline.context import StageContext
from evolve.pipeline.static_rules import violations
from evolve.population import Candidate, StageResult
from evolve.render import PARAMS_FILE

ENTRY = "solution.py"
DEFAULT_ARCH = "sm_90a"
# Packages that exist only where the GPU is; a local import that lacks them is not a failure.
GPU_ONLY_MODULES = {"cupy", "cupyx", "torch", "triton", "cuda", "fla", "pycuda", "cutlass"}

_IMPORT_PROBE = r"""
import importlib.util, json, sys
path = sys.argv[1]
try:
    spec = importlib.util.spec_from_file_location("candidate_solution", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, sys.argv[2])
    spec.loader.exec_module(mod)
except ModuleNotFoundError as exc:
    print(json.dumps({"missing": exc.name, "error": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
except BaseException as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"})); sys.exit(0)
print(json.dumps({"setup": callable(getattr(mod, "setup", None))}))
"""


def _failed(kind: str, message: str, **metrics) -> StageResult:
    return StageResult(status="failed", failure_kind=kind, message=message[:4000], metrics=metrics)


def _import_probe(directory: Path, timeout: float) -> tuple[str | None, dict]:
    """None when solution.py imports and defines setup (or needs a GPU-only package)."""
    try:
        proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, str(directory / ENTRY), str(directory)],
                              capture_output=True, text=True, timeout=timeout, cwd=directory)
    except subprocess.TimeoutExpired:
        return f"importing {ENTRY} took longer than {timeout:.0f} s", {}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return f"import probe failed: {proc.stderr[-2000:]}", {}
    answer = json.loads(lines[-1])
    missing = answer.get("missing")
    if missing and missing.split(".")[0] in GPU_ONLY_MODULES:
        return None, {"import": f"skipped locally: needs {missing}"}
    if "error" in answer:
        return answer["error"], {}
    if not answer.get("setup"):
        return f"{ENTRY} defines no callable setup(data, B, T, H)", {}
    return None, {"import": "ok"}


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
    cfg = ctx.stages["check"]
    directory = ctx.candidate_dir(cand)
    if not (directory / ENTRY).is_file():
        return _failed("check", f"{directory} has no {ENTRY}")
    # Render: a template candidate's point must still be admitted by its family.
    family = ctx.families.get(cand.family or "")
    if family is not None and (directory / PARAMS_FILE).is_file():
        try:
            family.validate(json.loads((directory / PARAMS_FILE).read_text())["params"])
        except (ParamsError, KeyError, ValueError) as exc:
            return _failed("check", f"render: {exc}")
    source = (directory / ENTRY).read_text(encoding="utf-8", errors="replace")
    problems = violations(source, ENTRY)
    if problems:
        syntax = any("syntax error" in p for p in problems)
        return _failed("import" if syntax else "check", "; ".join(problems), rules=problems)
    error, metrics = _import_probe(directory, min(cfg.timeout, 120.0))
    if error:
        return _failed("import", error)

    sources, flags = _cuda_sources(ctx, cand, directory)
    missing = [s.name for s in sources if not s.is_file()]
    if missing:
        return _failed("check", f"CUDA sources missing: {missing}")
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
                return _failed("timeout", f"nvcc {src.name}: longer than {cfg.timeout:.0f} s")
            if not report.ok:
                return _failed("compile", f"nvcc {src.name} for {arch}:\n{report.log}")
            compiled[src.name] = {k: v.model_dump() for k, v in report.kernels.items()}
            if report.max_registers is not None:
                registers.append(report.max_registers)
            spills += report.total_spills or 0
        metrics.update(arch=arch, kernels=compiled)
        smem = [k["smem_bytes"] for ks in compiled.values() for k in ks.values()]
        metrics["smem_bytes"] = max(smem, default=0)
        return StageResult(status="passed", metrics=metrics,
                           registers=max(registers) if registers else None, spills=spills)
    return StageResult(status="passed", metrics=metrics)
