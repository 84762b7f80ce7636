"""The loop's `SearchView`, brought up to date from the evaluations added since its last
read, hands out the state a full read gives (`search_state`), in the same order, through
the changes a population goes through: stages running then finishing, a bench passing
then failing on a re-run, failures of the point and of the server, and a first read of a
population that already holds results (a resumed run); and the columns it keeps beside
the order are the order's."""
from __future__ import annotations

import random

from evolve.families import load_family
from evolve.loop import search_state
from evolve.population import NewCandidate, Population, StageResult
from evolve.search_view import SearchView
from evolve.strategies.base import Columns
from tests.evolve.search.conftest import NUMPY_FAMILY


def _same(view: SearchView, pop: Population, wid: int) -> None:
    full = search_state(pop, wid, set(), 0)
    kept = view.state(set(), 0)
    assert [(p.id, p.speedup, p.params, p.generation) for p in kept.correct] == \
        [(p.id, p.speedup, p.params, p.generation) for p in full.correct]
    assert [(f.id, f.kind, f.params) for f in kept.failed] == [(f.id, f.kind, f.params) for f in full.failed]
    # The columns it keeps in step with the order are those of the list it hands out.
    built = Columns.of(kept.correct)
    assert all(a.tolist() == b.tolist() for a, b in zip(kept.columns(), built))


def test_the_view_kept_up_to_date_equals_a_full_read(pop):
    fam = load_family(NUMPY_FAMILY)
    wid = pop.ensure_workload("w", "w")
    points = list(fam.points())
    random.Random(3).shuffle(points)
    view = SearchView(pop, wid, lag=0, refresh=10_000)   # no look-back: what it learns, it learns by id
    rng = random.Random(4)
    cands = []
    running: list[tuple[int, str]] = []
    for i, point in enumerate(points[:40]):
        cand, _ = pop.add_candidate(NewCandidate(workload_id=wid, origin="template", family=fam.name,
                                                 params=point, digest=f"d{i}", directory=f"gen/d{i}"))
        cands.append(cand.id)
        stage = rng.choice(["check", "bench", "bench", "bench"])
        eid = pop.begin_stage(cand.id, stage)
        assert eid is not None
        running.append((eid, stage))
        if rng.random() < 0.6:   # finish some of the stages still running, oldest first or not
            eid, stage = running.pop(rng.randrange(len(running)))
            roll = rng.random()
            if roll < 0.6:
                result = StageResult(status="passed", speedup=0.5 + rng.random(), ms=1.0)
            elif roll < 0.8:
                result = StageResult(status="failed", failure_kind="correctness", message="wrong")
            else:   # a failure that says nothing about the point
                result = StageResult(status="failed", failure_kind="transport", message="gone")
            pop.finish_stage(eid, result)
        if i % 6 == 5:   # a bench run again after it failed: the candidate's verdict flips
            again = pop.begin_stage(rng.choice(cands), "bench")
            if again is not None:
                pop.finish_stage(again, StageResult(status="passed", speedup=1.7, ms=1.0))
        _same(view, pop, wid)
    for eid, _ in running:
        pop.finish_stage(eid, StageResult(status="failed", failure_kind="compile", message="late"))
    _same(view, pop, wid)
    _same(SearchView(pop, wid), pop, wid)   # a first read of a population with results: a resumed run
    assert view.state(set(), 0).correct and view.state(set(), 0).failed
