"""`evolve evaluate` and `evolve run` argument handling through the real CLI."""
from __future__ import annotations

from evolve.families import load_family
from evolve.population import NewCandidate
from evolve.render import render_candidate
from tests.evolve.search.conftest import NUMPY_FAMILY
from tests.evolve.search.helpers import WORKLOAD, population, run_cli

FAST = dict(algorithm="chunked", chunk=16, batching="per_chunk", decay_form="factored", contract="matmul", solve="linalg", dtype="float32")


def test_evaluate_runs_the_pipeline_and_promotes_the_first_correct(tmp_path, cpu_server):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    pop = population(db_url)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    fam = load_family(NUMPY_FAMILY)
    d = render_candidate(fam, FAST, tmp_path / "scratch")
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="agent", digest=d.name, directory=str(d),
                                             name="agent-fast"))
    proc = run_cli("evaluate", str(cand.id), "--remote", cpu_server.url, "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout
    assert [e.stage for e in pop.evaluations(cand.id)] == ["check", "gputest", "bench", "confirm", "confirm"]
    assert all(e.status == "passed" and e.run_id is None for e in pop.evaluations(cand.id))
    assert "promoted: first correct candidate" in proc.stdout
    assert pop.best(wid).candidate_id == cand.id
    # by path, a second time: nothing is repeated
    again = run_cli("evaluate", str(d), "--remote", cpu_server.url, "--db", db_url, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert len(pop.evaluations(cand.id)) == 5


def test_evaluate_unknown_candidate_is_a_clear_error(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    proc = run_cli("evaluate", str(tmp_path / "nowhere"), "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 2
    assert "not in the population" in proc.stderr and "evolve register" in proc.stderr


def test_run_refuses_a_bad_config_with_reasons(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('workload = "kcoral/workloads/kda/forward_cpu_small"\nroot = "%s"\n'
                   '[[families]]\nname = "numpy_chunked"\nfixed = { chunk = 7 }\n'
                   '[strategy]\nkind = "annealing"\n' % WORKLOAD.parents[3])
    proc = run_cli("run", str(bad), "--db", f"sqlite:///{tmp_path / 'e.db'}", cwd=tmp_path)
    assert proc.returncode == 2
    assert "strategy.kind" in proc.stderr
    bad.write_text(bad.read_text().replace('kind = "annealing"', 'kind = "random"'))
    proc = run_cli("run", str(bad), "--db", f"sqlite:///{tmp_path / 'e.db'}", cwd=tmp_path)
    assert proc.returncode == 2 and "fixed chunk=7 is not one of" in proc.stderr
    assert "embedded server" not in proc.stderr
