"""The stage pipeline: check -> gputest -> iket -> ncu -> bench (cheapest gate first)."""
from evolve.pipeline.context import GpuGate, RunStats, StageContext
from evolve.pipeline.runner import PipelineOutcome, attempt, run_pipeline, run_stage

__all__ = ["GpuGate", "PipelineOutcome", "RunStats", "StageContext", "attempt", "run_pipeline", "run_stage"]
