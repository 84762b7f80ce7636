"""The gputest stage's quick time and the bench's screen: with `quick_calls`, a candidate that
passes gputest is timed at the scored shape (`quick_ms`); with `skip_slower_than`, a bench
whose candidate's quick time is that much slower than the best's official figure is skipped.
Real CPU server (the CPU twin) and real SQLite populations."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from kcoral import Client

from evolve.config import RunConfig
from evolve.families import load_family
from evolve.loop import search_state
from evolve.pipeline import GpuGate, StageContext, run_pipeline
from evolve.pipeline.screen import screened
from evolve.population import NewCandidate, StageResult
from evolve.render import render_candidate
from evolve.vocabulary import FailureKind, Stage
from tests.evolve.search.conftest import NUMPY_FAMILY, REPO
from tests.evolve.search.helpers import WORKLOAD

POINTS = {0: dict(algorithm="chunked", chunk=16, batching="per_chunk", decay_form="factored", contract="matmul",
                 solve="linalg", dtype="float32"),
          3: dict(algorithm="chunked", chunk=8, batching="per_chunk", decay_form="factored", contract="matmul",
                 solve="linalg", dtype="float32")}


def test_the_gputest_stage_records_a_quick_time_only_when_asked(tmp_path, pop, cpu_server):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    found = {}
    for calls, params in POINTS.items():   # two candidates: a stage that passed is not run again
        d = render_candidate(fam, params, tmp_path / "gen")
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="seed", family=fam.name, params=params,
                                                 digest=d.name, directory=str(d)))
        stages = RunConfig.model_fields["stages"].default_factory()
        stages[Stage.GPUTEST] = stages[Stage.GPUTEST].model_copy(update={"cases": "scored", "quick_calls": calls})
        with Client(cpu_server.url) as client:
            ctx = StageContext(client=client, pop=pop, workload_id=wid, workload_dir=WORKLOAD, run_id=None,
                               stages=stages, families={fam.name: fam}, gate=GpuGate(client, 1, 4),
                               transport_wait_s=60)
            out = run_pipeline(ctx, cand, ["gputest"])
        assert out.passed, out
        found[calls] = pop.evaluations(cand.id, Stage.GPUTEST)[-1].metrics
    assert "quick_ms" not in found[0]
    assert 0 < found[3]["quick_ms"] < 10_000, found[3]


def test_quick_vs_bench_sets_each_quick_time_beside_its_first_bench(tmp_path, pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    points = list(fam.points())[:4]
    rows = [(2.0, 1.0), (3.3, 3.0), (None, 5.0), (4.0, None)]   # (quick ms, bench ms): only the first two pair
    for i, (point, (quick, bench)) in enumerate(zip(points, rows)):
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name, params=point,
                                                 digest=f"q{i}", directory=f"gen/q{i}"))
        eid = pop.begin_stage(cand.id, Stage.GPUTEST)
        assert eid is not None
        pop.finish_stage(eid, StageResult(status="passed", metrics={"regimes": {}, **({"quick_ms": quick} if quick else {})}))
        eid = pop.begin_stage(cand.id, Stage.BENCH)
        assert eid is not None
        pop.finish_stage(eid, StageResult(status="passed", ms=bench, speedup=1.0) if bench else
                         StageResult(status="failed", failure_kind="correctness", message="wrong"))
        if bench:   # a confirmation, a second bench of the same code: not the one compared
            eid = pop.begin_stage(cand.id, Stage.CONFIRM)
            pop.finish_stage(eid, StageResult(status="passed", ms=bench * 10, speedup=0.1))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "quick_vs_bench.py"), str(pop.db.engine.url),
                           "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(r["quick_ms"], r["bench_ms"]) for r in report["rows"]] == [(2.0, 1.0), (3.3, 3.0)]
    assert report["summary"]["pairs"] == 2 and report["summary"]["ratio_max"] == 2.0
    table = subprocess.run([sys.executable, str(REPO / "benchmarks" / "quick_vs_bench.py"), str(pop.db.engine.url)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert table.returncode == 0 and "2 pairs" in table.stdout, table.stdout + table.stderr


def _candidate(pop, wid, fam, i: int, quick: float | None, bench_ms: float | None = None):
    point = list(fam.points())[i]
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name, params=point,
                                             digest=f"s{i}", directory=f"gen/s{i}"))
    eid = pop.begin_stage(cand.id, Stage.GPUTEST)
    pop.finish_stage(eid, StageResult(status="passed", metrics={"regimes": {}, **({"quick_ms": quick} if quick else {})}))
    if bench_ms is not None:
        eid = pop.begin_stage(cand.id, Stage.BENCH)
        pop.finish_stage(eid, StageResult(status="passed", ms=bench_ms, speedup=1.0))
        return cand, eid
    return cand, None


def test_the_screen_compares_a_quick_time_with_the_bests_official_figure(pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    # The best reports a quick time of 0.001 ms (faked, or just odd): it is never the measure.
    best, bench_eid = _candidate(pop, wid, fam, 0, quick=0.001, bench_ms=1.0)
    assert screened(pop, wid, best.id, 2.0) is None                    # no best yet: everything runs
    pop.promote(best.id, None, [bench_eid], margin=0.02, speedup_over_best=None)
    slow, _ = _candidate(pop, wid, fam, 1, quick=2.5)
    close, _ = _candidate(pop, wid, fam, 2, quick=1.9)
    untimed, _ = _candidate(pop, wid, fam, 3, quick=None)
    skip = screened(pop, wid, slow.id, 2.0)
    assert skip is not None and skip.failure_kind == FailureKind.SCREENED and skip.status == "failed"
    assert "2.50x the best's official 1 ms" in skip.message and skip.metrics["best_id"] == best.id
    assert screened(pop, wid, close.id, 2.0) is None                   # 1.9x: within the threshold
    assert screened(pop, wid, untimed.id, 2.0) is None                 # no quick time: benched
    assert screened(pop, wid, slow.id, 0.0) is None                    # screening off
    assert screened(pop, wid, best.id, 2.0) is None                    # the best itself
    # The best's confirmations count towards its official figure (median of 1.0, 3.0, 3.0).
    for ms in (3.0, 3.0):
        eid = pop.begin_stage(best.id, Stage.CONFIRM)
        pop.finish_stage(eid, StageResult(status="passed", ms=ms, speedup=1.0))
    assert screened(pop, wid, slow.id, 2.0) is None                    # 2.5 < 2 x 3.0


def test_a_screened_point_is_never_a_parent_and_teaches_the_model_nothing(pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    best, bench_eid = _candidate(pop, wid, fam, 0, quick=1.0, bench_ms=1.0)
    pop.promote(best.id, None, [bench_eid], margin=0.02, speedup_over_best=None)
    slow, _ = _candidate(pop, wid, fam, 1, quick=9.0)
    eid = pop.begin_stage(slow.id, Stage.BENCH)
    pop.finish_stage(eid, screened(pop, wid, slow.id, 2.0))
    state = search_state(pop, wid, set(), 0)
    assert [p.id for p in state.correct] == [best.id]
    # One quick reading against the best of the moment: not evidence about its neighbours.
    assert state.failed == []


def test_a_pipeline_skips_the_bench_of_a_candidate_its_quick_time_rules_out(tmp_path, pop, cpu_server):
    """Real gputest with quick calls on the CPU server; the best's official figure is a row
    made small on purpose (0.01 ms), so any real quick time is over twice it."""
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    best, bench_eid = _candidate(pop, wid, fam, 0, quick=None, bench_ms=0.01)
    pop.promote(best.id, None, [bench_eid], margin=0.02, speedup_over_best=None)
    params = POINTS[3]
    d = render_candidate(fam, params, tmp_path / "gen")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name, params=params,
                                             digest=d.name, directory=str(d)))
    stages = RunConfig.model_fields["stages"].default_factory()
    stages[Stage.GPUTEST] = stages[Stage.GPUTEST].model_copy(update={"cases": "scored", "quick_calls": 2})
    stages[Stage.BENCH] = stages[Stage.BENCH].model_copy(update={"skip_slower_than": 2.0})
    with Client(cpu_server.url) as client:
        ctx = StageContext(client=client, pop=pop, workload_id=wid, workload_dir=WORKLOAD, run_id=None,
                           stages=stages, families={fam.name: fam}, gate=GpuGate(client, 1, 4), transport_wait_s=60,
                           screen_benches=True)   # as the search loop's pipelines
        out = run_pipeline(ctx, cand, ["gputest", "bench"])
        # A bench a person asks for (`evolve evaluate`: no screen_benches) runs whatever the quick time.
        other_params = POINTS[0]
        d2 = render_candidate(fam, other_params, tmp_path / "gen")
        asked, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", family=fam.name,
                                                  params=other_params, digest=d2.name, directory=str(d2)))
        ctx.screen_benches = False
        asked_out = run_pipeline(ctx, asked, ["gputest", "bench"])
    assert asked_out.passed and asked_out.bench is not None and asked_out.bench.ms, asked_out
    assert pop.evaluations(asked.id, Stage.GPUTEST)[-1].metrics["quick_ms"] > 2 * 0.01
    assert not out.passed and out.stage == "bench" and out.failure_kind == FailureKind.SCREENED, out
    bench = pop.evaluations(cand.id, Stage.BENCH)[-1]
    assert bench.status == "failed" and bench.failure_kind == "screened" and bench.ms is None
    quick = pop.evaluations(cand.id, Stage.GPUTEST)[-1].metrics["quick_ms"]
    assert bench.metrics["quick_ms"] == quick and bench.metrics["best_ms"] == 0.01
    assert "bench skipped: quick time" in bench.message


def test_a_screen_without_its_reading_or_below_one_is_refused():
    base = {"workload": "forward_cpu_small", "families": [{"name": "numpy_chunked"}]}
    for stages, why in (({"bench": {"skip_slower_than": 0.8}}, "faster than the best"),
                        ({"bench": {"skip_slower_than": 1.5}}, "quick_calls > 0"),
                        ({"bench": {"skip_slower_than": 1.5}, "gputest": {"enabled": False, "quick_calls": 5}},
                         "quick_calls > 0")):
        with pytest.raises(ValidationError, match=why):
            RunConfig.model_validate({**base, "stages": stages})
    ok = RunConfig.model_validate({**base, "stages": {"bench": {"skip_slower_than": 1.5},
                                                      "gputest": {"quick_calls": 5}}})
    assert ok.stages[Stage.BENCH].skip_slower_than == 1.5
