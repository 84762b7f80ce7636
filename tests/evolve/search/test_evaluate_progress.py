"""Issue 15, item 5: `evolve evaluate` says what it is doing, and can re-bench."""
from __future__ import annotations

import io

from evolve.families import load_family
from evolve.population import NewCandidate, StageResult
from evolve.render import render_candidate
from tests.evolve.search.conftest import NUMPY_FAMILY
from tests.evolve.search.helpers import WORKLOAD, population, run_cli

FAST = dict(algorithm="chunked", chunk=16, batching="per_chunk", decay_form="factored", contract="matmul", solve="linalg", dtype="float32")


def test_rebench_reruns_the_bench_of_an_evaluated_candidate_with_progress_lines(tmp_path, cpu_server):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    pop = population(db_url)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    d = render_candidate(load_family(NUMPY_FAMILY), FAST, tmp_path / "gen")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", digest=d.name, directory=str(d),
                                             family="numpy_chunked", params=FAST))
    for stage in ("check", "gputest", "bench", "confirm"):
        eid = pop.begin_stage(cand.id, stage)
        pop.finish_stage(eid, StageResult(status="passed", ms=1.0, baseline_ms=2.0, speedup=2.0, spread=0.1))
    pop.promote(cand.id, None, [eid], margin=0.02, speedup_over_best=None)
    proc = run_cli("evaluate", str(cand.id), "--rebench", "2", "--remote", cpu_server.url, "--db", db_url,
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    rebench = pop.evaluations(cand.id, "rebench")
    assert [e.status for e in rebench] == ["passed", "passed"] and all(e.speedup for e in rebench)
    assert pop.evaluations(cand.id, "bench")[0].speedup == 2.0        # the first bench is kept as it was
    # not a terminal: one plain line per stage start and end
    assert proc.stderr.count("rebench started") == 2 and proc.stderr.count("rebench passed") == 2
    assert "rebench: 2 runs" in proc.stdout


def test_rebench_refuses_a_candidate_without_a_passed_bench(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = run_cli("evaluate", "1", "--rebench", "0", "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 2 and "--rebench" in proc.stderr


def test_the_terminal_status_line_fits_the_width():
    from rich.console import Console

    from evolve.stage_progress import StageEvent, StagePhase, StageProgress

    out = io.StringIO()
    console = Console(file=out, width=40, force_terminal=True, color_system=None)
    view = StageProgress(console)
    view(StageEvent(candidate_id=123456, stage="gputest", phase=StagePhase.STARTED))
    line = view.status_text().plain
    assert len(line) <= 40 and line.startswith("candidate 123456")
