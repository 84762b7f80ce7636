"""`evolve run` on the CPU twin, end to end: the real CLI, an embedded server process,
a real SQLite file."""
from __future__ import annotations

from evolve.db import open_database
from evolve.population import Population
from tests.evolve.search.helpers import run_cli, write_config


def test_run_finds_a_candidate_better_than_its_seed(tmp_path):
    # A small float64 subspace around the seed (pairwise einsum with a row-loop solve,
    # 16-token chunks), where most points are well faster; proposals are seeded, so the
    # test is deterministic up to timing noise.
    # gputest is off here (the resume test covers it) to keep the suite short.
    cfg = write_config(tmp_path, max_evals=3, confirm_runs=1, gputest=False,
                       fixed='{ algorithm = "chunked", solve = "substitution", dtype = "float64" }',
                       subspace='{ chunk = [8, 16] }')
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = run_cli("run", str(cfg), "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "embedded server at http://127.0.0.1:" in proc.stderr
    assert "evaluated 3" in proc.stderr                   # progress lines (stderr is not a TTY)
    assert "benched 3" in proc.stderr                     # each bench told as it passes
    assert "rank" in proc.stdout and "numpy_chunked" in proc.stdout   # the leaderboard

    pop = Population(open_database(db_url))
    wid = pop.workload("forward_cpu_small").id
    cands = pop.candidates(wid)
    seed = next(c for c in cands if c.operator == "seed")
    assert seed.params["chunk"] == 16 and seed.params["contract"] == "einsum"
    seed_bench = [e for e in pop.evaluations(seed.id, "bench") if e.status == "passed"]
    assert seed_bench, "the seed must pass the official benchmark"
    # found: a candidate whose bench (speedup over the same baseline) clearly beats the seed's
    speedups = {c.id: e.speedup for c in cands for e in pop.evaluations(c.id, "bench") if e.status == "passed"}
    better = [cid for cid, s in speedups.items() if cid != seed.id and s > 1.3 * speedups[seed.id]]
    assert better, speedups
    best = pop.best(wid)
    assert best is not None                           # something was confirmed and promoted
    if best.candidate_id != seed.id:
        assert speedups[best.candidate_id] > speedups[seed.id]
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
