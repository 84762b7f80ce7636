"""The official KDA benchmark, client side: staging, program, report, `run_bench`, `run_gputest`."""
from .report import BenchReport, CaseResult, GputestReport, format_lines
from .run import parse_bad_lines, parse_quick_ms, run_bench, run_gputest, stage_gputest
from .staging import BenchInputError, load_workload, resolve_candidate

__all__ = [
    "BenchInputError", "BenchReport", "CaseResult", "GputestReport", "format_lines", "load_workload",
    "parse_bad_lines", "parse_quick_ms", "resolve_candidate", "run_bench", "run_gputest", "stage_gputest",
]
