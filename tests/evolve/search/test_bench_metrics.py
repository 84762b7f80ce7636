"""What the bench stage keeps of a report: the card it ran on (a speedup is a ratio to the
baseline on that card, so benches of two kinds of card do not compare)."""
from __future__ import annotations

from kcoral.bench import BenchReport

from evolve.pipeline.bench import bench_result


def test_the_bench_stage_keeps_the_card():
    rep = BenchReport(passed=True, device="NVIDIA H100 80GB HBM3", kernel_ms=1.0268, baseline_ms=3.2222,
                      speedup=3.138, spread=0.0017)
    res = bench_result(rep)
    assert res.metrics["device"] == "NVIDIA H100 80GB HBM3" and res.speedup == 3.138
    failed = bench_result(BenchReport(passed=False, failure_kind="holdout", message="wrong", device="cpu (x86_64)"))
    assert failed.metrics["device"] == "cpu (x86_64)"
    assert "device" not in bench_result(BenchReport(passed=False, failure_kind="transport", message="gone")).metrics
