"""Issue 15, item 1: an edited candidate is a new candidate, never a stale result."""
from __future__ import annotations

import json
import shutil

from evolve.commands.register import register_candidate
from evolve.families import load_family
from evolve.render import render_candidate
from tests.evolve.search.conftest import NUMPY_FAMILY
from tests.evolve.search.helpers import WORKLOAD, population, run_cli, write_config

FAST = dict(algorithm="chunked", chunk=16, batching="per_chunk", decay_form="factored", contract="matmul", solve="linalg", dtype="float32")


def test_a_rendered_candidate_registered_as_is_is_the_same_candidate(tmp_path):
    pop = population(f"sqlite:///{tmp_path / 'evolve.db'}")
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    rendered = render_candidate(load_family(NUMPY_FAMILY), FAST, tmp_path / "gen")
    from evolve.population import NewCandidate
    first, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", digest=rendered.name,
                                              directory=str(rendered), family="numpy_chunked", params=FAST))
    cid, created = register_candidate(pop, rendered, workload="forward_cpu_small")
    assert (cid, created) == (first.id, False)


def test_registering_an_edited_folder_makes_a_child_of_the_old_candidate(tmp_path):
    pop = population(f"sqlite:///{tmp_path / 'evolve.db'}")
    d = tmp_path / "mine"
    d.mkdir()
    (d / "solution.py").write_text("def setup(data, B, T, H):\n    return lambda: None\n")
    old, created = register_candidate(pop, d, workload="forward_cpu_small", name="mine")
    assert created
    (d / "solution.py").write_text("def setup(data, B, T, H):\n    return lambda: 1\n")
    new, created = register_candidate(pop, d, workload="forward_cpu_small", name="mine")
    assert created and new != old
    child = pop.candidate(new)
    assert child.parents == [old] and child.operator == "edit"


def _registered_copy(tmp_path):
    """(db url, population, folder, candidate id): a rendered candidate copied to a folder
    of its own and registered from there."""
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    pop = population(db_url)
    d = tmp_path / "mine"
    shutil.copytree(render_candidate(load_family(NUMPY_FAMILY), FAST, tmp_path / "gen"), d)
    pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    cid, _ = register_candidate(pop, d, workload="forward_cpu_small")
    return db_url, pop, d, cid


def _mark_evaluated(pop, cid: int) -> None:
    from evolve.population import StageResult
    for stage in ("check", "gputest", "bench"):
        eid = pop.begin_stage(cid, stage)
        pop.finish_stage(eid, StageResult(status="passed", ms=1.0, baseline_ms=1.0, speedup=1.0, spread=0.1))


def test_evaluate_dir_after_an_edit_evaluates_what_is_there_now(tmp_path, cpu_server):
    db_url, pop, d, old = _registered_copy(tmp_path)
    _mark_evaluated(pop, old)
    # An edit that breaks the import: the old result must not be shown for it.
    (d / "solution.py").write_text("import no_such_module_anywhere\n")
    proc = run_cli("evaluate", str(d), "--remote", cpu_server.url, "--db", db_url, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    [new] = [c for c in pop.candidates() if c.id != old]
    assert new.parents == [old] and new.operator == "edit"
    assert f"candidate {new.id}" in proc.stderr
    check = pop.evaluations(new.id, "check")
    assert check and check[0].status == "failed"
    assert len(pop.evaluations(old)) == 3


def test_a_stage_refuses_sources_changed_since_registration(tmp_path, cpu_server):
    db_url, pop, d, cid = _registered_copy(tmp_path)
    (d / "solution.py").write_text("import no_such_module_anywhere\n")
    proc = run_cli("evaluate", str(cid), "--remote", cpu_server.url, "--db", db_url, "--json", cwd=tmp_path)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["candidate_id"] == cid and doc["stage"] == "check" and doc["failure_kind"] == "check"
    [check] = pop.evaluations(cid, "check")
    assert check.status == "failed" and check.failure_kind == "check"
    assert "changed since registration" in check.message and "evolve register" in check.message


def _rendered_then_removed(tmp_path, family_dir):
    """(db url, population, candidate id, folder): a rendered candidate in the population
    whose folder was then deleted, as on a host that resumes a run another host began."""
    db_url = f"sqlite:///{tmp_path / 'evolve.db'}"
    pop = population(db_url)
    wid = pop.ensure_workload("forward_cpu_small", str(WORKLOAD))
    rendered = render_candidate(load_family(family_dir), FAST, tmp_path / "gen")
    from evolve.population import NewCandidate
    cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", digest=rendered.name,
                                             directory=str(rendered), family="numpy_chunked", params=FAST))
    shutil.rmtree(rendered)
    return db_url, pop, cand.id, rendered


def _config_for(tmp_path, family_dir):
    cfg = write_config(tmp_path, gputest=False)   # the check alone runs the restored folder on the server
    text = cfg.read_text().replace('name = "numpy_chunked"', f'name = "numpy_chunked"\npath = "{family_dir}"')
    cfg.write_text(text.replace("[stages.bench]\n", "[stages.bench]\nenabled = false\n"))
    return cfg


def test_a_rendered_candidate_whose_folder_is_gone_is_rendered_again(tmp_path, cpu_server):
    db_url, pop, cid, folder = _rendered_then_removed(tmp_path, NUMPY_FAMILY)
    cfg = _config_for(tmp_path, NUMPY_FAMILY)
    proc = run_cli("evaluate", str(cid), "--config", str(cfg), "--remote", cpu_server.url, "--db", db_url,
                   "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert folder.is_dir()
    assert [e.status for e in pop.evaluations(cid, "check")] == ["passed"]


def test_a_gone_folder_is_not_restored_from_templates_edited_since(tmp_path, cpu_server, copy_family):
    family = copy_family(NUMPY_FAMILY)
    db_url, pop, cid, folder = _rendered_then_removed(tmp_path, family)
    template = family / "solution.py.j2"
    template.write_text(template.read_text() + "\n# edited after the candidate was rendered\n")
    proc = run_cli("evaluate", str(cid), "--config", str(_config_for(tmp_path, family)), "--remote",
                   cpu_server.url, "--db", db_url, "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    assert not folder.is_dir()
    [check] = pop.evaluations(cid, "check")
    assert check.status == "failed" and check.failure_kind == "check"
    assert "renders other sources" in check.message and "templates changed since" in check.message
