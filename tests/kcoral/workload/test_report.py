"""The report model and its fixed lines, without a server."""
from __future__ import annotations

from kcoral.bench import BenchReport, format_lines

RAW = {
    "workload": "forward_cpu_small", "candidate": "scratch/x", "passed": True, "failure_kind": None,
    "message": "", "holdout_pass": True, "holdout_source": "server", "holdout_detail": "",
    "baseline_name": "fla chunk_kda (fla-core 0.6.0, Triton)", "baseline_note": "", "method": "events",
    "device": "NVIDIA H200", "baseline_ms": 3.2101234, "kernel_ms": 1.5, "speedup": 2.14008226,
    "spread": {"baseline": 0.01, "kernel": 0.02}, "trials": [], "timing_flags": [], "baseline_check": None,
    "cases": [{"name": "holdout", "group": "holdout", "status": "PASS", "detail": "5 case(s)", "calls": []},
              {"name": "probe_T1", "group": "probe", "status": "PASS", "detail": "vs float64 recurrence"},
              {"name": "scored", "group": "scored", "status": "PASS", "detail": "5 call(s)"}],
    "elapsed_s": 12.0,
}


def test_lines_of_a_passing_report():
    rep = BenchReport.from_judge(RAW)
    assert rep.spread == 0.02 and rep.spreads == {"baseline": 0.01, "kernel": 0.02}
    assert format_lines(rep) == [
        "holdout correctness: PASS",
        "baseline_name: fla chunk_kda (fla-core 0.6.0, Triton)",
        "method: events",
        "baseline: 3.210123 ms",
        "kernel: 1.500000 ms",
        "speedup: 2.1401x",
        "spread: baseline=0.0100 kernel=0.0200",
        "correct: PASS probe_T1 vs float64 recurrence",
        "correct: PASS scored 5 call(s)",
        "result: PASS",
    ]


def test_lines_of_a_holdout_failure_have_no_timing():
    raw = dict(RAW, passed=False, failure_kind="holdout", holdout_pass=False,
               holdout_detail="case 2 of 5: output: 3 of 9 elements out of tolerance\nmore",
               message="holdout correctness: FAIL case 2 of 5: ...", baseline_name=None, method=None,
               baseline_ms=None, kernel_ms=None, speedup=None, spread=None,
               cases=[{"name": "holdout", "group": "holdout", "status": "FAIL", "detail": "x"}])
    lines = format_lines(BenchReport.from_judge(raw))
    assert lines[0] == "holdout correctness: FAIL case 2 of 5: output: 3 of 9 elements out of tolerance | more"
    assert not any(l.startswith(("baseline:", "kernel:", "speedup:")) for l in lines)
    assert lines[-1].startswith("result: FAIL holdout: ")


def test_flaky_case_line_and_transport_failure():
    raw = dict(RAW, passed=False, failure_kind="flaky", cases=RAW["cases"][:2] + [
        {"name": "scored", "group": "scored", "status": "FLAKY", "detail": "call 4 of 5: output: NaN"}])
    assert "correct: FLAKY scored call 4 of 5: output: NaN" in format_lines(BenchReport.from_judge(raw))
    rep = BenchReport.failure("transport", "transport: connection refused")
    assert format_lines(rep) == ["result: FAIL transport: transport: connection refused"]
    assert rep.model_validate_json(rep.model_dump_json()) == rep


def test_a_remeasured_trial_is_told_under_the_clock_line():
    raw = dict(RAW, clock="host call times, every batch within the judge's own clock (...)",
               timing_flags=["trial 1: re-measured once (kernel refused); the re-measure's host times stand"])
    lines = format_lines(BenchReport.from_judge(raw))
    at = lines.index("clock: host call times, every batch within the judge's own clock (...)")
    assert lines[at + 1] == "timing: trial 1: re-measured once (kernel refused); the re-measure's host times stand"
