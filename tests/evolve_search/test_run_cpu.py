"""`evolve run` on the CPU twin, end to end: the real CLI, an embedded server process,
a real SQLite file."""
from __future__ import annotations

from evolve.db import open_database
from evolve.population import Population
from tests.evolve_search.helpers import run_cli, write_config


def test_run_finds_a_candidate_better_than_its_seed(tmp_path):
    # Chunked points only, so every proposal takes seconds, not minutes; the seed
    # (pairwise einsum with a row-loop solve in float64, 8-token chunks) is slow.
    cfg = write_config(tmp_path, max_evals=4, confirm_runs=1,
                       fixed='{ algorithm = "chunked" }', subspace='{ chunk = [8, 16, 32] }')
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = run_cli("run", str(cfg), "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "embedded server at http://127.0.0.1:" in proc.stderr
    assert "evaluated 4" in proc.stderr                   # progress lines (stderr is not a TTY)
    assert "rank" in proc.stdout and "numpy_chunked" in proc.stdout   # the leaderboard

    pop = Population(open_database(db_url))
    wid = pop.workload("forward_cpu_small").id
    cands = pop.candidates(wid)
    seed = next(c for c in cands if c.operator == "seed")
    assert seed.params["chunk"] == 8 and seed.params["contract"] == "einsum"
    seed_bench = [e for e in pop.evaluations(seed.id, "bench") if e.status == "passed"]
    assert seed_bench, "the seed must pass the official benchmark"
    best = pop.best(wid)
    assert best is not None and best.candidate_id != seed.id
    best_bench = [e for e in pop.evaluations(best.candidate_id, "bench") if e.status == "passed"][-1]
    assert best_bench.ms < seed_bench[-1].ms
    # every generated candidate is in the population with lineage, rendered outside the repo
    # (stored relative to the working directory, like `evolve register` does)
    assert all(c.directory.startswith("gen/") and (tmp_path / c.directory / "solution.py").is_file()
               for c in cands)
    children = [c for c in cands if c.operator in ("mutate", "crossover")]
    assert children and all(c.parents and c.generation >= 1 for c in children)
    run = pop.runs(wid)[-1]
    assert run.state == "finished"
    # each stage attempt is one row; check ran locally, the rest on the server
    for c in cands:
        stages = [e.stage for e in pop.evaluations(c.id)]
        assert stages[:1] == ["check"]
