"""The gputest stage's quick time: with `quick_calls`, a candidate that passes is timed at
the scored shape and the stage records `quick_ms` (a real CPU server, the CPU twin)."""
from __future__ import annotations

import json
import subprocess
import sys

from kcoral import Client

from evolve.config import RunConfig
from evolve.families import load_family
from evolve.pipeline import GpuGate, StageContext, run_pipeline
from evolve.population import NewCandidate, StageResult
from evolve.render import render_candidate
from evolve.vocabulary import Stage
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
